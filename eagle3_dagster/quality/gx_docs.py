"""GX Data Docs of the gates: this run's page on every gate, the index (and the pruning) when due.

Each gate renders its own validation page (and the suite page on a set-up or when it is missing):
what a user follows from the gate's check (`data_docs_page`) exists as soon as the gate is done.
The site's index (index.html: a Jinja render listing every kept validation of every suite, ~60
at keep=20 x 3 suites) is the largest single Data Docs cost of a gate, so it is rebuilt only when
it is due:

- the index file is missing, or this gate renders its suite's page for the first time (else the
  index would not list the suite until the next rebuild: once per suite and context), or
- its mtime is older than DOCS_INDEX_REFRESH_S (the file's mtime, so this holds across the step
  processes of the multiprocess executor too), or
- at the end of a run: `refresh_docs_index` (gx_context), called by the `quality_report`
  asset and `eagle3 report` before they render the quality report.

Retention pruning (retention.prune_all) happens at the same moment and under the same context lock,
right before the index is rebuilt: pages are deleted only when the index is rewritten from what is
left, so the index never links a deleted page, and each rebuild prunes everything stored since the
previous one (bounded). Between rebuilds the index may not list the newest runs yet; their pages
exist and every gate result links its own page.

What else a build would cost and is not paid per gate (the pages are those GX's own build writes;
tests/quality/test_gx_reuse.py compares them with a full GX build):

- GX's section builders list every stored validation result and suite (a filesystem walk and a key
  object per file) only to find the resources asked for. The resources rendered here exist (this
  run's result was just stored, the suite was set up), so for a page build the stores list exactly
  those (gx_patches.listing_only); the index build lists the real stores.
- The site builder (~60 Jinja views and renderers) is made once per context and site, not on every
  build and URL lookup; the static assets (CSS, fonts, images: ~60 files, they depend only on the
  installed GX) are copied by the first build of a process and again only if the folder is gone.
- The index builder reads each stored validation result once per process (results never change
  once stored; pruned ones are not asked for, the builder lists the store first).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from . import gx_patches
from .retention import DOCS_INDEX, PruneStats, prune_all

DOCS_INDEX_REFRESH_S = 30.0  # the index is rebuilt (and results pruned) at most this often by gates


def index_due(gx_root: Path, now: float | None = None) -> bool:
    """The index is missing or older than DOCS_INDEX_REFRESH_S."""
    try:
        mtime = (gx_root / DOCS_INDEX).stat().st_mtime
    except FileNotFoundError:
        return True
    return (time.time() if now is None else now) - mtime >= DOCS_INDEX_REFRESH_S


def local_site_url(sites: list[dict[str, Any]]) -> str | None:
    for site in sites:
        url = site.get("site_url") or ""
        if url.startswith("file://"):
            return unquote(urlparse(url).path)
    return None


# --------------------------------------------------------------------------------------------- per context


def _site_builders(ctx: Any) -> Iterator[Any]:
    for site_name, site_config in (ctx.variables.data_docs_sites or {}).items():
        yield ctx._init_site_builder_for_data_docs_site_creation(site_name=site_name, site_config=site_config)


# --------------------------------------------------------------------------------------------- builds


def build_pages(ctx: Any, ids: Sequence[Any]) -> None:
    """Render these pages (validation results, suites: all stored) and nothing else, no index."""
    if not ids:  # GX renders EVERY page when given no identifiers
        return
    with gx_patches.listing_only(ctx, ids):
        ctx.build_data_docs(resource_identifiers=list(ids), build_index=False)


def build_index(ctx: Any) -> None:
    """Rewrite index.html from the stored results and pages (GX drops pages whose result is gone)."""
    for builder in _site_builders(ctx):
        builder.target_store.copy_static_assets()
        builder.site_index_builder.build(build_index=True)


def page_url(ctx: Any, resource_identifier: Any) -> str | None:
    """The local site's page of a resource (absolute path), if it exists."""
    urls = [
        {"site_url": b.get_resource_url(resource_identifier=resource_identifier, only_if_exists=True)}
        for b in _site_builders(ctx)
    ]
    return local_site_url(urls)


def refresh(ctx: Any, keep: int, pages: Sequence[Any] = ()) -> PruneStats:
    """Prune every suite to its newest `keep` runs (0 keeps all), render `pages`, rebuild the index.

    The caller holds the context lock. Pages asked for that pruning removed are not rendered."""
    gx_root = Path(ctx.root_directory)
    stats = prune_all(gx_root, keep) if keep > 0 else PruneStats()
    store = ctx.validation_results_store
    build_pages(ctx, [i for i in pages if not hasattr(i, "run_id") or store.has_key(i)])
    build_index(ctx)
    return stats
