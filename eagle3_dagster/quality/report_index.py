"""The quality report's index: every shard row as last collected, so one gate re-reads one shard.

Before, every gate rebuilt the report from every stored result (O(total results) per gate, so
quadratic in the shard count). Now the report keeps a compact JSON index beside it
(`<report_dir>/.index.html.index.json`): per shard its gate cells, other rejects and summary,
exactly the model's fields. A gate re-collects its own shard (report_model.collect_row), the
others come from the index, and the run-wide parts (snapshots, sources, LATEST age, the publish
attempt: each small) are read fresh. Data Docs links are checked for existence at every render
(pages are pruned by later gates), as the full collect does.

The index is a cache of what is stored, never the source of truth: a missing, unreadable or
foreign index (other data dir, gates, format) means a full rebuild, and every full rebuild
(`eagle3 report`, the snapshot's refresh) rewrites it. A shard changed behind the pipeline's back
(files deleted by hand) shows as it was until the next full rebuild.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..storage import as_data_path, parse_shard_key
from .report_model import ExpectationIssue, GateCell, ShardRow, existing_page

log = logging.getLogger(__name__)

INDEX_VERSION = 1


def index_path(report_path: Path) -> Path:
    return report_path.with_name(f".{report_path.name}.index.json")


def _cell_json(c: GateCell) -> dict[str, Any]:
    d = asdict(c)
    d.pop("docs_page")  # re-checked at every render
    return d


def _cell(d: dict[str, Any], work: Path) -> GateCell:
    d = dict(d)
    d["issues"] = [ExpectationIssue(**i) for i in d.get("issues", [])]
    return GateCell(**d, docs_page=existing_page(d.get("docs_page_stored"), work))


def row_json(row: ShardRow) -> dict[str, Any]:
    return {
        "shard": row.shard,
        "cells": {g: _cell_json(c) for g, c in row.cells.items()},
        "other_rejects": row.other_rejects,
    }


def row_from_json(d: dict[str, Any], work: Path) -> ShardRow:
    return ShardRow(
        str(d["shard"]),
        {g: _cell(c, work) for g, c in d["cells"].items()},
        {str(k): dict(v) for k, v in d.get("other_rejects", {}).items()},
    )


def identity(data_dir: str, gates: tuple[str, ...]) -> dict[str, Any]:
    return {"version": INDEX_VERSION, "data_dir": data_dir, "gates": list(gates)}


def load(
    report_path: Path, ident: dict[str, Any], work: Path
) -> tuple[dict[str, ShardRow], dict[str, dict[str, Any]]] | None:
    """(rows by shard key, summaries by shard key) from the index, or None: rebuild in full."""
    f = index_path(report_path)
    if not f.is_file():
        return None
    try:
        d = json.loads(f.read_text(encoding="utf-8"))
        if {k: d.get(k) for k in ident} != ident:
            log.info("quality report index %s is for other data or gates: rebuilding in full", f)
            return None
        rows = {str(r["shard"]): row_from_json(r, work) for r in d["rows"]}
        return rows, {str(k): v for k, v in d.get("summaries", {}).items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("quality report index %s unreadable (%s: %s): rebuilding in full", f, type(e).__name__, e)
        return None


def save(report_path: Path, ident: dict[str, Any], rows: list[ShardRow], summaries: dict[str, dict[str, Any]]) -> None:
    body = {**ident, "rows": [row_json(r) for r in rows], "summaries": summaries}
    as_data_path(index_path(report_path)).write_text(json.dumps(body, default=str, separators=(",", ":")))


def sort_key(shard: str) -> int:
    return parse_shard_key(shard)
