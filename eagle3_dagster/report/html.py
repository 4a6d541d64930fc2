"""An offline, self-contained HTML quality report: shards x gates, failures, quarantine, snapshots.

GX's Data Docs index loads its table scripts from public CDNs, so on an air-gapped machine it shows
no rows. This report needs nothing from the network: one HTML file, inline CSS, no scripts, no
fonts, no images. It is built only from what is stored (data/gates/<gate>/shard=NNNN.json, the
rejects / quarantine Parquet beside the tables, data/snapshots/*/manifest.json), so it does not
matter which shard run writes it last, and `eagle3 report` rebuilds the same page on demand.

    collect(data_dir, work_dir)   -> ReportModel   (model.py: reads storage)
    render(model, report_path)    -> str           (render.py: pure)
    write_report(...)             -> Path          (full rebuild: lock, collect, render, write)
    update_report(..., shards=)   -> Path          (after a gate: re-collect those shards only,
                                                    the others from the index, report_index.py)

Both writes go through eagle3_dagster.storage (tmp + fsync + rename), so a reader never sees half a
page; both hold a lock beside the report for the collect + render + write (~tens of ms for an
update), so the last writer always sees every stored result.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..quality.retention import prune_stamp
from ..quality.suites import GATES
from ..storage import PathLike, as_data_path, display_uri, parse_shard_key, shard_key
from . import index as report_index
from .model import (
    GATE_ASSET,
    REPORT_DIR,
    REPORT_FILE,
    ExpectationIssue,
    GateCell,
    LatestAge,
    ReportModel,
    ShardRow,
    SnapshotView,
    SourceView,
    assemble,
    collect,
    collect_cell,
    collect_row,
    collect_snapshots,
    collect_sources,
    collect_summary,
    default_report_path,
    latest_age,
    shard_ids,
)
from .render import link_href, render, shard_fragments
from .turns import collect_turns

__all__ = [
    "GATE_ASSET",
    "REPORT_DIR",
    "REPORT_FILE",
    "ExpectationIssue",
    "GateCell",
    "LatestAge",
    "ReportModel",
    "ShardRow",
    "SnapshotView",
    "SourceView",
    "assemble",
    "collect",
    "collect_cell",
    "collect_row",
    "collect_snapshots",
    "collect_sources",
    "default_report_path",
    "latest_age",
    "link_href",
    "render",
    "shard_ids",
    "update_report",
    "write_report",
]


def _paths(work_dir: PathLike, out: PathLike | None) -> tuple[Path, Path]:
    work = Path(os.fspath(work_dir)).expanduser().absolute()
    path = Path(os.fspath(out)).expanduser().absolute() if out is not None else default_report_path(work)
    path.parent.mkdir(parents=True, exist_ok=True)
    return work, path


@contextmanager
def _report_lock(path: Path) -> Iterator[None]:
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _prune_stamp(work: Path) -> str | None:
    """The GX context's prune stamp (retention.PRUNE_STAMP) under this work dir."""
    return prune_stamp(work / "gx" / "gx")


def _write(
    path: Path, model: ReportModel, ident: dict, known: dict[str, report_index.Entry], stamp: str | None
) -> None:
    """Render (reusing the fragments of `known` shards), write the page, then the index."""
    fragments = {k: e.fragments for k, e in known.items()}
    entries = []
    for row in model.shards:
        e = known.get(row.shard)
        if e is None:
            frags = shard_fragments(row, model.shard_summaries.get(row.shard), path, model.work_dir, model.gates)
            fragments[row.shard] = frags
            e = report_index.entry(row, frags, model.turns.get(row.shard))
        entries.append(e)
    as_data_path(path).write_text(render(model, path, fragments))
    report_index.save(path, ident, entries, stamp)


def write_report(
    data_dir: PathLike,
    work_dir: PathLike,
    *,
    out: PathLike | None = None,
    n_shards: int | None = None,
    profile: str | None = None,
    now: dt.datetime | None = None,
) -> Path:
    """Collect everything, render and write the report (default <work_dir>/reports/index.html).

    Also rewrites the report's index, so later `update_report` calls start from what is stored now.
    """
    work, path = _paths(work_dir, out)
    data = as_data_path(data_dir)
    with _report_lock(path):
        stamp = _prune_stamp(work)  # read before the pages are checked: a later pruning changes it
        model = collect(data, work, n_shards=n_shards, profile=profile, now=now)
        _write(path, model, report_index.identity(display_uri(str(data)), work, path, tuple(GATES)), {}, stamp)
    return path


def update_report(
    data_dir: PathLike,
    work_dir: PathLike,
    *,
    shards: Sequence[int],
    out: PathLike | None = None,
    n_shards: int | None = None,
    profile: str | None = None,
    now: dt.datetime | None = None,
) -> Path:
    """The report after `shards` changed: those shards re-read and re-rendered, the others reused.

    The page is the same as `write_report` would write for the same stored results (a test
    compares them); without a usable index this is a full rebuild. Linked Data Docs pages are
    re-checked only after a pruning deleted pages (report_index.py).
    """
    work, path = _paths(work_dir, out)
    data = as_data_path(data_dir)
    ident = report_index.identity(display_uri(str(data)), work, path, tuple(GATES))
    with _report_lock(path):
        stamp = _prune_stamp(work)  # read before the pages are checked: a later pruning changes it
        loaded = report_index.load(path, ident)
        if loaded is None:
            model = collect(data, work, n_shards=n_shards, profile=profile, now=now)
            _write(path, model, ident, {}, stamp)
            return path
        known = loaded.entries
        stale: set[int] = set()
        if not loaded.pages_checked_since(stamp):  # a pruning deleted pages: re-render shards linking one
            stale = {parse_shard_key(k) for k, e in known.items() if not e.pages_still_exist(work)}
        todo = set(shards) | stale | {k for k in range(n_shards or 0) if shard_key(k) not in known}
        rows = {k: e.row for k, e in known.items()}
        turns = {k: e.turns for k, e in known.items() if e.turns is not None}
        summaries: dict[str, dict] = {}
        for k in todo:
            key = shard_key(k)
            known.pop(key, None)
            turns.pop(key, None)
            rows[key] = collect_row(data, k, GATES, work)
            summary = collect_summary(data, k)
            if summary is not None:
                summaries[key] = summary
        turns.update(collect_turns(data, sorted(todo)))
        ordered = [rows[s] for s in sorted(rows, key=report_index.sort_key)]
        model = assemble(data, work, ordered, summaries, profile=profile, gates=GATES, now=now, turns=turns)
        _write(path, model, ident, known, stamp)
    return path
