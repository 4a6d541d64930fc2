"""The GX file context of the gates: set up once per process, validated outside the lock.

A gate only validates and stores its result; the Data Docs are built once per run by the quality
report (gx_docs.py), never by a gate step. Most of a small gate's GX cost is set-up, not validation
(`gx.get_context`, the datasource, suite, validation definition and checkpoint, each written and
re-read), so:

- `prepare()` returns a `Prepared` (context, suite, validation definition, checkpoint) cached per
  process and (context dir, gate), valid for one GX suite definition and result_format: the same
  gate with the same suite reuses it; an edited suite or other overrides set up again. On
  a cache miss (a fresh process) the stored objects are *read* and reused when they equal what
  this run needs; they are written only when they differ, so parallel shard runs with the same
  suites never rewrite each other's files.
- Validation (the CPU part, in `validate()`) runs outside the context lock. GX stores the
  validation result under a new unique run-time folder, so concurrent runs never write the same
  file. Only the set-up on a cache miss writes shared files and takes the lock; the Data Docs build
  and the pruning of old results take it too (gx_docs.build_data_docs).
- `config_variables_file_path` is cleared in the pipeline-owned context (no `${VAR}` substitution
  is used by it), so reading a context variable does not parse a YAML file.
- The validation runs through the validation definition (`_run`), not `checkpoint.run`, whose
  freshness check re-reads and compares the checkpoint, definition and suite from disk every time;
  the definition's own check still catches a suite rewritten by another process. The stored
  result is the one `checkpoint.run` stores (a test compares them).
- Each expectation's configuration is built once per validation (gx_patches.py, applied here).

`analytics_enabled: false` is written to the context's config, so no GX version sends usage statistics.
"""

from __future__ import annotations

import fcntl
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import gx_patches
from .retention import validation_page

log = logging.getLogger(__name__)

DATASOURCE = "eagle3_features"
LOCK_FILE = ".gate.lock"


@dataclass
class LockHold:
    """One critical section on the context lock: what it covered and when (time.time())."""

    what: str
    waited_s: float
    acquired_at: float
    released_at: float

    @property
    def held_s(self) -> float:
        return self.released_at - self.acquired_at


@dataclass
class GXRun:
    """What one validation produced, and where its time went (for logs, tests and the bench)."""

    results: list[Any]
    docs_page: str  # where the Data Docs build (gx_docs.build_data_docs) writes this validation's page
    cache_hit: bool
    validate_started_at: float
    validate_ended_at: float
    locks: list[LockHold] = field(default_factory=list)

    @property
    def lock_held_s(self) -> float:
        return sum(h.held_s for h in self.locks)


