"""Every patch this project makes to Great Expectations, in one place, applied explicitly.

GX spends much of a gate's validation rebuilding each expectation's configuration; the one patch left
keeps GX's results identical (tests/quality/test_gx_reuse.py compares them with GX's own) and only
cuts that repeated work. It reaches into GX internals, so it is checked against one GX version:
tests/quality/test_gx_patches.py fails when the installed GX is another, naming what to re-check.

Process-wide (`apply_process_patches`, called by gx_context.validate before a validation):
- `Expectation.configuration`: built once per expectation inside `memoized_configurations()` (one
  validation) instead of on every access; unchanged everywhere else.

The Data Docs need no patch: the gates build none, and the quality report builds them once per run
(gx_docs.py), where GX's own speed will do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# the GX version this patch was written and checked against
PINNED_GX_VERSION = "1.24.1"
RECHECK = (
    "Expectation.configuration (still a property rebuilding the configuration) and that "
    "tests/quality/test_gx_reuse.py still finds the stored results identical"
)


def apply_process_patches() -> None:
    """The process-wide patches (each once per process; idempotent)."""
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
