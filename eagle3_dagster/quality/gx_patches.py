"""Every patch this project makes to Great Expectations, in one place, each applied explicitly.

GX spends most of a small gate in set-up and rendering, not validation; these patches keep GX's
results and pages identical (tests/quality/test_gx_reuse.py compares them with GX's own) and only
cut repeated work. They reach into GX internals, so they are checked against one GX version:
tests/quality/test_gx_patches.py fails when the installed GX is another, naming what to re-check.

Process-wide (`apply_process_patches`, called by gx_context.validate before a validation):
- `DefaultJinjaView.__init__`: every Data Docs Jinja environment shares one in-memory bytecode cache,
  so the templates are compiled once per process.
- `Expectation.configuration`: built once per expectation inside `memoized_configurations()` (one
  validation) instead of on every access; unchanged everywhere else.

Per context object (`install_context_patches`, once per context, gx_context._context):
- `_init_site_builder_for_data_docs_site_creation`: one site builder per site, static assets once.
- `get_validation_result`: a stored result is read once per process (it never changes).

Per page build (`listing_only`, gx_docs.build_pages): the result and suite stores list exactly the
resources being rendered instead of walking the whole store.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# the GX version these patches were written and checked against
PINNED_GX_VERSION = "1.24.1"
RECHECK = (
    "great_expectations.render.view.view.DefaultJinjaView.__init__ (sets self.env), "
    "Expectation.configuration (still a property rebuilding the configuration), "
    "AbstractDataContext._init_site_builder_for_data_docs_site_creation and get_validation_result "
    "(same signatures), the stores' list_keys / key_to_tuple / tuple_to_key, and that "
    "tests/quality/test_gx_reuse.py still finds the pages identical"
)


def apply_process_patches() -> None:
    """The process-wide patches (each once per process; idempotent)."""
    share_jinja_bytecode()
    share_configurations()


def by_identity(cache: dict[int, tuple[Any, Any]], obj: Any, compute: Callable[[Any], Any]) -> Any:
    """compute(obj) once per live object: keyed by id(obj), the object kept beside its value so a
    recycled id of a dead object never answers for a new one."""
    hit = cache.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    value = compute(obj)
    cache[id(obj)] = (obj, value)
    return value


class _MemoryBytecodeCache:
    """jinja2.BytecodeCache in memory, shared by every Environment GX creates in this process."""

    def __init__(self) -> None:
        from jinja2 import BytecodeCache

        class _Cache(BytecodeCache):
            def __init__(self) -> None:
                self.code: dict[str, Any] = {}

            def load_bytecode(self, bucket: Any) -> None:
                code = self.code.get(bucket.key + bucket.checksum)
                if code is not None:
                    bucket.code = code

            def dump_bytecode(self, bucket: Any) -> None:
                self.code[bucket.key + bucket.checksum] = bucket.code

        self.cache = _Cache()


_JINJA: _MemoryBytecodeCache | None = None


def share_jinja_bytecode() -> None:
    """Every GX DefaultJinjaView gets one shared bytecode cache (once per process)."""
    global _JINJA
    if _JINJA is not None:
        return
    from great_expectations.render.view import view as gx_view

    _JINJA = _MemoryBytecodeCache()
    cls = gx_view.DefaultJinjaView
    original = cls.__init__
    cache = _JINJA.cache

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        env = getattr(self, "env", None)
        if env is not None and env.bytecode_cache is None:
            env.bytecode_cache = cache

    cls.__init__ = __init__  # type: ignore[method-assign]


# ------------------------------------------------------------------------------- expectation configurations

_CONFIG_MEMO = threading.local()


_CONFIG_PATCHED = False


def share_configurations() -> None:
    """GX's `Expectation.configuration` is a property that rebuilds the configuration (a pydantic
    `.dict()` of the expectation, deep-copied values) on every access; one validation reads it
    ~65 times per expectation while building the metric graph. Inside `memoized_configurations()`
    (one validation) each expectation object builds it once; everywhere else GX is unchanged."""
    global _CONFIG_PATCHED
    if _CONFIG_PATCHED:
        return
    from great_expectations.expectations.expectation import Expectation

    prop = Expectation.__dict__.get("configuration")
    if not isinstance(prop, property) or prop.fget is None:  # another GX: leave it alone
        _CONFIG_PATCHED = True
        return
    build = prop.fget

    def configuration(self: Any) -> Any:
        memo = getattr(_CONFIG_MEMO, "memo", None)
        return build(self) if memo is None else by_identity(memo, self, build)

    Expectation.configuration = property(configuration, doc=prop.__doc__)  # type: ignore[method-assign,assignment]
    _CONFIG_PATCHED = True


@contextmanager
def memoized_configurations() -> Iterator[None]:
    """One validation: each expectation's configuration is built once (after share_configurations)."""
    _CONFIG_MEMO.memo = {}
    try:
        yield
    finally:
        _CONFIG_MEMO.memo = None


