"""An offline, self-contained HTML quality report: shards x gates, failures, quarantine, snapshots.

GX's Data Docs index loads its table scripts from public CDNs, so on an air-gapped machine it shows
no rows. This report needs nothing from the network: one HTML file, inline CSS, no scripts, no
fonts, no images. It is built only from what is stored (data/gates/<gate>/shard=NNNN.json, the
rejects / quarantine Parquet beside the tables, data/snapshots/*/manifest.json), so it does not
matter which shard run writes it last, and `eagle3 report` rebuilds the same page on demand.

    collect(data_dir, work_dir)   -> ReportModel   (model.py: reads storage)
    render(model, report_path)    -> str           (render.py: pure)
    write_report(...)             -> Path          (lock, collect, render, write)

The report is written once per run, by the `quality_report` asset after the gated steps (and by
`eagle3 report` on demand), never by a gate. The write goes through eagle3_dagster.storage (tmp + fsync
+ rename), so a reader never sees half a page, and holds a lock beside the report for the collect +
render + write, so the last writer always sees every stored result.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..storage import PathLike, as_data_path
from .model import (
    DEFAULT_MAX_AGE,
    GATE_ASSET,
    REPORT_DIR,
    REPORT_FILE,
    ExpectationIssue,
    GateCell,
    LatestAge,
    ReportModel,
    ReportView,
    ShardRow,
    SnapshotView,
    SourceView,
    assemble,
    collect,
    collect_cell,
    collect_row,
    collect_snapshots,
    collect_sources,
    default_report_path,
    latest_age,
    shard_ids,
)
from .render import link_href, render

__all__ = [
    "GATE_ASSET",
    "REPORT_DIR",
    "REPORT_FILE",
    "ExpectationIssue",
    "GateCell",
    "LatestAge",
    "ReportModel",
    "ReportView",
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


def _write(path: Path, model: ReportModel) -> None:
    """Render the page and write it whole (storage's atomic write: tmp + fsync + rename)."""
    as_data_path(path).write_text(render(model, path))


def write_report(
    data_dir: PathLike,
    work_dir: PathLike,
    *,
    out: PathLike | None = None,
    n_shards: int | None = None,
    profile: str | None = None,
    now: dt.datetime | None = None,
    max_age: dt.timedelta = DEFAULT_MAX_AGE,
) -> Path:
    """Collect everything, render and write the report (default <work_dir>/reports/index.html); `max_age`:
    how old LATEST may be (EAGLE3_SNAPSHOT_MAX_AGE)."""
    work, path = _paths(work_dir, out)
    data = as_data_path(data_dir)
    with _report_lock(path):
        view = ReportView(profile=profile, now=now, max_age=max_age)
        _write(path, collect(data, work, n_shards=n_shards, view=view))
    return path
