"""The generation engine's parts, each one concept: what to send next, whether it may be sent,
how one request is made, and how its outcome is recorded; `run_worker` puts them in a loop.

The state the workers share is passed explicitly: `EngineContext` (what every request needs, read
only but for the stats), `RequestSource`, `OutcomeRecorder` and the `ChunkFlusher` (flush.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from .answer_checks import NAN_FINISH, Sent, answer_weight_versions, judge_outcome
from .client import Outcome, RetryPolicy, Transport, generate_one
from .config import GenerationConfig
from .context_fit import CONTEXT_OVERFLOW, ContextBudget
from .drafter import unread_spec_keys
from .endpoint_info import safe_message
from .endpoints import EndpointPool
from .flush import ChunkFlusher
from .inputs import input_problem
from .items import WorkItem
from .multiturn import TurnAnswer
from .report import RunStats
from .rows import SampleRow, error_row, result_row
from .sse import StreamMode

log = logging.getLogger(__name__)


def retry_policy(config: GenerationConfig) -> RetryPolicy:
    return RetryPolicy(
        read_timeout_s=config.read_timeout_s,
        connect_timeout_s=config.connect_timeout_s,
        max_retries=config.max_retries,
        backoff_base_s=config.backoff_base_s,
        backoff_max_s=config.backoff_max_s,
        unroutable_wait_s=config.wait_for_endpoint_s,
        deadline_s=config.request_deadline_s,
    )


class TurnQueue(Protocol):
    """What the engine needs of the multi-turn driver (multiturn.TurnDriver)."""

    @property
    def busy(self) -> bool: ...

    def take(self) -> WorkItem | None: ...

    async def wait(self) -> None: ...

    def failed(self, item: WorkItem, reason: str) -> None: ...

    def done(self, item: WorkItem, answer: TurnAnswer) -> None: ...


@dataclass
class WeightPin:
    """The shard's weight_version: every answer is checked against it; None until known (then the
    first answer's becomes it)."""

    value: str | None = None

    @classmethod
    def of(cls, revision: str, *, pinned: bool) -> WeightPin:
        # the revision was read as "model_path@weight_version"; a pinned revision does not say it
        return cls(revision.rsplit("@", 1)[1] if "@" in revision and not pinned else None)

    def note(self, response: dict[str, Any] | None) -> None:
        if response is not None and self.value is None:
            self.value = next(iter(answer_weight_versions(response)), None)


@dataclass
class EngineContext:
    """What every request of a shard's run needs."""

    config: GenerationConfig
    pool: EndpointPool
    headers: dict[str, str]
    sampling: dict[str, Any]
    budget: ContextBudget
    server_context: int | None
    revision: str
    s_hash: str
    run_nonce: str
    stream: StreamMode | None
    stats: RunStats
    shard: str
    policy: RetryPolicy
    weight: WeightPin = field(default_factory=WeightPin)
    in_flight: dict[str, str] = field(default_factory=dict)  # rid -> endpoint URL: aborted when the run stops

    @property
    def api_key(self) -> str:
        return self.headers.get("Authorization", "").removeprefix("Bearer ")


class RequestSource:
    """What to send next, each item to exactly one worker: a conversation's next turn first (keeps
    conversations moving), else the next prompt; when only turns in flight are left, it waits for one
    of them so the window stays full across rounds."""

    def __init__(self, items: Iterator[WorkItem], turns: TurnQueue | None = None) -> None:
        self._items = items
        self._turns = turns

    async def next(self) -> WorkItem | None:
        while True:
            if self._turns is not None and (turn := self._turns.take()) is not None:
                return turn
            item = next(self._items, None)
            if item is not None or self._turns is None or not self._turns.busy:
                return item
            await self._turns.wait()


@dataclass(frozen=True)
class Admission:
    """Whether a prompt is sent, and with which sampling params (fitted to the context, or as configured)."""

    sampling: dict[str, Any]
    problem: str | None = None
    detail: str = ""
    over_budget: bool = False  # refused because prompt + max_new_tokens cannot fit the context


def admit(
    ids: Any,
    *,
    turn: bool,
    sampling: dict[str, Any],
    vocab_size: int | None,
    server_context: int | None,
    budget: ContextBudget,
) -> Admission:
    """The gate before sending: a prompt the server would refuse is not sent; one whose answer could
    run past the context is fitted (fewer max_new_tokens) or skipped. Turns keep the full budget."""
    problem, detail = input_problem(ids, vocab_size, server_context)
    if problem is not None:
        return Admission(sampling, problem, detail)
    if turn or not budget.overflows(len(ids)):
        return Admission(sampling)
    if budget.fits(len(ids)):
        return Admission(budget.params_for(len(ids)))
    return Admission(sampling, CONTEXT_OVERFLOW, budget.skip_detail(len(ids)), over_budget=True)


