"""The generation engine's parts alone, without a server: the gate before sending, the request source's
order, the weight-version pin, the outcome recorder's counts and the chunk flusher's writes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from eagle3_dagster.generate.client import Outcome
from eagle3_dagster.generate.config import params_hash
from eagle3_dagster.generate.context_fit import CONTEXT_OVERFLOW, ContextBudget
from eagle3_dagster.generate.endpoint_info import Served
from eagle3_dagster.generate.engine import (
    OutcomeRecorder,
    RequestSource,
    WeightPin,
    admit,
    count_answer,
)
from eagle3_dagster.generate.flush import ChunkFlusher, split_turn_rows
from eagle3_dagster.generate.items import Turn, WorkItem
from eagle3_dagster.generate.multiturn import TurnAnswer
from eagle3_dagster.generate.report import RunStats
from eagle3_dagster.generate.rows import ErrorRow, result_row

PARAMS = {"max_new_tokens": 24, "min_new_tokens": 0, "temperature": 0.0}


def budget(mode: str, context: int | None = 200) -> ContextBudget:
    return ContextBudget(mode, context, PARAMS, params_hash(PARAMS))


def gate(ids: Any, mode: str = "fit", *, turn: bool = False, vocab: int | None = 1000) -> Any:
    return admit(ids, turn=turn, sampling=PARAMS, vocab_size=vocab, server_context=200, budget=budget(mode))


# -- the gate -------------------------------------------------------------------------------------


def test_a_prompt_within_the_context_is_sent_with_the_configured_params() -> None:
    a = gate(list(range(176)))  # 176 + 24 == 200: exactly the context
    assert a.problem is None and a.sampling is PARAMS


def test_an_out_of_vocab_or_empty_prompt_is_refused_before_sending() -> None:
    assert gate([5, 1000]).problem == "input_id_out_of_vocab"
    assert gate([]).problem == "empty_input_ids"
    assert not gate([]).over_budget


def test_a_prompt_over_the_budget_is_fitted_in_fit_mode() -> None:
    a = gate(list(range(190)))
    assert a.problem is None
    assert a.sampling["max_new_tokens"] == 10 and a.sampling is not PARAMS


def test_a_prompt_over_the_budget_is_skipped_in_skip_mode_and_says_why() -> None:
    a = gate(list(range(190)), "skip")
    assert a.problem == CONTEXT_OVERFLOW and a.over_budget
    assert "190 tokens + max_new_tokens 24 = 214 > the server's context length 200" in a.detail


def test_a_conversation_turn_keeps_the_full_budget() -> None:
    a = gate(list(range(190)), "skip", turn=True)
    assert a.problem is None and a.sampling is PARAMS


# -- the request source ---------------------------------------------------------------------------


def item(sample_id: str, turn_index: int | None = None) -> WorkItem:
    """A prompt's sample, or with a turn index a conversation's turn."""
    turn = None if turn_index is None else Turn("c", turn_index, "[]", None)
    return WorkItem(sample_id, "p", [1, 2, 3], turn=turn)


class FakeTurns:
    """A driver whose one conversation has a turn in flight that comes back after the prompts."""

    def __init__(self) -> None:
        self.ready: list[WorkItem] = [item("t0", 1)]
        self.busy = True
        self.waits = 0

    def take(self) -> WorkItem | None:
        return self.ready.pop(0) if self.ready else None

    async def wait(self) -> None:
        self.waits += 1
        self.ready.append(item("t1", 2))
        self.busy = False


def test_request_source_gives_turns_first_then_prompts_then_waits_for_turns_in_flight() -> None:
    turns = FakeTurns()
    source = RequestSource(iter([item("p0"), item("p1")]), turns)  # type: ignore[arg-type]

    async def drain() -> list[str]:
        got = []
        while (next_item := await source.next()) is not None:
            got.append(next_item.sample_id)
        return got

    assert asyncio.run(drain()) == ["t0", "p0", "p1", "t1"]
    assert turns.waits == 1


def test_request_source_without_turns_ends_with_its_items() -> None:
    source = RequestSource(iter([item("p0")]))
    assert asyncio.run(source.next()) == item("p0")
    assert asyncio.run(source.next()) is None


# -- the weight version pin -----------------------------------------------------------------------


def test_weight_pin_comes_from_the_revision_or_the_first_answer() -> None:
    assert WeightPin.of("org/model@v7", pinned=False).value == "v7"
    assert WeightPin.of("org/model@v7", pinned=True).value is None  # a pinned revision does not say it
    pin = WeightPin.of("org/model", pinned=False)
    pin.note(None)
    assert pin.value is None
    pin.note({"meta_info": {"weight_version": "w2"}})
    pin.note({"meta_info": {"weight_version": "w3"}})
    assert pin.value == "w2"


# -- counts and the recorder ----------------------------------------------------------------------


def answer(finish: dict[str, Any], ids: list[int]) -> Outcome:
    return Outcome({"output_ids": ids, "meta_info": {"finish_reason": finish}}, "ep", "rid-0", 0.5)


def test_count_answer_counts_a_sample_and_its_flags_but_not_a_turn_as_a_sample() -> None:
    stats = RunStats(total=2)
    o = answer({"type": "stop", "matched": "NaN happened"}, [1, 2, 3])
    assert o.response is not None
    o.response["meta_info"].update(prompt_tokens=7, cached_tokens=3)
    flags = ["x", "length_capped_by_server: 5"]
    count_answer(
        stats, o.response, o.latency_s, result_row(o, item("s"), model_revision="m", s_hash="h", violations=flags)
    )
    count_answer(
        stats, o.response, o.latency_s, result_row(o, item("t", 1), model_revision="m", s_hash="h", violations=["x"])
    )
    assert stats.succeeded == 1
    assert (stats.output_tokens, stats.prompt_tokens, stats.cached_tokens) == (6, 14, 6)
    assert (stats.nan_finishes, stats.server_capped_length, stats.integrity_violations) == (2, 1, 2)
    assert stats.finish["stop"] == 2 and len(stats.latencies) == 2


class FakeFlushTurns:
    def __init__(self) -> None:
        self.failed_with: list[str] = []
        self.answered: list[tuple[str, TurnAnswer]] = []

    def failed(self, item: WorkItem, reason: str) -> None:
        self.failed_with.append(reason)

    def done(self, item: WorkItem, answer: TurnAnswer) -> None:
        self.answered.append((item.sample_id, answer))


def recorder(turns: FakeFlushTurns | None = None) -> tuple[OutcomeRecorder, Any, ChunkFlusher]:
    ctx = SimpleNamespace(
        stats=RunStats(total=3),
        shard="shard=0000",
        headers={"Authorization": "Bearer sk-secret"},
        api_key="sk-secret",
        revision="m@v1",
        s_hash="h",
        pool=SimpleNamespace(served=lambda name, worker: Served(name, "0.5.23", None)),
    )
    flusher = ChunkFlusher(FakeStore(), FakeStore(), [])
    return OutcomeRecorder(ctx, flusher, turns), ctx, flusher  # type: ignore[arg-type]


def test_recorder_refusal_is_an_error_row_and_a_failed_sample_or_an_ended_conversation() -> None:
    turns = FakeFlushTurns()
    rec, ctx, flusher = recorder(turns)
    rec.refuse(item("s"), "http_400", 400, "bad")
    rec.refuse(item("t", 2), "context_overflow", None, "long")
    assert [e.reason for e in flusher.errors] == ["http_400", "context_overflow"]
    assert ctx.stats.failed == 1 and turns.failed_with == ["context_overflow"]
    assert ctx.stats.errors == {"http_400": 1, "context_overflow": 1}


def test_recorder_redacts_the_api_key_from_a_server_error_body() -> None:
    rec, _, flusher = recorder()
    o = Outcome(None, "ep", "rid", 0.0, reason="server_error_body", status=200, detail="key sk-secret refused")
    rec.failed(item("s"), o)
    assert "sk-secret" not in flusher.errors[0].detail


def test_recorder_accepts_an_answer_into_the_buffer_and_hands_a_turn_to_the_driver() -> None:
    turns = FakeFlushTurns()
    rec, ctx, flusher = recorder(turns)
    o = answer({"type": "stop"}, [1, 2])
    rec.accept(item("s"), o, None)
    rec.accept(item("t", 1), o, ["flag"])
    rows = [r.as_row() for r in flusher.rows]
    assert [r["sample_id"] for r in rows] == ["s", "t"]
    assert rows[0]["worker"] == o.endpoint and rows[0]["sglang_version"] == "0.5.23"
    assert "turn_index" not in rows[0]
    assert rows[1]["turn_index"] == 1 and rows[1]["integrity_violations"] == ["flag"]
    assert rows[1]["conversation_id"] == "c" and rows[1]["prompt_ids"] == [1, 2, 3]
    assert turns.answered == [("t", TurnAnswer([1, 2], "stop", ["flag"]))]
    assert ctx.stats.succeeded == 1  # the turn is counted by the driver


# -- the chunk flusher ----------------------------------------------------------------------------


class FakeStore:
    def __init__(self) -> None:
        self.chunks: list[list[dict[str, Any]]] = []
        self.error_writes: list[list[dict[str, Any]]] = []

    def write_chunk(self, rows: list[dict[str, Any]]) -> None:
        self.chunks.append(rows)

    def write_errors(self, rows: list[dict[str, Any]]) -> None:
        self.error_writes.append(rows)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def row(sample_id: str, turn_index: int | None = None) -> Any:
    return result_row(
        answer({"type": "stop"}, [7]), item(sample_id, turn_index), model_revision="m", s_hash="h", violations=[]
    )


def test_split_turn_rows_keeps_the_order_within_each_kind() -> None:
    rows = [row("1"), row("2", 1), row("3")]
    assert split_turn_rows(rows) == ([rows[0], rows[2]], [rows[1]])


def test_flusher_writes_samples_and_turns_to_their_stores_and_errors_only_when_asked() -> None:
    store, turns = FakeStore(), FakeStore()
    carried = ErrorRow("carried", "p", 0, "http_400", 400, "bad")
    f = ChunkFlusher(store, turns, [carried])
    f.rows += [row("1"), row("2", 1)]
    asyncio.run(f.flush())
    assert [[r["sample_id"] for r in c] for c in store.chunks] == [["1"]]
    assert [[(r["sample_id"], r["turn_index"]) for r in c] for c in turns.chunks] == [[("2", 1)]]
    assert store.error_writes == [] and f.rows == []
    asyncio.run(f.flush(with_errors=True))  # the carried errors were never written
    asyncio.run(f.flush(with_errors=True))  # nothing new since
    assert store.error_writes == [[carried.as_row()]]
    asyncio.run(f.flush(force_errors=True))
    assert len(store.error_writes) == 2 and len(store.chunks) == 1


def test_flusher_below_min_rows_writes_nothing() -> None:
    store = FakeStore()
    f = ChunkFlusher(store, None, [])
    f.rows.append(row("1"))
    asyncio.run(f.flush(min_rows=2))
    assert store.chunks == [] and len(f.rows) == 1


def test_flusher_due_after_the_interval_since_the_last_write() -> None:
    clock = Clock()
    f = ChunkFlusher(FakeStore(), None, [], clock=clock)
    assert f.due(5.0) == (False, False)
    f.rows.append(row("1"))
    f.errors.append(ErrorRow("e", "p", 0, "http_400", 400, "bad"))
    clock.now += 4.0
    assert f.due(5.0) == (False, False)
    clock.now += 1.0
    assert f.due(5.0) == (True, True)
    asyncio.run(f.flush(with_errors=True))
    assert f.due(5.0) == (False, False)


# -- the run's set-up -----------------------------------------------------------------------------


def test_window_is_the_configured_or_the_servers_and_never_more_than_the_work() -> None:
    from eagle3_dagster.generate.report import ShardReport
    from eagle3_dagster.generate.shard import _window

    pool = SimpleNamespace(max_in_flight=lambda headroom: 48)
    cfg = SimpleNamespace(max_in_flight=None, in_flight_headroom=1.0)
    rep = ShardReport()
    assert _window(rep, cfg, pool, pending=100) == 48 and rep.in_flight_source == "server_info"  # type: ignore[arg-type]
    assert _window(rep, cfg, pool, pending=5) == 5  # type: ignore[arg-type]
    assert _window(rep, cfg, pool, pending=0) == 1  # type: ignore[arg-type]
    fixed = SimpleNamespace(max_in_flight=8, in_flight_headroom=1.0)
    assert _window(rep, fixed, pool, pending=100) == 8 and rep.in_flight_source == "config"  # type: ignore[arg-type]
    assert rep.max_in_flight == 8


def test_workers_are_spread_over_small_http_pools() -> None:
    from eagle3_dagster.generate.shard import _HttpClients

    async def spread() -> tuple[int, bool, bool]:
        http = _HttpClients()
        http.spread(n_workers=10, per_client=4)
        pools = len(http.all)
        same = http.for_worker(0) is http.for_worker(3)
        apart = http.for_worker(0) is not http.for_worker(1)
        await http.close()
        return pools, same, apart

    assert asyncio.run(spread()) == (3, True, True)


def test_a_stored_row_has_exactly_its_tables_columns() -> None:
    """The typed row becomes its table's row at the write: every column, none that the table lacks (a row dict
    short of a column would be written with a silent null, a typo'd key silently dropped)."""
    from eagle3_dagster.schemas import GENERATION_ERRORS, GENERATIONS, TURN_GENERATIONS

    assert set(row("s").as_row()) == set(GENERATIONS.names)
    assert set(row("t", 1).as_row()) == set(TURN_GENERATIONS.names)
    assert set(ErrorRow("e", "p", 0, "http_400", 400, "bad").as_row()) == set(GENERATION_ERRORS.names)
