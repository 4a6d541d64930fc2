"""The quality report's index: every shard's rendered parts, so one gate re-reads one shard.

Before, every gate rebuilt the report from every stored result (O(total results) per gate, so
quadratic in the shard count). Now the report keeps a compact JSON index beside it
(`<report_dir>/.index.html.index.json`, JSON lines) with, per shard, its rendered fragments
(render.shard_fragments: gates-table row, failure details, charts, other rejects), what the
page-wide parts need from it (status, profile and per-source counts of each gate cell) and which
of its Data Docs pages existed when it was rendered, and its multi-turn summary (turns.json, if
any). An update re-collects and re-renders the
changed shard only; a shard whose linked Data Docs page has been pruned since is re-collected too,
so no link dangles. Which pages still exist is checked only when the GX context's prune stamp
(retention.PRUNE_STAMP, rewritten by every pruning that deletes a page) differs from the one the
index was written under: pruning happens at most once per Data Docs index refresh, so most updates
check nothing (before, every update stat'ed every linked page of every shard). The run-wide parts (snapshots, sources, LATEST age, publish attempt: each
small) are read fresh every time.

The index is a cache of what is stored, never the source of truth: a missing, unreadable or
foreign index (other data dir, work dir, report path, gates or format) means a full rebuild, and
every full rebuild (`eagle3 report`, the snapshot's refresh) rewrites it. A shard changed behind
the pipeline's back (files edited by hand) shows as it was until the next full rebuild.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..storage import parse_shard_key
from .model import GateCell, ShardRow, existing_page

log = logging.getLogger(__name__)

INDEX_VERSION = 3


def index_path(report_path: Path) -> Path:
    return report_path.with_name(f".{report_path.name}.index.json")


def identity(data_dir: str, work: Path, report_path: Path, gates: tuple[str, ...]) -> dict[str, Any]:
    return {
        "version": INDEX_VERSION,
        "data_dir": data_dir,
        "work_dir": str(work),
        "report": str(report_path),
        "gates": list(gates),
    }


@dataclass
class Entry:
    """One shard as last rendered."""

    row: ShardRow  # light cells: status, profile, by_source (all the page-wide parts read)
    fragments: dict[str, str]
    pages: list[str]  # Data Docs pages it links (they existed at render time)
    turns: dict[str, Any] | None = None  # generations/shard=NNNN/turns.json as read (None: no file)
    line: str | None = None  # its line in the index as loaded (written back as is: no re-encoding)

    def pages_still_exist(self, work: Path) -> bool:
        return all(existing_page(p, work) is not None for p in self.pages)


def entry(row: ShardRow, fragments: dict[str, str], turns: dict[str, Any] | None = None) -> Entry:
    pages = [str(c.docs_page_stored) for c in row.cells.values() if c.docs_page is not None]
    return Entry(row, fragments, pages, turns)


def _light(shard: str, gate: str, d: dict[str, Any]) -> GateCell:
    return GateCell(gate, shard, d["status"], profile=d.get("profile"), by_source=d.get("by_source") or {})


@dataclass
class Loaded:
    entries: dict[str, Entry]  # by shard key
    pages_pruned: str | None  # the prune stamp the linked pages were checked under
    stamped: bool  # False: an index without a stamp (check every page)

    def pages_checked_since(self, stamp: str | None) -> bool:
        """No pruning deleted a page since the linked pages were last known to exist."""
        return self.stamped and self.pages_pruned == stamp


def load(report_path: Path, ident: dict[str, Any]) -> Loaded | None:
    """Entries by shard key from the index (and its prune stamp), or None: rebuild in full.

    The index is JSON lines: the identity (with the shard count and prune stamp), then one line per
    shard."""
    f = index_path(report_path)
    if not f.is_file():
        return None
    try:
        head, *lines = f.read_text(encoding="utf-8").splitlines()
        d = json.loads(head)
        if {k: d.get(k) for k in ident} != ident or d.get("shards") != len(lines):
            log.info("quality report index %s is for other data, paths or gates: rebuilding in full", f)
            return None
        out = {}
        for line, e in zip(lines, json.loads("[" + ",".join(lines) + "]"), strict=True):  # one parse
            k = str(e["shard"])
            cells = {g: _light(k, g, c) for g, c in e["cells"].items()}
            turns = e.get("turns")
            out[k] = Entry(ShardRow(k, cells), dict(e["fragments"]), list(e["pages"]), turns, line)
        stamp = d.get("pages_pruned")
        return Loaded(out, stamp if isinstance(stamp, str) else None, "pages_pruned" in d)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("quality report index %s unreadable (%s: %s): rebuilding in full", f, type(e).__name__, e)
        return None


def _line(e: Entry) -> str:
    return json.dumps(
        {
            "shard": e.row.shard,
            "cells": {
                g: {"status": c.status, "profile": c.profile, "by_source": c.by_source} for g, c in e.row.cells.items()
            },
            "fragments": e.fragments,
            "pages": e.pages,
            **({"turns": e.turns} if e.turns is not None else {}),
        },
        separators=(",", ":"),
    )


def save(report_path: Path, ident: dict[str, Any], entries: list[Entry], pages_pruned: str | None) -> None:
    """Write the index; `pages_pruned`: the prune stamp read before the entries' pages were checked."""
    head = {**ident, "shards": len(entries), "pages_pruned": pages_pruned}
    lines = [json.dumps(head), *(e.line or _line(e) for e in entries)]
    _replace(index_path(report_path), "\n".join(lines) + "\n")


def _replace(f: Path, text: str) -> None:
    """Write whole (tmp + rename: a reader never sees half an index) without fsync: the index is a
    cache, and one lost or damaged by a crash is unreadable or foreign, so the next update rebuilds
    in full (the page itself is written durably, storage's atomic write)."""
    tmp = f.with_name(f"{f.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, f)
    finally:
        tmp.unlink(missing_ok=True)


def sort_key(shard: str) -> int:
    return parse_shard_key(shard)
