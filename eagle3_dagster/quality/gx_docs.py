"""GX Data Docs of the gates, built once per run by the quality report (never by a gate step).

A gate only validates and stores its result (gx_context.validate). At the end of a run the `quality_report`
asset (and `eagle3 report`) calls `build_data_docs`: under the context lock it prunes every suite to its
newest `keep` results (retention.prune_all, pages with them), renders the page of each kept result that
has none yet and the page of every suite, and rewrites the index from what is left. So the index lists
exactly the kept results, each linking its page, and a gate's stored result names that page
(retention.validation_page) before it exists: the report links it only once it does.

The pages are those GX's own full build writes (tests/quality/test_gx_reuse.py compares them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import gx_context
from .retention import DOCS_INDEX, prune_all, validation_page


def _missing_pages(ctx: Any, gx_root: Path) -> list[Any]:
    """The stored validation results without a page yet, and every stored suite (its page follows the suite)."""
    results = [
        k for k in ctx.validation_results_store.list_keys() if not validation_page(gx_root, k.to_tuple()).is_file()
    ]
    return [*results, *ctx.expectations_store.list_keys()]


def build_data_docs(context_dir: Path, keep: int) -> Path | None:
    """Prune every suite to its newest `keep` results (0 keeps all), render the pages the kept results and
    the suites lack, and rewrite the index. The index path; None when there is no GX context yet (no gate
    ran) or nothing was ever stored in it."""
    gx_root = Path(context_dir) / "gx"
    if not (gx_root / "great_expectations.yml").is_file():
        return None
    with gx_context.context_locked(Path(context_dir), "prune+docs") as ctx:
        if keep > 0:
            prune_all(gx_root, keep)
        pages = _missing_pages(ctx, gx_root)
        if not pages:  # GX renders EVERY page when given no identifiers; with no suite there is nothing
            return None
        ctx.build_data_docs(resource_identifiers=pages, build_index=True)
    return gx_root / DOCS_INDEX