@contextmanager
def context_lock(context_dir: Path, what: str, holds: list[LockHold] | None = None) -> Iterator[None]:
    """The context's file lock, for one write (shared by every process using `context_dir`)."""
    context_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(context_dir / LOCK_FILE, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        acquired = time.time()
        try:
            yield
        finally:
            released = time.time()
            fcntl.flock(fh, fcntl.LOCK_UN)
            if holds is not None:
                holds.append(LockHold(what, acquired - t0, acquired, released))


# --------------------------------------------------------------------------------------------- set-up


@dataclass
class Prepared:
    context: Any
    suite: Any
    validation_definition: Any
    checkpoint: Any


# (context dir, gate) -> (suite fingerprint, result_format, prepared): one suite name per gate lives
# in a context, so another definition of the same gate replaces the entry (and the stored suite).
_PREPARED: dict[tuple[str, str], tuple[str, str, Prepared]] = {}
_CONTEXTS: dict[str, Any] = {}
# suite object -> its fingerprint (the suite objects are built once per definition, gate._gx_suite)
_FINGERPRINTS: dict[int, tuple[Any, str]] = {}
# GX context objects are not made for concurrent use by threads: threads of one process take turns
# on the whole GX part (they share the GIL anyway); processes overlap outside the file lock.
_THREAD_LOCK = threading.RLock()


def suite_fingerprint(gx_suite: Any) -> str:
    """The suite's definition without GX's ids: equal fingerprints validate identically."""
    d = gx_suite.to_json_dict()
    d.pop("id", None)
    for e in d.get("expectations", []):
        e.pop("id", None)
    return json.dumps(d, sort_keys=True, default=str)


def _fingerprint(gx_suite: Any) -> str:
    """suite_fingerprint, computed once per suite object: the gates' suite objects are built once
    per definition and never changed (gate._gx_suite; an edited definition is another object)."""
    return gx_patches.by_identity(_FINGERPRINTS, gx_suite, suite_fingerprint)


def clear_cache() -> None:
    """Forget every prepared context in this process (the next gate sets up again)."""
    with _THREAD_LOCK:
        _PREPARED.clear()
        _CONTEXTS.clear()
        _FINGERPRINTS.clear()


@contextmanager
def context_locked(context_dir: Path, what: str) -> Iterator[Any]:
    """The GX file context in `context_dir` (one object per process), held by this thread and under the
    context's file lock for one write to what every process shares (the Data Docs build, the pruning)."""
    with _THREAD_LOCK, context_lock(context_dir, what):
        yield _context(context_dir)


def _context(context_dir: Path) -> Any:
    import great_expectations as gx

    key = str(context_dir.resolve())
    ctx = _CONTEXTS.get(key)
    if ctx is not None:
        return ctx
    ctx = gx.get_context(mode="file", project_root_dir=str(context_dir))
    if (
        not ctx.variables.progress_bars
        or ctx.config.analytics_enabled is not False
        or ctx.config.config_variables_file_path
    ):
        # Once per context, persisted in great_expectations.yml: no tqdm bars in Dagster logs, no
        # analytics, no config_variables.yml (re-read with a YAML parser on every variable access).
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        ctx.config.analytics_enabled = False
        ctx.config.config_variables_file_path = None
        ctx.variables.save()
        ctx = gx.get_context(mode="file", project_root_dir=str(context_dir))  # without that provider
    _CONTEXTS[key] = ctx
    return ctx


def _set_up(context_dir: Path, gate: str, gx_suite: Any, fingerprint: str, result_format: str) -> Prepared:
    """Reuse the stored datasource/suite/definition/checkpoint when equal; write only what differs."""
    import great_expectations as gx
    from great_expectations.exceptions import DataContextError

    ctx = _context(context_dir)
    try:
        ds = ctx.data_sources.get(DATASOURCE)
    except KeyError:
        ds = ctx.data_sources.add_or_update_pandas(DATASOURCE)
    try:
        asset = ds.get_asset(gate)
    except LookupError:
        asset = ds.add_dataframe_asset(gate)
    try:
        batch_def = asset.get_batch_definition("whole")
    except KeyError:
        batch_def = asset.add_batch_definition_whole_dataframe("whole")
    name = f"{gate}_gate"
    try:
        suite = ctx.suites.get(name)
        if suite_fingerprint(suite) != fingerprint:
            suite = ctx.suites.add_or_update(gx_suite)
    except DataContextError:
        suite = ctx.suites.add_or_update(gx_suite)
    try:
        vd = ctx.validation_definitions.get(name)
        if vd.suite.id != suite.id or vd.data.id != batch_def.id:
            raise DataContextError(f"{name}: stored validation definition is for another suite or batch")
    except DataContextError:
        vd = ctx.validation_definitions.add_or_update(gx.ValidationDefinition(name=name, data=batch_def, suite=suite))
    # No actions: a gate stores its result only; the quality report builds the Data Docs (gx_docs.py).
    want_format = {"result_format": result_format}
    try:
        cp = ctx.checkpoints.get(name)
        if (
            [v.id for v in cp.validation_definitions] != [vd.id]
            or cp.actions
            or json.dumps(cp.result_format, sort_keys=True, default=str) != json.dumps(want_format, sort_keys=True)
        ):
            raise DataContextError(f"{name}: stored checkpoint differs")
    except DataContextError:
        cp = ctx.checkpoints.add_or_update(
            gx.Checkpoint(name=name, validation_definitions=[vd], actions=[], result_format=want_format)
        )
    return Prepared(ctx, suite, vd, cp)


def prepare(
    context_dir: Path, gate: str, gx_suite: Any, result_format: str, holds: list[LockHold] | None = None
) -> tuple[Prepared, bool]:
    """The prepared objects for this (context, gate, suite, result_format); (prepared, cache hit)."""
    fingerprint = _fingerprint(gx_suite)
    key = (str(context_dir.resolve()), gate)
    entry = _PREPARED.get(key)
    if entry is not None and entry[0] == fingerprint and entry[1] == result_format:
        return entry[2], True
    with context_lock(context_dir, "set-up", holds):
        prepared = _set_up(context_dir, gate, gx_suite, fingerprint, result_format)
    _PREPARED[key] = (fingerprint, result_format, prepared)
    return prepared, False


def _not_fresh(err: Exception) -> bool:
    """GX refusing to run objects another process changed on disk since we read them."""
    from great_expectations.exceptions.resource_freshness import (
        ResourceFreshnessAggregateError,
        ResourceFreshnessError,
    )

    return isinstance(err, (ResourceFreshnessAggregateError, ResourceFreshnessError))


def _run(prepared: Prepared, pdf: Any) -> tuple[Any, Any]:
    """(result identifier, suite validation result) of one validation, stored in the context.

    What `checkpoint.run` does for a checkpoint with one validation definition and no actions,
    without the checkpoint's own freshness check (which re-reads and compares the checkpoint, the
    validation definition and the suite from disk on every run): the validation definition's run
    still checks the definition and the suite, so a suite rewritten by another process still
    raises a freshness error. The stored result is the same (tests/quality/test_gx_reuse.py)."""
    import datetime as dt

    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    cp, vd = prepared.checkpoint, prepared.validation_definition
    run_id = RunIdentifier(run_time=dt.datetime.now(dt.UTC))
    with gx_patches.memoized_configurations():
        result = vd.run(
            checkpoint_id=cp.id,
            batch_parameters={"dataframe": pdf},
            result_format=cp.result_format,
            run_id=run_id,
        )
    vri = ValidationResultIdentifier(
        expectation_suite_identifier=ExpectationSuiteIdentifier(name=vd.suite.name),
        run_id=run_id,
        batch_identifier=result.batch_id,
    )
    return vri, result


def validate(context_dir: Path, gate: str, pdf: Any, gx_suite: Any, *, result_format: str) -> GXRun:
    """Validate `pdf` with the gate's suite and store the result in the context; nothing else.

    The context lock is taken only for a set-up (a fresh process, an edited suite); the Data Docs
    page of this validation is written later, by the quality report (gx_docs.build_data_docs)."""
    gx_patches.apply_process_patches()
    holds: list[LockHold] = []
    with _THREAD_LOCK:
        prepared, hit = prepare(context_dir, gate, gx_suite, result_format, holds)
        started = time.time()
        try:
            vri, vres = _run(prepared, pdf)
        except Exception as e:
            if not _not_fresh(e):
                raise
            # Another process rewrote the suite (edited overrides): set up again, once.
            log.info("GX context %s: %s changed on disk (%s); setting up again", context_dir, gate, type(e).__name__)
            _PREPARED.pop((str(context_dir.resolve()), gate), None)
            _CONTEXTS.pop(str(context_dir.resolve()), None)
            prepared, hit = prepare(context_dir, gate, gx_suite, result_format, holds)
            started = time.time()
            vri, vres = _run(prepared, pdf)
        ended = time.time()
    page = validation_page(Path(prepared.context.root_directory), vri.to_tuple())
    run = GXRun(vres.results, str(page), hit, started, ended, holds)
    log.debug(
        "gate %s: GX validation %.3fs (set-up %s), context lock held %.3fs",
        gate,
        ended - started,
        "cached" if hit else "done",
        run.lock_held_s,
    )
    return run
