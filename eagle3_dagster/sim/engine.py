"""The simulator's engine: the generation of each item in time.

`Engine.run` queues an item for a GPU slot of the server's state (`Sim`, state.py), prefills, and
decodes it token by token in simulated time (aborts, stalls and latency faults included); its
`Progress` is what answer.py writes SGLang's answer from.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

from . import fleet_faults as FF
from . import protocol as P
from .state import ReqState, Sim


@dataclass
class Progress:
    """Snapshot of one item: its ids so far and, once done, its finish reason."""

    item: P.Item
    plan: P.Plan | None
    produced: list[int]
    finish_reason: dict[str, Any] | None
    cached: int
    started: float
    queued_abort: bool = False
    first_sent: bool = False
    sent_ids: int = 0
    sent_text: str = ""
    sent_produced: int = 0  # tokens already streamed (incremental mode slices the per-token meta_info lists)
    # (weight_version, first token generated under it): SGLang 0.5.23's meta_info.weight_versions spans
    versions: list[tuple[str, int]] = field(default_factory=list)
    spec_fault: str | None = None  # fleet fault spec_inconsistent: how this answer's spec figures are broken
    wire_lie: str | None = None  # fleet faults float_ids, string_ids, ...: how output_ids are written
    spec: Any = None  # the drafter (speculative.SpecConfig) that runs this request: the server's as it starts
    abort_status: int | None = None  # fleet fault abort_status: the status_code of this request's abort
    latency_lie: str | None = None  # fleet fault bad_latency: how its e2e_latency is written
    meta_secret: bool = False  # fleet fault meta_secret: a gateway's Authorization echo in its meta_info


def decode_step(total: int, stream_interval: int | None, streaming: bool, slow: bool) -> int:
    """Tokens decoded between two looks at the clock and the abort flag: the stream interval when
    streaming; else the whole output at once, or 1/64th of it when tokens take time (so a weight
    update mid-request lands between steps)."""
    if streaming:
        return max(1, stream_interval or 1)
    return max(total // 64 if slow else total, 1)


class Engine:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    async def _wait(self, st: ReqState, delay: float) -> bool:
        """Sleep `delay` seconds or until aborted; True if aborted."""
        if st.abort.is_set():
            return True
        if delay <= 0:
            await asyncio.sleep(0)
            return st.abort.is_set()
        try:
            await asyncio.wait_for(st.abort.wait(), delay)
            return True
        except TimeoutError:
            return False

    async def run(self, item: P.Item, stream_interval: int | None, on_chunk: Any = None) -> Progress:
        """Queue for a GPU slot, prefill, decode. `on_chunk(progress)` is awaited per stream step."""
        st, pr = self._admit(item)
        try:
            if not await self._take_slot(st):
                return self._aborted_in_queue(pr)
            plan, stall_at = self._plan(pr)
            await self._decode(st, pr, plan, stall_at, stream_interval, on_chunk)
            return pr
        except asyncio.CancelledError:
            self.sim.stats.client_disconnects += 1
            raise
        finally:
            self._leave(st, pr)

    def _admit(self, item: P.Item) -> tuple[ReqState, Progress]:
        """The item enters the server: in flight, counted, recorded; a truncate_prompt fault cuts it first."""
        sim = self.sim
        cut = min(sim.fleet.take_truncate(), len(item.input_ids) - 1)
        if cut > 0:  # fleet fault truncate_prompt: a gateway dropped the prompt's first ids
            del item.input_ids[:cut]
        st = ReqState(item.rid)
        sim.in_flight[item.rid] = st
        sim.stats.peak_in_flight = max(sim.stats.peak_in_flight, len(sim.in_flight))
        sim.stats.items += 1
        if sim.recorder is not None:
            sim.recorder.record(item.rid, item.input_ids, item.sampling.max_new_tokens)
        t0 = time.time()
        if sim.stats.first_request_at is None:
            sim.stats.first_request_at = t0
        return st, Progress(item, None, [], None, 0, t0)

    async def _take_slot(self, st: ReqState) -> bool:
        """Wait for a GPU slot or an abort; True once the slot is held (`st.slot_since` set)."""
        sim = self.sim
        sim.waiting += 1
        acq = asyncio.ensure_future(sim.slots.acquire())
        ab = asyncio.ensure_future(st.abort.wait())
        try:
            await asyncio.wait({acq, ab}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # also when cancelled: a slot acquired meanwhile is marked held, so _leave gives it back
            sim.waiting -= 1
            ab.cancel()
            if not acq.done():
                acq.cancel()
            elif not acq.cancelled() and acq.exception() is None:
                st.slot_since = time.monotonic()
                sim.slot_acquired()
        return st.slot_since is not None

    def _aborted_in_queue(self, pr: Progress) -> Progress:
        pr.queued_abort = True
        # 0.5.23 TokenizerManager._handle_abort_req: its own two-key literal, not FINISH_ABORT's four
        pr.finish_reason = {"type": "abort", "message": "Abort in waiting queue"}
        if self.sim.version != P.V0_5_23:
            pr.finish_reason.update(status_code=None, err_type=None)
        return pr

    def _plan(self, pr: Progress) -> tuple[P.Plan, int | None]:
        """Match the prefix cache, plan the output with this request's fleet faults; (plan, stall point or None)."""
        sim = self.sim
        item = pr.item
        pr.cached = min(sim.trie.match_and_insert(item.input_ids), len(item.input_ids) - 1)
        plan = P.plan_output(
            sim.model, item, eos_ids=sim.eos_ids, max_req_len=sim.max_req_len, version=sim.version, mode=sim.faults.mode
        )
        sim.fleet.note_request()  # an armed weight-version switch (fleet_faults.py)
        if (path := sim.fleet.take_drafter_switch()) is not None:  # an armed drafter switch
            sim.spec = replace(sim.spec, draft_model_path=path)
        pr.spec = sim.spec
        pr.versions = [(sim.fleet.weight_version, 0)]
        pr.spec_fault = sim.fleet.take_spec_inconsistent()
        plan = self._lying_plan(plan)
        pr.wire_lie = sim.fleet.take_wire_lie()
        pr.abort_status = sim.fleet.take_abort_status()
        pr.latency_lie = sim.fleet.take_bad_latency()
        pr.meta_secret = sim.fleet.take_meta_secret()
        pr.plan = plan
        return plan, sim.fleet.take_stall()

    def _lying_plan(self, plan: P.Plan) -> P.Plan:
        """The plan with this request's fleet faults that change what it produces or how it finishes."""
        sim = self.sim
        if sim.fleet.take_nan():
            plan = FF.nan_plan(plan, sim.eos_ids[0])
        if sim.fleet.take_out_of_vocab():
            plan = FF.out_of_vocab_plan(plan, sim.profile.vocab_size)
        if sim.fleet.take_double_think_end():
            plan = FF.double_think_end_plan(plan, sim.profile.think_end_id)
        if sim.fleet.take_stop_at_length(plan):
            plan = FF.stop_at_length_plan(plan)
        return sim.fleet.same_answer_for(plan)  # one answer for every prompt (a cache keyed on the wrong field)

    async def _decode(
        self,
        st: ReqState,
        pr: Progress,
        plan: P.Plan,
        stall_at: int | None,
        stream_interval: int | None,
        on_chunk: Any,
    ) -> None:
        """Prefill, then decode step by step in simulated time; set the produced ids and the finish reason."""
        sim = self.sim
        prefill = (len(pr.item.input_ids) - pr.cached) / 1000 * sim.faults.prefill_ms_per_1k / 1000
        aborted = await self._wait(st, prefill)
        k = 0
        if not aborted:
            step = decode_step(
                len(plan.output_ids), stream_interval, on_chunk is not None, sim.faults.slow_tokens_ms > 0
            )
            k, aborted = await self._decode_steps(st, pr, plan.output_ids, stall_at, step, on_chunk)
        if aborted:
            pr.produced = plan.output_ids[:k]
            message = FF.with_hostile(sim.fleet, "Aborted")
            pr.finish_reason = {"type": "abort", "message": message, "status_code": None, "err_type": None}
        elif pr.abort_status is not None:  # fleet fault abort_status: aborted halfway, with that status_code
            pr.produced = plan.output_ids[: len(plan.output_ids) // 2]
            message = FF.with_hostile(sim.fleet, "Aborted by the scheduler (simulated)")
            pr.finish_reason = {"type": "abort", "message": message, "status_code": pr.abort_status, "err_type": None}
        else:
            pr.produced = list(plan.output_ids)
            pr.finish_reason = plan.finish_reason

    async def _decode_steps(
        self, st: ReqState, pr: Progress, output_ids: list[int], stall_at: int | None, step: int, on_chunk: Any
    ) -> tuple[int, bool]:
        """Decode `step` tokens at a time until done, aborted or stalled; (tokens decoded, aborted)."""
        sim = self.sim
        total = len(output_ids)
        loop = asyncio.get_running_loop()
        start = loop.time()
        k = 0
        while k < total:
            nk = min(total, k + step)
            if stall_at is not None and nk > stall_at:
                await st.abort.wait()  # silent, connection open, until aborted or the client leaves
                return k, True
            lat = sim.faults.slow_tokens_ms / 1000  # read each step: the fault can change live
            if await self._wait(st, start + nk * lat - loop.time()):
                if lat > 0:  # tokens decoded by now, not the whole step
                    k = max(k, min(nk, int((loop.time() - start) / lat)))
                return k, True
            if sim.fleet.weight_version != pr.versions[-1][0]:  # weights updated in place mid-request
                pr.versions.append((sim.fleet.weight_version, k))
            k = nk
            pr.produced = output_ids[:k]
            if k < total and on_chunk is not None:
                await on_chunk(pr)
        return k, False

    def _leave(self, st: ReqState, pr: Progress) -> None:
        """The item leaves the server: its slot given back, out of flight, its tokens counted once finished."""
        sim = self.sim
        if st.slot_since is not None:
            sim.stats.slot_seconds += time.monotonic() - st.slot_since
            st.slot_since = None
            sim.slot_released()
            sim.slots.release()
        if sim.in_flight.get(pr.item.rid) is st:
            del sim.in_flight[pr.item.rid]
        if pr.finish_reason is not None:
            sim.stats.bump(sim.stats.finished, pr.finish_reason["type"])
            sim.stats.prompt_tokens += len(pr.item.input_ids)
            sim.stats.completion_tokens += len(pr.produced)
            sim.stats.cached_tokens += pr.cached
            sim.stats.last_answer_at = time.time()
