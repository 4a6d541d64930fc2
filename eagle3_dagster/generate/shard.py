"""generate_shard: tokenized prompts of one shard -> stored generations, resumable and exact.

Flow: lock the shard store -> probe endpoints (revision, max_running_requests) -> compute
sample_ids, drop duplicates and the ones already stored (inputs.py) -> N workers, each one
sample at a time, feed an in-memory buffer -> the buffer is flushed as an atomic chunk every
`flush_every_n` samples or `flush_every_s` seconds -> errors.parquet -> compaction of the chunks
when more than `compact_after_chunks` exist (store.py) -> ShardReport.
Results are never accumulated in memory; pass the tokenized shard as a Path to stream it too.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import certifi
import httpx
import polars as pl

from .. import stopping
from ..schemas import TURN_GENERATIONS
from ..storage import as_data_path
from .answer_checks import NAN_FINISH, Sent, answer_weight_versions, judge_outcome
from .cached_only import any_endpoint_answers, cached_only_report
from .client import StreamMode, abort_rid, generate_one
from .config import GenerationConfig, sampling_hash, sampling_params
from .context_fit import CONTEXT_OVERFLOW, ContextBudget
from .drafter import serving_drafter
from .endpoint_info import safe_message
from .endpoints import EndpointPool
from .inputs import TokenizedSource, input_problem, iter_pending, plan_shard, stored_keys
from .multiturn import MultiTurn, TurnDriver, stored_turns, turns_dir
from .probes import ProbeKeys, fleet_drafter_key
from .report import ProgressReport, RunStats, ShardReport, failures_by_reason, progress_line
from .requeue import requeue_quarantined
from .retried import PreviousFailures, write_retried
from .rows import error_row, is_permanent_reason, result_row
from .store import ShardStore, StoreDir, StoreWriteError, read_generation_errors, stored_sample_ids

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
    turn_store = (
        ShardStore(turns_dir(out_dir), write_retries=config.write_retries, lock_dir=lock_dir, schema=TURN_GENERATIONS)
        if multiturn is not None and multiturn.conversations
        else None
    )
    driver: TurnDriver | None = None
    headers = _auth_headers(config)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=4.0)
    # One TLS context for every pool: building one loads the CA bundle (~25 ms), per client it adds up.
    tls = ssl.create_default_context(cafile=certifi.where())

    def new_client() -> httpx.AsyncClient:
        return httpx.AsyncClient(limits=limits, http1=True, http2=False, trust_env=False, verify=tls)

    client = new_client()  # probes + the first workers
    clients = [client]
    sp = sampling_params(config)
    pool = EndpointPool(
        config.endpoints,
        client,
        headers,
        health_timeout_s=config.health_timeout_s,
        health_interval_s=config.health_interval_s,
        probe_interval_s=config.probe_interval_s,
        breaker_threshold=config.breaker_threshold,
        wait_for_endpoint_s=config.wait_for_endpoint_s,
        cooldown_base_s=config.breaker_cooldown_s,
        cooldown_max_s=max(config.backoff_max_s, config.breaker_cooldown_s),
        allow_old_server=config.allow_old_server,
        sent_sampling_keys=frozenset(sp),
        wait_record=config.endpoint_wait,
    )
    api_key = headers.get("Authorization", "").removeprefix("Bearer ")
    in_flight: dict[str, str] = {}  # rid -> endpoint URL: aborted best effort when the run is stopped
    report = ShardReport()
    bg: list[asyncio.Task[Any]] = []
    try:
        store.open()  # the shard's lock first: a second process on the same shard stops here
        if turn_store is not None:
            turn_store.open()
        if not await any_endpoint_answers(client, headers, config.endpoints, config.health_timeout_s):
            cached = await asyncio.to_thread(
                cached_only_report, tokenized, out_dir, config, has_turns=turn_store is not None
            )
            if cached is not None:  # nothing to send: the dead endpoint is not waited for
                return cached
        await pool.start(configured_revision=config.model_revision)
        revision = pool.model_revision or "unknown"
        s_hash = sampling_hash(config)
        report.model_revision = revision
        report.sampling_hash = s_hash
        report.drafter_key = fleet_drafter_key(ep.drafter for ep in pool.endpoints if ep.server_info and not ep.refused)
        probes = ProbeKeys(frozenset(config.probe_sources), report.drafter_key, config.probe_seed)
        report.preferred_sampling_params = {
            ep.name: ep.preferred_sampling_params for ep in pool.endpoints if ep.preferred_sampling_params
        }
        server_context = pool.context_length()  # None: some endpoint does not report it (nothing is skipped)
        report.server_context_length = server_context
        budget = ContextBudget.of(config, server_context)  # prompt + max_new_tokens over it: fit or skip
        report.context_overflow = config.context_overflow
        report.server_versions = {ep.name: ep.server_version for ep in pool.endpoints if ep.server_version}
        report.streamed = config.stream
        # weight_version the revision was read with ("model_path@weight_version"): every one an answer names matches it
        # (a pinned revision: the first answer's weight_version is the shard's)
        wv_box: list[str] = [revision.rsplit("@", 1)[1]] if "@" in revision and not config.model_revision else []
        stream_mode = (
            StreamMode(
                first_chunk_timeout_s=config.first_chunk_timeout_s,
                stall_timeout_s=config.stall_timeout_s,
                stream_interval=config.effective_stream_interval(),
            )
            if config.stream
            else None
        )

        # A permanent failure of an earlier run (a 400, a bad prompt) is not sent again: the same
        # request would fail the same way. It stays in errors.parquet and counts as failed.
        prior = read_generation_errors(out_dir)
        prior_all = prior  # what this run sends again is reported as came back / failed again (retried.py)
        if config.retry_permanent_errors or prior.height == 0:
            prior = prior.clear()
        else:
            prior = prior.filter(pl.col("reason").map_elements(is_permanent_reason, return_dtype=pl.Boolean))
        # quarantined answers a fixed server would answer differently: out of the store, so sent again below
        requeued = await asyncio.to_thread(requeue_quarantined, store)
        report.quarantined_retried = len(requeued)
        plan = await asyncio.to_thread(
            plan_shard,
            tokenized,
            model_revision=revision,
            s_hash=s_hash,
            regen_seed=config.regen_seed,
            stored=stored_keys(out_dir),
            skip_ids=frozenset(prior.get_column("sample_id").to_list()),
            exclude_prompt_ids=multiturn.conversation_ids if multiturn is not None else frozenset(),
            row_hash=budget.hash_for if server_context is not None else None,
            probes=probes,
        )
        if multiturn is not None and multiturn.conversations:
            driver = multiturn.driver(
                stored=await asyncio.to_thread(stored_turns, out_dir),
                model_revision=revision,
                s_hash=s_hash,
                regen_seed=config.regen_seed,
            )
            await asyncio.to_thread(driver.start)  # replays the stored turns: an unchanged night sends nothing
            log.info(
                "shard %s: %d all_turns conversations, %d turns planned, %d stored already, %d to send next",
                out_dir.name,
                driver.stats.conversations,
                driver.stats.turns_planned,
                driver.stats.turns_cached,
                len(driver.ready),
            )
        carried = prior.filter(pl.col("sample_id").is_in(plan.carried_ids)).unique("sample_id", keep="last")
        previous = PreviousFailures.from_errors(prior_all, carried.get_column("sample_id").to_list())
        previous = PreviousFailures({**previous.reasons, **requeued})
        write_retried(out_dir, "", {})  # a run that does not finish leaves no outcome of an earlier one
        report.requested = plan.requested
        report.duplicates_in_input = plan.rows - plan.excluded - plan.requested
        report.skipped_cached = plan.skipped_cached
        stats = RunStats(total=plan.pending, cached=plan.skipped_cached)
        report.carried_failed = carried.height
        log.info(
            "shard %s: %d requested, %d already stored, %d failed permanently before, %d to generate (revision %s)",
            out_dir.name,
            report.requested,
            report.skipped_cached,
            carried.height,
            plan.pending,
            revision,
        )

        n_workers = config.max_in_flight or pool.max_in_flight(config.in_flight_headroom)
        report.in_flight_source = "config" if config.max_in_flight else "server_info"
        n_workers = max(1, min(n_workers, plan.pending + (driver.pending if driver is not None else 0)))
        report.max_in_flight = n_workers
        run_nonce = secrets.token_hex(3)  # rids of this run never equal a killed run's still-running rids

        buffer: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = carried.to_dicts()
        errors_written = -1
        last_flush = last_errors_write = time.monotonic()
        write_lock = asyncio.Lock()
        fatal: list[BaseException] = []

        async def flush(*, min_rows: int = 1, with_errors: bool = False, force_errors: bool = False) -> None:
            """Write the buffer as one chunk; errors.parquet (rewritten whole) only on the timer and at the end."""
            nonlocal buffer, last_flush, errors_written, last_errors_write
            async with write_lock:
                errors_due = force_errors or (with_errors and len(errors) != errors_written)
                if len(buffer) < min_rows and not errors_due:
                    return  # another worker flushed while we waited for the lock
                rows, buffer = buffer, []
                last_flush = time.monotonic()
                if rows:
                    turn_rows = [r for r in rows if "turn_index" in r]
                    if turn_rows:
                        rows = [r for r in rows if "turn_index" not in r]
                        assert turn_store is not None
                        await asyncio.to_thread(turn_store.write_chunk, turn_rows)
                    if rows:
                        await asyncio.to_thread(store.write_chunk, rows)
                if errors_due:
                    snapshot = list(errors)
                    await asyncio.to_thread(store.write_errors, snapshot)
                    errors_written = len(snapshot)
                    last_errors_write = time.monotonic()

        # httpcore scans its whole pool for every request (O(connections)): with hundreds in flight
        # that scan costs more than the HTTP work, so workers are spread over small pools.
        per = max(1, config.connections_per_client)
        while len(clients) * per < n_workers:
            clients.append(new_client())

        items = iter_pending(
            tokenized,
            plan,
            model_revision=revision,
            s_hash=s_hash,
            regen_seed=config.regen_seed,
            row_hash=budget.hash_for if server_context is not None else None,
            probes=probes,
        )

        async def next_item() -> dict[str, Any] | None:
            """A conversation's next turn first (keeps conversations moving), else the next prompt; when
            only turns in flight are left, wait for one of them: the window stays full across rounds."""
            while True:
                if driver is not None and (turn := driver.take()) is not None:
                    return turn
                item = next(items, None)  # one shared iterator: each sample is taken by exactly one worker
                if item is not None or driver is None or not driver.busy:
                    return item
                await driver.wait()

        def count_failure(item: dict[str, Any], reason: str) -> None:
            if "turn_index" in item and driver is not None:
                driver.failed(item, reason)  # the conversation ends there (counted by reason)
            else:
                stats.failed += 1

        async def worker(wclient: httpx.AsyncClient) -> None:
            while (item := await next_item()) is not None:
                ids = item["input_ids"]
                problem, detail = input_problem(ids, config.vocab_size, server_context)
                row_sp = sp
                if problem is None and "turn_index" not in item and budget.overflows(len(ids)):  # turns: full budget
                    if budget.fits(len(ids)):
                        row_sp = budget.params_for(len(ids))
                    else:
                        problem, detail = CONTEXT_OVERFLOW, budget.skip_detail(len(ids))
                        stats.context_overflow_skipped += 1
                if problem is not None:
                    errors.append(error_row(item, problem, None, detail))
                    stats.errors[problem] += 1
                    count_failure(item, problem)
                    continue
                stats.context_fitted += row_sp is not sp
                o = await generate_one(
                    pool=pool,
                    client=wclient,
                    headers=headers,
                    input_ids=ids,
                    sampling=row_sp,
                    rid_base=f"{item['sample_id']}-{run_nonce}",
                    read_timeout_s=config.read_timeout_s,
                    connect_timeout_s=config.connect_timeout_s,
                    max_retries=config.max_retries,
                    backoff_base_s=config.backoff_base_s,
                    backoff_max_s=config.backoff_max_s,
                    stats=stats,
                    stream=stream_mode,
                    unroutable_wait_s=config.wait_for_endpoint_s,
                    in_flight=in_flight,
                )
                sent = Sent(
                    ids,
                    o.rid,
                    max_new_tokens=int(row_sp["max_new_tokens"]),
                    vocab_size=config.vocab_size,
                    weight_version=wv_box[0] if wv_box else None,
                    revision=revision,
                )
                o, flags = judge_outcome(o, sent, shard=out_dir.name, seen=stats.errors)
                if o.response is not None and not wv_box:
                    wv_box.extend(answer_weight_versions(o.response)[:1])
                if o.response is None:
                    detail = o.detail
                    if o.reason == "server_error_body":
                        detail = safe_message(o.detail, secrets=(api_key,))
                        if stats.errors[o.reason] < 3:
                            log.warning(
                                "shard %s: %s answered 200 without a result: %s",
                                out_dir.name,
                                o.endpoint or "the server",
                                detail,
                            )
                    errors.append(error_row(item, o.reason, o.status, detail))
                    stats.errors[o.reason] += 1
                    count_failure(item, o.reason or "unknown")
                else:
                    viol = flags or []
                    row = result_row(
                        o,
                        item,
                        model_revision=revision,
                        s_hash=s_hash,
                        violations=viol,
                        drafter=serving_drafter(pool.endpoints, o.endpoint),
                    )
                    if "turn_index" in item and driver is not None:
                        row.update(driver.row_extras(item))
                    buffer.append(row)
                    if "turn_index" not in item:
                        stats.succeeded += 1
                    stats.latencies.append(o.latency_s)
                    stats.finish[row["finish_reason"] or "unknown"] += 1
                    stats.output_tokens += len(o.response.get("output_ids") or ())
                    stats.prompt_tokens += row["prompt_tokens"] or 0
                    stats.cached_tokens += row["cached_tokens"] or 0
                    fr = (o.response.get("meta_info") or {}).get("finish_reason")
                    if isinstance(fr, dict) and fr.get("matched") == NAN_FINISH:
                        stats.nan_finishes += 1
                    if any(v.startswith("length_capped_by_server") for v in viol):
                        stats.server_capped_length += 1
                    if row["integrity_violations"]:
                        stats.integrity_violations += 1
                        log.warning("integrity violation in %s: %s", item["sample_id"], row["integrity_violations"])
                    if driver is not None and "turn_index" in item:
                        driver.done(item, row)  # queues this conversation's next turn
                if len(buffer) >= config.flush_every_n:
                    await flush(min_rows=config.flush_every_n)

        async def timed_flusher() -> None:
            while True:
                await asyncio.sleep(min(1.0, config.flush_every_s))
                now = time.monotonic()
                rows_due = bool(buffer) and now - last_flush >= config.flush_every_s
                errors_due = len(errors) != errors_written and now - last_errors_write >= config.flush_every_s
                if rows_due or errors_due:
                    await flush(with_errors=errors_due)

        async def reporter() -> None:
            while True:
                await asyncio.sleep(progress_every_s)
                if progress is not None:
                    _call_progress(progress, stats.progress())
                else:
                    log.info("%s", progress_line(out_dir.name, stats.progress()))

        bg.append(asyncio.create_task(timed_flusher(), name="flusher"))
        if progress_every_s > 0:
            bg.append(asyncio.create_task(reporter(), name="progress"))
        workers = [asyncio.create_task(worker(clients[i % len(clients)]), name=f"worker-{i}") for i in range(n_workers)]
        try:
            # The first failure (e.g. StoreWriteError, AuthError) cancels everything and is raised.
            await _gather_or_fail(workers, bg, fatal, write_lock)
        except asyncio.CancelledError:
            # Stopped (Ctrl-C, SIGTERM, a Dagster run cancel): tell the servers to drop our requests.
            await _abort_in_flight(client, headers, in_flight)
            raise
        finally:
            # Under the write lock: a flush the timer started finishes its write before the flusher is
            # cancelled (a cancelled to_thread write goes on unseen: the run returned mid-write).
            async with write_lock:
                for t in bg:
                    t.cancel()
            await asyncio.gather(*bg, return_exceptions=True)
            bg.clear()
            if not any(isinstance(e, StoreWriteError) for e in fatal):
                # Samples already answered are kept even when the run fails for another reason.
                await flush(force_errors=True)
        if progress is not None:
            _call_progress(progress, stats.progress())
        stats.fill(report)
        report.failed += carried.height
        for reason in carried.get_column("reason").to_list():
            report.errors_by_kind[reason] = report.errors_by_kind.get(reason, 0) + 1
        report.failure_details = {r: d for r, (_, d) in failures_by_reason(errors).items()}
        if previous.reasons:
            stored_now = await asyncio.to_thread(lambda: stored_sample_ids(out_dir).to_list())
            report.previous_failures = previous.outcome(stored_now, (e["sample_id"] for e in errors))
            write_retried(out_dir, datetime.now(UTC).isoformat(timespec="seconds"), report.previous_failures)
        report.per_endpoint = pool.per_endpoint()
        if driver is not None:
            report.turns = driver.stats.as_dict()
            report.turn_sample_ids = list(driver.active_sample_ids)
            if not driver.stats.reconciles:
                log.error("shard %s: the turn counts do not reconcile: %s", out_dir.name, report.turns)
        report.http_pools = len(clients)
        report.compaction_leftovers_removed = store.compaction_leftovers_removed
        if config.compact_after_chunks is not None:
            # Housekeeping after a complete run (lock held, nothing else writing): a failure here
            # leaves the data as it was (see store.py), so it is reported, not raised.
            try:
                report.chunks_compacted = await asyncio.to_thread(store.compact, config.compact_after_chunks)
            except Exception as e:
                log.warning("shard %s: compaction failed, chunks left as they were: %s", out_dir.name, e)
                report.compaction_error = f"{type(e).__name__}: {e}"[:500]
        report.chunks_written = store.chunks_written
        report.chunk_write_retries = store.write_retries_used
        return report
    finally:
        for t in bg:
            t.cancel()
        await pool.stop()
        for c in clients:
            await c.aclose()
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
