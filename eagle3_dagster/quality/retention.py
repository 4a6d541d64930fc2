"""Keep a GX file context from growing forever: only the newest N validation results per suite.

Every gate run stores one validation result (`uncommitted/validations/<suite>/<run_name>/<run_time>/
<batch>.json`) and, with Data Docs, one page (`uncommitted/data_docs/local_site/validations/<same
path>.html`). A nightly pipeline of 64 shards x 3 gates would add ~70k files a year, and GX's index
builder reads every stored result on each docs build, so each run would get slower too.

`prune_validations` deletes all but the newest `keep` runs of one suite, the stored result and its
page together, and then empty folders; `prune_all` does it for every suite of the context. The
caller holds the context's file lock (gx_context.context_lock), so concurrent shard runs never prune
under each other. Run folders are named by GX's run time (`20261202T135856.199965Z`, fixed width,
UTC), so a name sort is a time sort.

When pruning happens, and so what `keep_validations` (EAGLE3_GX_KEEP_VALIDATIONS) means: the gates only
store their results; the quality report prunes every suite to its newest `keep` runs right before it
builds the Data Docs, under the context lock (gx_docs.build_data_docs), so the Data Docs index never
links a deleted page. Between two reports the stored results grow by the gates run since (one per
gate and shard); right after a report, exactly the newest `keep` per suite are left, each with its page.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# GX 1.x file-context defaults (great_expectations.yml written by gx.get_context(mode="file")).
VALIDATIONS_BASE = "uncommitted/validations"
DOCS_VALIDATIONS_BASE = "uncommitted/data_docs/local_site/validations"
DOCS_INDEX = "uncommitted/data_docs/local_site/index.html"
DOCS_SUITES_BASE = "uncommitted/data_docs/local_site/expectations"


def validation_page(gx_root: Path, key: Sequence[str]) -> Path:
    """Where GX's Data Docs put the page of the validation result whose store key is `key`
    (ValidationResultIdentifier.to_tuple(): suite, run name, run time, batch): the result's own path
    under the site's validations folder (tests/quality/test_gx_reuse.py holds it to GX's build)."""
    *folders, batch = key
    return gx_root / DOCS_VALIDATIONS_BASE / Path(*folders) / f"{batch}.html"


@dataclass
class PruneStats:
    results_removed: int = 0  # validation result runs (folders) deleted
    pages_removed: int = 0  # Data Docs validation page runs (folders) deleted


def _run_dirs(suite_dir: Path) -> dict[tuple[str, str], Path]:
    """(run_time, run_name) -> the run folder, for <suite_dir>/<run_name>/<run_time>/."""
    out: dict[tuple[str, str], Path] = {}
    if not suite_dir.is_dir():
        return out
    for run_name in suite_dir.iterdir():
        if not run_name.is_dir():
            continue
        for run_time in run_name.iterdir():
            if run_time.is_dir():
                out[(run_time.name, run_name.name)] = run_time
    return out


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    parent = path.parent
    try:
        parent.rmdir()  # the run_name folder, once empty
    except OSError:
        pass


def prune_validations(gx_root: Path, suite: str, keep: int) -> PruneStats:
    """Delete all but the newest `keep` validation runs of `suite` (results and their Data Docs pages).

    `gx_root` is the context's `gx/` folder; keep < 0 keeps everything, 0 removes every run (the
    gate prunes to keep-1 before storing a new result). A page whose result is gone (or not among
    the kept) goes too, so pages never outlive their results.
    """
    stats = PruneStats()
    if keep < 0 or not suite or "/" in suite or suite in (".", ".."):
        return stats
    results = _run_dirs(gx_root / VALIDATIONS_BASE / suite)
    pages = _run_dirs(gx_root / DOCS_VALIDATIONS_BASE / suite)
    kept = set(sorted(results, reverse=True)[:keep]) if keep else set()
    for key, d in results.items():
        if key not in kept:
            _remove(d)
            stats.results_removed += 1
    for key, d in pages.items():
        if key not in kept:
            _remove(d)
            stats.pages_removed += 1
    if stats.results_removed or stats.pages_removed:
        log.info(
            "GX context %s: pruned %d old validation result(s) and %d page(s) of %s (keeping %d)",
            gx_root,
            stats.results_removed,
            stats.pages_removed,
            suite,
            keep,
        )
    return stats


def prune_all(gx_root: Path, keep: int) -> PruneStats:
    """prune_validations for every suite with stored results or pages in the context."""
    suites = {p.name for base in (VALIDATIONS_BASE, DOCS_VALIDATIONS_BASE) for p in _dirs(gx_root / base)}
    total = PruneStats()
    for suite in sorted(suites):
        st = prune_validations(gx_root, suite, keep)
        total.results_removed += st.results_removed
        total.pages_removed += st.pages_removed
    return total


def _dirs(base: Path) -> list[Path]:
    return [p for p in base.iterdir() if p.is_dir()] if base.is_dir() else []