# ------------------------------------------------------------------------------- per context


def install_context_patches(ctx: Any) -> None:
    """Once per context object: cached site builders, static assets once, stored results read once."""
    _cache_site_builders(ctx)
    _memoize_validation_results(ctx)


def _cache_site_builders(ctx: Any) -> None:
    """One site builder per (site, config) for the context's life; its static assets copied once
    per process (and again when the folder is gone)."""
    original = ctx._init_site_builder_for_data_docs_site_creation
    builders: dict[str, Any] = {}
    copied: set[str] = set()

    def init_site_builder(site_name: str, site_config: dict) -> Any:
        key = site_name + "\0" + json.dumps(site_config, sort_keys=True, default=str)
        builder = builders.get(key)
        if builder is not None:
            return builder
        builder = original(site_name=site_name, site_config=site_config)
        store = getattr(builder, "target_store", None)
        copy = getattr(store, "copy_static_assets", None)
        backend = (getattr(store, "store_backends", None) or {}).get("static_assets")
        base = getattr(backend, "full_base_directory", None)
        if store is not None and copy is not None and base is not None:
            static = Path(base) / "static"

            def copy_static_assets(static_assets_source_dir: str | None = None) -> None:
                if site_name in copied and static_assets_source_dir is None and static.is_dir():
                    return
                copy(static_assets_source_dir)
                if static_assets_source_dir is None:
                    copied.add(site_name)

            store.copy_static_assets = copy_static_assets
        builders[key] = builder
        return builder

    ctx._init_site_builder_for_data_docs_site_creation = init_site_builder


_RESULTS_MEMO_SIZE = 512


def _memoize_validation_results(ctx: Any) -> None:
    """Data Docs' index builder re-reads (and deserializes) every stored validation result on each
    build; a stored result never changes (one new run-time folder per run), so each is read once
    per process. Pruned results are not asked for (the builder lists the store first)."""
    from great_expectations.core.expectation_validation_result import ExpectationSuiteValidationResult

    original = ctx.get_validation_result
    memo: OrderedDict[tuple, Any] = OrderedDict()

    def get_validation_result(
        expectation_suite_name: str,
        run_id: Any = None,
        batch_identifier: Any = None,
        validation_results_store_name: Any = None,
        failed_only: bool = False,
    ) -> Any:
        key: tuple | None = None  # without a run id and batch: "the latest run", not a fixed result
        if hasattr(run_id, "run_time") and batch_identifier is not None:
            rid = (run_id.run_name, str(run_id.run_time))
            key = (expectation_suite_name, rid, batch_identifier, validation_results_store_name, failed_only)
        if key is not None and key in memo:
            memo.move_to_end(key)
            return memo[key]
        res = original(
            expectation_suite_name=expectation_suite_name,
            run_id=run_id,
            batch_identifier=batch_identifier,
            validation_results_store_name=validation_results_store_name,
            failed_only=failed_only,
        )
        if key is not None and isinstance(res, ExpectationSuiteValidationResult):
            memo[key] = res
            if len(memo) > _RESULTS_MEMO_SIZE:
                memo.popitem(last=False)
        return res

    ctx.get_validation_result = get_validation_result


# ------------------------------------------------------------------------------- per page build


@contextmanager
def listing_only(ctx: Any, ids: Sequence[Any]) -> Iterator[None]:
    """For one page build, the validation results and suite stores list exactly `ids` (each exists):
    GX's section builders walk the whole store only to skip every key not asked for."""
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    stores: list[tuple[Any, list[Any]]] = [
        (ctx.validation_results_store, [i for i in ids if isinstance(i, ValidationResultIdentifier)]),
        (ctx.expectations_store, [i for i in ids if isinstance(i, ExpectationSuiteIdentifier)]),
    ]
    for store, keys in stores:
        # as the store lists them: its key from the stored tuple (a run name None reads "__none__")
        listed: list[Any] = [store.tuple_to_key(store.key_to_tuple(k)) for k in keys]
        store.list_keys = lambda listed=listed: list(listed)
    try:
        yield
    finally:
        for store, _ in stores:
            store.__dict__.pop("list_keys", None)
