"""generate_shard: tokenized prompts of one shard -> stored generations, resumable and exact.

Flow: lock the shard store -> probe endpoints (revision, max_running_requests) -> compute
sample_ids, drop duplicates and the ones already stored (inputs.py) -> N workers, each one
sample at a time, feed an in-memory buffer -> the buffer is flushed as an atomic chunk every
`flush_every_n` samples or `flush_every_s` seconds -> errors.parquet -> compaction of the chunks
when more than `compact_after_chunks` exist (store.py) -> ShardReport.
Results are never accumulated in memory; pass the tokenized shard as a Path to stream it too.
The parts: engine.py (what to send next, the gate before sending, one request, the outcome recorder,
the worker loop), flush.py (the buffer and its chunk writes); this module sets them up and reports.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from .. import stopping
from ..schemas import TURN_GENERATIONS
from ..secret import printable
from ..storage import DataPath, as_data_path
from .cached_only import any_endpoint_answers, cached_only_report
from .client import abort_rid
from .config import GenerationConfig, sampling_hash, sampling_params
from .context_fit import ContextBudget
from .endpoints import EndpointPool, EndpointWatch, ServingChecks
from .engine import EngineContext, OutcomeRecorder, RequestSource, WeightPin, retry_policy, run_worker
from .flush import ChunkFlusher
from .inputs import Plan, SampleKeys, TokenizedSource, iter_pending, plan_shard, stored_keys
from .items import WorkItem
from .multiturn import MultiTurn, TurnDriver, stored_turns, turns_dir
from .probes import ProbeKeys, fleet_drafter_key
from .report import ProgressReport, RunStats, ShardReport, failures_by_reason, progress_line
from .requeue import requeue_quarantined
from .retried import PreviousFailures, write_retried
from .rows import ErrorRow, is_permanent_reason
from .sse import StreamMode
from .store import ShardStore, StoreDir, StoreWriteError, read_generation_errors, stored_sample_ids
from .tls import tls_context

log = logging.getLogger(__name__)


def _auth_headers(config: GenerationConfig) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if config.api_key is not None:  # read by the settings layer (config.py), handed over as a Secret
        headers["Authorization"] = f"Bearer {config.api_key.reveal()}"
    return headers


async def generate_shard_async(
    tokenized: TokenizedSource,
    out_dir: StoreDir,
    config: GenerationConfig,
    *,
    progress: Callable[[ProgressReport], None] | None = None,
    progress_every_s: float = 5.0,
    lock_dir: Path | None = None,
    multiturn: MultiTurn | None = None,
) -> ShardReport:
    """See generate_shard. A stop request (stopping.request_stop: Ctrl-C / SIGTERM on the demo) cancels
    the run: in-flight requests are aborted, answered samples stored, and StopRequested is raised."""
    with stopping.cancellable():
        try:
            return await _generate_shard(
                tokenized,
                out_dir,
                config,
                progress=progress,
                progress_every_s=progress_every_s,
                lock_dir=lock_dir,
                multiturn=multiturn,
            )
        except asyncio.CancelledError:
            if stopping.stop_requested():
                raise stopping.StopRequested(
                    f"generation of {as_data_path(out_dir).name} stopped ({stopping.stop_reason()}): the samples "
                    "answered so far are stored, a rerun resumes"
                ) from None
            raise


class _HttpClients:
    """The run's HTTP pools: one TLS context for all (tls.tls_context: building one loads the CA bundle), and workers
    spread over small pools, since httpcore scans its whole pool for every request (O(connections))
    and with hundreds in flight that scan costs more than the HTTP work."""

    def __init__(self) -> None:
        self._limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=4.0)
        self.all = [self._new()]  # the first one serves the probes and the first workers

    def _new(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(limits=self._limits, http1=True, http2=False, trust_env=False, verify=tls_context())

    @property
    def first(self) -> httpx.AsyncClient:
        return self.all[0]

    def spread(self, n_workers: int, per_client: int) -> None:
        while len(self.all) * max(1, per_client) < n_workers:
            self.all.append(self._new())

    def for_worker(self, i: int) -> httpx.AsyncClient:
        return self.all[i % len(self.all)]

    async def close(self) -> None:
        for c in self.all:
            await c.aclose()


def _endpoint_pool(
    config: GenerationConfig, client: httpx.AsyncClient, headers: dict[str, str], sp: dict[str, Any]
) -> EndpointPool:
    watch = EndpointWatch(
        health_timeout_s=config.health_timeout_s,
        health_interval_s=config.health_interval_s,
        probe_interval_s=config.probe_interval_s,
        breaker_threshold=config.breaker_threshold,
        wait_for_endpoint_s=config.wait_for_endpoint_s,
        cooldown_base_s=config.breaker_cooldown_s,
        cooldown_max_s=max(config.backoff_max_s, config.breaker_cooldown_s),
    )
    serving = ServingChecks(
        allow_old_server=config.allow_old_server,
        sent_sampling_keys=frozenset(sp),
        expected_model=config.served_model_expectation(),
    )
    return EndpointPool(config.endpoints, client, headers, watch, serving=serving, wait_record=config.endpoint_wait)


def _stream_mode(config: GenerationConfig) -> StreamMode | None:
    if not config.stream:
        return None
    return StreamMode(
        first_chunk_timeout_s=config.first_chunk_timeout_s,
        stall_timeout_s=config.stall_timeout_s,
        stream_interval=config.effective_stream_interval(),
    )


def _engine_context(
    report: ShardReport, pool: EndpointPool, config: GenerationConfig, headers: dict[str, str], shard: str
) -> EngineContext:
    """What the fleet said (revision, context length, versions) into the report, and the run's context."""
    revision = pool.model_revision or "unknown"
    report.model_revision = revision
    report.sampling_hash = sampling_hash(config)
    report.drafter_key = fleet_drafter_key(pool.drafters())
    report.preferred_sampling_params = {
        ep.name: ep.preferred_sampling_params for ep in pool.endpoints if ep.preferred_sampling_params
    }
    server_context = pool.context_length()  # None: some endpoint does not report it (nothing is skipped)
    report.server_context_length = server_context
    report.context_overflow = config.context_overflow
    report.server_versions = pool.versions()
    report.served_models = {ep.name: printable(ep.served_model.describe()) for ep in pool.endpoints if ep.served_model}
    report.refused_endpoints = {ep.name: ep.refused for ep in pool.endpoints if ep.refused}
    report.streamed = config.stream
    return EngineContext(
        config=config,
        pool=pool,
        headers=headers,
        sampling=sampling_params(config),
        budget=ContextBudget.of(config, server_context),  # prompt + max_new_tokens over it: fit or skip
        server_context=server_context,
        revision=revision,
        s_hash=report.sampling_hash,
        run_nonce=secrets.token_hex(3),  # rids of this run never equal a killed run's still-running rids
        stream=_stream_mode(config),
        stats=RunStats(total=0),
        shard=shard,
        policy=retry_policy(config),
        weight=WeightPin.of(revision, pinned=bool(config.model_revision)),
    )