def count_answer(stats: RunStats, response: dict[str, Any], latency_s: float, row: SampleRow) -> None:
    """An accepted answer in the run's figures (a turn is not a sample: the driver counts those)."""
    if row.turn is None:
        stats.succeeded += 1
    stats.latencies.append(latency_s)
    stats.finish[row.finish_reason or "unknown"] += 1
    stats.output_tokens += len(response.get("output_ids") or ())
    stats.prompt_tokens += row.prompt_tokens or 0
    stats.cached_tokens += row.cached_tokens or 0
    fr = (response.get("meta_info") or {}).get("finish_reason")
    if isinstance(fr, dict) and fr.get("matched") == NAN_FINISH:
        stats.nan_finishes += 1
    if any(v.startswith("length_capped_by_server") for v in row.integrity_violations):
        stats.server_capped_length += 1
    if row.integrity_violations:
        stats.integrity_violations += 1


class OutcomeRecorder:
    """Every item ends here exactly once: a stored row, or an error row with its reason, and the counts."""

    def __init__(self, ctx: EngineContext, flusher: ChunkFlusher, turns: TurnQueue | None) -> None:
        self._ctx = ctx
        self._flusher = flusher
        self._turns = turns

    def refuse(self, item: WorkItem, reason: str, status: int | None, detail: str) -> None:
        self._flusher.errors.append(error_row(item, reason, status, detail))
        self._ctx.stats.errors[reason] += 1
        if item.is_turn and self._turns is not None:
            self._turns.failed(item, reason or "unknown")  # the conversation ends there (counted by reason)
        else:
            self._ctx.stats.failed += 1

    def failed(self, item: WorkItem, o: Outcome) -> None:
        detail = o.detail
        if o.reason == "server_error_body":
            detail = safe_message(o.detail, secrets=(self._ctx.api_key,))
            if self._ctx.stats.errors[o.reason] < 3:
                log.warning(
                    "shard %s: %s answered 200 without a result: %s",
                    self._ctx.shard,
                    o.endpoint or "the server",
                    detail,
                )
        self.refuse(item, o.reason, o.status, detail)

    def accept(self, item: WorkItem, o: Outcome, flags: list[str] | None) -> None:
        ctx = self._ctx
        served = ctx.pool.served(o.endpoint, o.worker)
        row = result_row(o, item, model_revision=ctx.revision, s_hash=ctx.s_hash, violations=flags or [], served=served)
        unread = unread_spec_keys((o.response or {}).get("meta_info") or {}, served.drafter)
        if unread is not None and served.drafter is not None:
            ctx.stats.spec_names.note(served.worker or o.endpoint, served.version, served.drafter, unread)
        self._flusher.rows.append(row)
        count_answer(ctx.stats, o.response or {}, o.latency_s, row)
        if row.integrity_violations:
            log.warning("integrity violation in %s: %s", item.sample_id, row.integrity_violations)
        if item.is_turn and self._turns is not None:  # queues this conversation's next turn
            self._turns.done(item, TurnAnswer(row.output_ids, row.finish_reason, row.integrity_violations))


async def send(
    ctx: EngineContext, client: httpx.AsyncClient, item: WorkItem, sampling: dict[str, Any]
) -> tuple[Outcome, list[str] | None]:
    """One item to a judged outcome and its flags: sent (with retries), then its answer checked
    against what was sent."""
    c = ctx.config
    o = await generate_one(
        Transport(ctx.pool, client, ctx.headers, ctx.stats, ctx.stream),
        input_ids=item.input_ids,
        sampling=sampling,
        rid_base=f"{item.sample_id}-{ctx.run_nonce}",
        policy=ctx.policy,
        in_flight=ctx.in_flight,
    )
    sent = Sent(
        item.input_ids,
        o.rid,
        max_new_tokens=int(sampling["max_new_tokens"]),
        vocab_size=c.vocab_size,
        weight_version=ctx.weight.value,
        revision=ctx.revision,
        stop_ids=frozenset(c.stop_token_ids),
        waited_s=o.latency_s,
    )
    o, flags = judge_outcome(o, sent, shard=ctx.shard, seen=ctx.stats.errors)
    ctx.weight.note(o.response)
    return o, flags


async def serve(ctx: EngineContext, recorder: OutcomeRecorder, client: httpx.AsyncClient, item: WorkItem) -> None:
    """One item through the gate, the server and the checks, into the recorder."""
    a = admit(
        item.input_ids,
        turn=item.is_turn,
        sampling=ctx.sampling,
        vocab_size=ctx.config.vocab_size,
        server_context=ctx.server_context,
        budget=ctx.budget,
    )
    if a.problem is not None:
        ctx.stats.context_overflow_skipped += a.over_budget
        recorder.refuse(item, a.problem, None, a.detail)
        return
    ctx.stats.context_fitted += a.sampling is not ctx.sampling
    o, flags = await send(ctx, client, item, a.sampling)
    if o.response is None:
        recorder.failed(item, o)
    else:
        recorder.accept(item, o, flags)


async def run_worker(
    ctx: EngineContext,
    source: RequestSource,
    recorder: OutcomeRecorder,
    flusher: ChunkFlusher,
    client: httpx.AsyncClient,
) -> None:
    """One worker: items one at a time until the source is empty; a full buffer is flushed by its filler."""
    every_n = ctx.config.flush_every_n
    while (item := await source.next()) is not None:
        await serve(ctx, recorder, client, item)
        if len(flusher.rows) >= every_n:
            await flusher.flush(min_rows=every_n)