def _not_sent_again(out_dir: DataPath, config: GenerationConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(every earlier error row, the ones not sent again): a permanent failure (a 400, a bad prompt)
    would fail the same way, so it stays in errors.parquet and counts as failed."""
    prior_all = read_generation_errors(out_dir)
    if config.retry_permanent_errors or prior_all.height == 0:
        return prior_all, prior_all.clear()
    return prior_all, prior_all.filter(pl.col("reason").map_elements(is_permanent_reason, return_dtype=pl.Boolean))


@dataclass
class _Work:
    """What this run sends: the plan of single prompts, the conversations' driver, and what is carried."""

    plan: Plan
    items: Iterator[WorkItem]
    driver: TurnDriver | None
    carried: pl.DataFrame  # permanent failures of earlier runs, not sent again
    previous: PreviousFailures  # earlier failures (and requeued quarantined answers) sent again

    @property
    def pending(self) -> int:
        return self.plan.pending + (self.driver.pending if self.driver is not None else 0)


async def _start_turns(ctx: EngineContext, multiturn: MultiTurn, out_dir: DataPath, probes: ProbeKeys) -> TurnDriver:
    keys = SampleKeys(ctx.revision, ctx.s_hash, ctx.config.regen_seed, probes=probes)
    driver = multiturn.driver(stored=await asyncio.to_thread(stored_turns, out_dir), keys=keys)
    await asyncio.to_thread(driver.start)  # replays the stored turns: an unchanged night sends nothing
    log.info(
        "shard %s: %d all_turns conversations, %d turns planned, %d stored already, %d to send next",
        ctx.shard,
        driver.stats.conversations,
        driver.stats.turns_planned,
        driver.stats.turns_cached,
        len(driver.ready),
    )
    return driver


async def _plan_work(
    ctx: EngineContext,
    store: ShardStore,
    tokenized: TokenizedSource,
    out_dir: DataPath,
    multiturn: MultiTurn | None,
    report: ShardReport,
) -> _Work:
    """Which samples to send (not stored, not failed for good), in order; the plan's counts into the report."""
    prior_all, prior = _not_sent_again(out_dir, ctx.config)
    # quarantined answers a fixed server would answer differently: out of the store, so sent again below
    requeued = await asyncio.to_thread(requeue_quarantined, store)
    report.quarantined_retried = len(requeued)
    probes = ProbeKeys(frozenset(ctx.config.probe_sources), report.drafter_key, ctx.config.probe_seed)
    row_hash = ctx.budget.hash_for if ctx.server_context is not None else None
    keys = SampleKeys(ctx.revision, ctx.s_hash, ctx.config.regen_seed, row_hash, probes)
    plan = await asyncio.to_thread(
        partial(
            plan_shard,
            tokenized,
            keys,
            stored=stored_keys(out_dir),
            skip_ids=frozenset(prior.get_column("sample_id").to_list()),
            exclude_prompt_ids=multiturn.conversation_ids if multiturn is not None else frozenset(),
        )
    )
    has_turns = multiturn is not None and bool(multiturn.conversations)
    driver = await _start_turns(ctx, multiturn, out_dir, probes) if multiturn is not None and has_turns else None
    carried = prior.filter(pl.col("sample_id").is_in(plan.carried_ids)).unique("sample_id", keep="last")
    previous = PreviousFailures.from_errors(prior_all, carried.get_column("sample_id").to_list())
    items = iter_pending(tokenized, plan, keys)
    return _Work(plan, items, driver, carried, PreviousFailures({**previous.reasons, **requeued}))


def _note_plan(report: ShardReport, work: _Work, ctx: EngineContext) -> None:
    plan = work.plan
    ctx.stats = RunStats(total=plan.pending, cached=plan.skipped_cached)
    report.requested = plan.requested
    report.duplicates_in_input = plan.rows - plan.excluded - plan.requested
    report.skipped_cached = plan.skipped_cached
    report.carried_failed = work.carried.height
    log.info(
        "shard %s: %d requested, %d already stored, %d failed permanently before, %d to generate (revision %s)",
        ctx.shard,
        report.requested,
        report.skipped_cached,
        work.carried.height,
        plan.pending,
        report.model_revision,
    )


def _window(report: ShardReport, config: GenerationConfig, pool: EndpointPool, pending: int) -> int:
    """How many requests are in flight at once: configured, or what the servers can run."""
    n = config.max_in_flight or pool.max_in_flight(config.in_flight_headroom)
    report.in_flight_source = "config" if config.max_in_flight else "server_info"
    report.max_in_flight = max(1, min(n, pending))
    return report.max_in_flight


class _Progress:
    """The progress line (or callback) every `every_s` while the run goes on."""

    def __init__(self, shard: str, stats: RunStats, sink: Callable[[ProgressReport], None] | None) -> None:
        self.shard, self.stats, self.sink = shard, stats, sink

    def emit(self) -> None:
        if self.sink is not None:
            _call_progress(self.sink, self.stats.progress())
        else:
            log.info("%s", progress_line(self.shard, self.stats.progress()))

    async def run(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.emit()


async def _run_engine(
    ctx: EngineContext,
    work: _Work,
    flusher: ChunkFlusher,
    http: _HttpClients,
    n_workers: int,
    progress: _Progress,
    progress_every_s: float,
) -> None:
    """The workers and the background tasks until every item is done; the first failure stops them all
    (raised), and the samples answered so far are written whatever happened (but a failed write)."""
    http.spread(n_workers, ctx.config.connections_per_client)
    source = RequestSource(work.items, work.driver)
    recorder = OutcomeRecorder(ctx, flusher, work.driver)
    bg: list[asyncio.Task[Any]] = [asyncio.create_task(flusher.run_timer(ctx.config.flush_every_s), name="flusher")]
    if progress_every_s > 0:
        bg.append(asyncio.create_task(progress.run(progress_every_s), name="progress"))
    workers = [
        asyncio.create_task(run_worker(ctx, source, recorder, flusher, http.for_worker(i)), name=f"worker-{i}")
        for i in range(n_workers)
    ]
    fatal: list[BaseException] = []
    try:
        await _gather_or_fail(workers, bg, fatal, flusher.lock)
    except asyncio.CancelledError:
        # Stopped (Ctrl-C, SIGTERM, a Dagster run cancel): tell the servers to drop our requests.
        await _abort_in_flight(http.first, ctx.headers, ctx.in_flight)
        raise
    finally:
        # Under the write lock: a flush the timer started finishes its write before the flusher is
        # cancelled (a cancelled to_thread write goes on unseen: the run returned mid-write).
        async with flusher.lock:
            for t in bg:
                t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)
        if not any(isinstance(e, StoreWriteError) for e in fatal):
            # Samples already answered are kept even when the run fails for another reason.
            await flusher.flush(force_errors=True)


async def _note_outcome(
    report: ShardReport, ctx: EngineContext, work: _Work, errors: list[ErrorRow], out_dir: DataPath
) -> None:
    """The run's figures into the report: counts, failures by reason, earlier failures sent again, turns."""
    ctx.stats.fill(report)
    report.failed += work.carried.height
    for reason in work.carried.get_column("reason").to_list():
        report.errors_by_kind[reason] = report.errors_by_kind.get(reason, 0) + 1
    report.failure_details = {r: printable(d) for r, (_, d) in failures_by_reason(e.as_row() for e in errors).items()}
    if work.previous.reasons:
        stored_now = await asyncio.to_thread(lambda: stored_sample_ids(out_dir).to_list())
        report.previous_failures = work.previous.outcome(stored_now, (e.sample_id for e in errors))
        write_retried(out_dir, datetime.now(UTC).isoformat(timespec="seconds"), report.previous_failures)
    report.per_endpoint = ctx.pool.per_endpoint()
    driver = work.driver
    if driver is not None:
        report.turns = driver.stats.as_dict()
        report.turn_sample_ids = list(driver.active_sample_ids)
        if not driver.stats.reconciles:
            log.error("shard %s: the turn counts do not reconcile: %s", ctx.shard, report.turns)


async def _compact(report: ShardReport, store: ShardStore, config: GenerationConfig, shard: str) -> None:
    """Housekeeping after a complete run (lock held, nothing else writing): a failure here leaves the
    data as it was (see store.py), so it is reported, not raised."""
    report.compaction_leftovers_removed = store.compaction_leftovers_removed
    if config.compact_after_chunks is not None:
        try:
            report.chunks_compacted = await asyncio.to_thread(store.compact, config.compact_after_chunks)
        except Exception as e:
            log.warning("shard %s: compaction failed, chunks left as they were: %s", shard, e)
            report.compaction_error = f"{type(e).__name__}: {e}"[:500]
    report.chunks_written = store.chunks_written
    report.chunk_write_retries = store.write_retries_used


async def _generate_shard(
    tokenized: TokenizedSource,
    out_dir: StoreDir,
    config: GenerationConfig,
    *,
    progress: Callable[[ProgressReport], None] | None,
    progress_every_s: float,
    lock_dir: Path | None,
    multiturn: MultiTurn | None = None,
) -> ShardReport:
    out_dir = as_data_path(out_dir)
    store = ShardStore(out_dir, write_retries=config.write_retries, lock_dir=lock_dir)
    # all_turns conversations: their turns go to generations/shard=NNNN/turns/ (generate/multiturn.py)
    has_turns = multiturn is not None and bool(multiturn.conversations)
    turn_store = (
        ShardStore(turns_dir(out_dir), write_retries=config.write_retries, lock_dir=lock_dir, schema=TURN_GENERATIONS)
        if has_turns
        else None
    )
    headers = _auth_headers(config)
    http = _HttpClients()
    pool = _endpoint_pool(config, http.first, headers, sampling_params(config))
    try:
        store.open()  # the shard's lock first: a second process on the same shard stops here
        if turn_store is not None:
            turn_store.open()
        if not await any_endpoint_answers(http.first, headers, config.endpoints, config.health_timeout_s):
            cached = await asyncio.to_thread(cached_only_report, tokenized, out_dir, config, has_turns=has_turns)
            if cached is not None:  # nothing to send: the dead endpoint is not waited for
                return cached
        await pool.start(configured_revision=config.model_revision)
        report = ShardReport()
        ctx = _engine_context(report, pool, config, headers, out_dir.name)
        work = await _plan_work(ctx, store, tokenized, out_dir, multiturn, report)
        write_retried(out_dir, "", {})  # a run that does not finish leaves no outcome of an earlier one
        _note_plan(report, work, ctx)
        n_workers = _window(report, config, pool, work.pending)
        carried = [ErrorRow.of(r) for r in work.carried.iter_rows(named=True)]
        flusher = ChunkFlusher(store, turn_store, carried, confirm=pool.confirm_serving)
        reporter = _Progress(out_dir.name, ctx.stats, progress)
        await _run_engine(ctx, work, flusher, http, n_workers, reporter, progress_every_s)
        if progress is not None:
            _call_progress(progress, ctx.stats.progress())
        await _note_outcome(report, ctx, work, flusher.errors, out_dir)
        report.http_pools = len(http.all)
        await _compact(report, store, config, out_dir.name)
        return report
    finally:
        await pool.stop()
        await http.close()
        store.close()
        if turn_store is not None:
            turn_store.close()


async def _abort_in_flight(client: httpx.AsyncClient, headers: dict[str, str], in_flight: dict[str, str]) -> None:
    """Best effort, bounded: /abort_request for every request still running when the run is stopped."""
    todo = dict(in_flight)
    if not todo:
        return
    log.warning("stopping: aborting %d in-flight request(s) on the server(s)", len(todo))
    try:
        async with asyncio.timeout(3.0):
            await asyncio.gather(
                *(abort_rid(client, headers, url, rid, timeout=2.0) for rid, url in todo.items()),
                return_exceptions=True,
            )
    except TimeoutError:
        pass


async def _gather_or_fail(
    workers: list[asyncio.Task[None]], bg: list[asyncio.Task[Any]], fatal: list[BaseException], lock: asyncio.Lock
) -> None:
    """Wait for the workers; the first exception in a worker or a background task cancels the rest
    (under `lock`, the write lock: a worker's flush in progress writes its chunk first)."""
    pending = set(workers) | set(bg)
    try:
        while any(not w.done() for w in workers):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                exc = None if t.cancelled() else t.exception()
                if exc is not None:
                    fatal.append(exc)
            if fatal:
                raise fatal[0]
    except BaseException:
        # An error, or our own cancellation (Ctrl-C, a Dagster run stop): stop every worker before
        # the caller flushes, so nothing is appended to the buffer after the last write.
        async with lock:
            for t in workers:
                t.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise


def _call_progress(progress: Callable[[ProgressReport], None], rep: ProgressReport) -> None:
    try:
        progress(rep)
    except Exception:  # a broken progress sink must not stop generation
        log.exception("progress callback failed")


def _run(coro_factory: Callable[[], Any]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())
    # Called from inside an event loop (e.g. a notebook): run ours on a private thread.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["v"] = asyncio.run(coro_factory())
        except BaseException as e:  # re-raised in the caller's thread
            box["e"] = e

    th = threading.Thread(target=target, name="generate_shard")
    th.start()
    th.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def generate_shard(
    tokenized: TokenizedSource,
    out_dir: StoreDir,
    config: GenerationConfig,
    *,
    progress: Callable[[ProgressReport], None] | None = None,
    progress_every_s: float = 5.0,
    lock_dir: Path | None = None,
    multiturn: MultiTurn | None = None,
) -> ShardReport:
    """Generate every sample of one shard that is not stored yet; see the module docstring.

    `tokenized`: rows of schemas.TOKENIZED_PROMPTS as a DataFrame, or a Path to the shard's
    Parquet file / folder (streamed: memory stays flat however large the shard).
    `out_dir`: a local Path or a storage.DataPath (object storage); `lock_dir`: where the shard's lock
    file goes when `out_dir` is not local (required then: the caller passes the work dir's `locks/`; no global fallback).
    """
    return _run(
        lambda: generate_shard_async(
            tokenized,
            out_dir,
            config,
            progress=progress,
            progress_every_s=progress_every_s,
            lock_dir=lock_dir,
            multiturn=multiturn,
        )
    )
