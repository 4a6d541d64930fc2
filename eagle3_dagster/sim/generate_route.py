"""The simulator's `POST|PUT /generate` route: validation, scheduler checks, faults, JSON and SSE answers.

A mixin of app.Handlers (which holds `self.sim` and `self.engine`); it follows
/work/shared/specs/sglang-generate.md: errors before the stream opens are HTTP errors, errors after
it opens are chunks, scheduler aborts are normal chunks with finish_reason abort.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from . import answer as A
from . import fleet_faults as FF
from . import protocol as P
from .engine import Engine, Progress
from .faults import hard_exit, reset_connection
from .responses import dumps, error_body, sse, stream_error_chunk
from .state import ReqState, Sim


def json_invalid(pos: int, msg: str) -> P.SimError:
    """FastAPI's 400 for a body that is not JSON: pydantic's error list, as its repr."""
    return P.SimError(
        400,
        f"[{{'type': 'json_invalid', 'loc': ('body', {pos}), 'msg': 'JSON decode error', 'ctx': {{'error': '{msg}'}}}}]",
        "pydantic",
    )


class GenerateRoutes:
    sim: Sim
    engine: Engine
    last_single_answer: bytes | None = None  # the last single answer (fleet fault stale_answer)
    last_stream_answer: bytes | None = None  # the last single stream's final chunk, as sent (stale_answer)

    def _error(self, e: P.SimError) -> web.Response:
        self.sim.stats.bump(self.sim.stats.errors, str(e.status))
        return error_body(e)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        sim = self.sim
        sim.stats.requests += 1
        crash = False
        if sim.faults.crash_after > 0:
            sim.faults.crash_after -= 1
            crash = sim.faults.crash_after == 0
            if crash:
                sim.stats.bump(sim.stats.faults_injected, "crash")
        resp = await self._generate(request, crash)
        if crash and isinstance(resp, web.Response):
            # An error answer to the fatal request: it still dies mid-response.
            await self._send_partial(request, resp.status, resp.content_type, cast(bytes, resp.body or b""), crash=True)
        return resp

    async def _send_partial(
        self, request: web.Request, status: int, content_type: str, payload: bytes, *, crash: bool
    ) -> web.StreamResponse:
        """Headers with the full Content-Length, half the body, then a reset (or a hard exit)."""
        resp = web.StreamResponse(status=status, headers={"Content-Type": content_type})
        resp.content_length = len(payload)
        await resp.prepare(request)
        await resp.write(payload[: max(1, len(payload) // 2)])
        if crash:
            hard_exit()
        reset_connection(request)
        return resp

    async def _generate(self, request: web.Request, crash: bool) -> web.StreamResponse:
        sim = self.sim
        body = self._read_body(await request.read())
        if isinstance(body, web.Response):
            return body
        stream = bool(body.get("stream", False))
        try:
            parsed = self._validate(body)
        except P.SimError as e:
            if not stream:
                return self._error(e)
            sim.stats.bump(sim.stats.errors, f"{e.status}-in-stream")
            return await self._stream_error(request, e)
        for it in parsed.items:
            sim.stats.bump(sim.stats.rid_counts, it.rid)
        quoted = await self._quoted_refusal(request, stream)
        if isinstance(quoted, web.StreamResponse):
            return quoted
        if sim.fleet.take_error_body():  # HTTP 200 that is not a result
            ctype = "text/event-stream" if stream else "application/json"
            message = FF.with_hostile(sim.fleet, FF.ERROR_BODY_MESSAGE)
            payload = FF.error_body_response(stream, message, sim.fleet.error_body_code)
            return web.Response(body=payload, status=200, content_type=ctype)
        if sim.fleet.take_trickle():  # an answer that never finishes
            return await self._trickle(request, parsed, stream)
        self._warm_prefix_cache(parsed)
        # a scheduler refusal, else the fleet fault quote_headers "abort" (a stream's abort chunk)
        sched_err = self._scheduler_refusal(parsed) or quoted
        if sched_err is not None and not stream:
            return self._error(sched_err)
        reset = sched_err is None and self._take_reset()  # a refused request has no body to cut
        if stream:
            return await self._generate_stream(request, parsed, sched_err, reset, crash)
        return await self._generate_json(request, parsed, bool(body.get("return_prompt_token_ids")), reset, crash)

    def _read_body(self, raw: bytes) -> dict[str, Any] | web.Response:
        """The request body, `text` prompts tokenized; or the error answered before any stream opens (the body's
        JSON and shape and, on 0.5.23, the contract gate)."""
        sim = self.sim
        try:
            body = json.loads(raw)
        except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError (no pos/msg) for a non-UTF-8 body
            return self._error(json_invalid(getattr(e, "pos", 0), getattr(e, "msg", str(e))))
        try:
            P.check_shape(body)
            if body.get("input_ids") is None and body.get("text") is not None:
                # `text` prompts are tokenized server-side, as SGLang does (no special tokens added).
                t = body["text"]
                enc = lambda x: list(sim.tok.encode(x, add_special_tokens=False))
                body["input_ids"] = enc(t) if isinstance(t, str) else [enc(x) for x in t]
            sps = body.get("sampling_params")
            for sp in [sps] if isinstance(sps, dict) else (sps or []):
                P.gate_sampling(sp, sim.version)
        except P.SimError as e:
            return self._error(e)
        return cast(dict[str, Any], body)

    def _warm_prefix_cache(self, parsed: P.Parsed) -> None:
        if len(parsed.items) > 1 and any(it.sample_index for it in parsed.items):
            # n>1: SGLang first runs each prompt with max_new_tokens=0 to warm the prefix cache.
            for it in parsed.items:
                if it.sample_index == 0:
                    self.sim.trie.match_and_insert(it.input_ids)

    def _scheduler_refusal(self, parsed: P.Parsed) -> P.SimError | None:
        """The scheduler's prompt-length check and queue limit (a queue_full_burst fault included): the
        refusal, answered 400 / 503 without streaming and as abort chunks in a stream; None to run."""
        sim = self.sim
        try:
            for it in parsed.items:
                P.scheduler_check(it, sim.max_req_input_len)
        except P.SimError as e:
            return e
        if sim.faults.queue_full_burst > 0:
            sim.faults.queue_full_burst -= 1
            sim.stats.bump(sim.stats.faults_injected, "queue_full")
            return P.SimError(503, "The request queue is full.", "scheduler")
        q = sim.args.max_queued_requests
        free_slots = max(0, sim.args.max_running_requests - sim.running)
        if q is not None and sim.waiting + len(parsed.items) > q + free_slots:
            return P.SimError(503, "The request queue is full.", "scheduler")
        return None

    def _take_reset(self) -> bool:
        """Whether this answer is cut mid-body (fault reset_mid_body, counted down)."""
        faults = self.sim.faults
        if faults.reset_mid_body <= 0:
            return False
        faults.reset_mid_body -= 1
        self.sim.stats.bump(self.sim.stats.faults_injected, "reset_mid_body")
        return True

    async def _generate_json(
        self, request: web.Request, parsed: P.Parsed, return_prompt_ids: bool, reset: bool, crash: bool
    ) -> web.StreamResponse:
        sim = self.sim
        results = await asyncio.gather(*(self.engine.run(it, None) for it in parsed.items))
        bodies = [A.body(sim, pr, return_prompt_ids) for pr in results]
        if parsed.is_single and sim.fleet.take_unfinished():
            bodies[0] = FF.unfinished_answer(bodies[0])  # a snapshot of the request while it was running
        payload = dumps(bodies[0] if parsed.is_single else bodies).encode()
        if parsed.is_single:
            stale, self.last_single_answer = self.last_single_answer, payload
            if stale is not None and sim.fleet.take_stale_answer():
                payload = stale  # another request's answer (fleet fault stale_answer)
        if reset or crash:
            return await self._send_partial(request, 200, "application/json", payload, crash=crash)
        return web.Response(body=payload, status=200, content_type="application/json")

    async def _trickle(self, request: web.Request, parsed: P.Parsed, stream: bool) -> web.StreamResponse:
        """Fleet fault trickle: headers, then a space (or on a stream with trickle_as keepalive an SSE comment
        event) every trickle_every_s, never an answer, until the client leaves or aborts the rid."""
        sim = self.sim
        states = [ReqState(it.rid) for it in parsed.items]
        for st in states:
            sim.in_flight[st.rid] = st
        ctype = "text/event-stream" if stream else "application/json"
        resp = web.StreamResponse(status=200, headers={"Content-Type": ctype})
        tick = b":\n\n" if stream and sim.fleet.trickle_as == "keepalive" else b" "
        try:
            await resp.prepare(request)
            while not any(st.abort.is_set() for st in states):
                await resp.write(tick)
                try:
                    await asyncio.wait_for(states[0].abort.wait(), sim.fleet.trickle_every_s)
                except TimeoutError:
                    pass
        except ConnectionResetError:
            sim.stats.client_disconnects += 1
        finally:
            for st in states:
                if sim.in_flight.get(st.rid) is st:
                    del sim.in_flight[st.rid]
        return resp

    async def _stream_error(self, request: web.Request, e: P.SimError) -> web.StreamResponse:
        """A stream opened (HTTP 200) that carries only the error chunk, then [DONE]."""
        resp = await self._open_stream(request)
        await resp.write(sse(stream_error_chunk(e, self.sim.version)))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _quoted_refusal(self, request: web.Request, stream: bool) -> web.StreamResponse | P.SimError | None:
        """Fleet fault quote_headers: an answer (or, for a stream's abort, the error) quoting the headers."""
        shape = self.sim.fleet.take_quote_headers()
        if shape is None:
            return None
        message = FF.quoted_request(request)
        if shape == "error_body":
            ctype = "text/event-stream" if stream else "application/json"
            return web.Response(body=FF.error_body_response(stream, message), status=200, content_type=ctype)
        err = P.SimError(400, message, "value")
        if not stream:
            return self._error(err)
        if shape == "abort":
            return err
        return await self._stream_error(request, err)

    def _validate(self, body: dict[str, Any]) -> P.Parsed:
        sim = self.sim
        parsed = P.parse_generate(body, sim.version, set(sim.in_flight) if sim.version == P.V0_5_23 else None)
        for it in parsed.items:
            P.context_checks(it, sim.context_length, sim.version, allow_auto_truncate=sim.allow_auto_truncate)
        for it in parsed.items:
            P.check_ranges(it.sampling, sim.version)
        P.feature_checks(body, sim.version)
        return parsed

    async def _open_stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        return resp

    async def _generate_stream(
        self, request: web.Request, parsed: P.Parsed, sched_err: P.SimError | None, reset: bool, crash: bool
    ) -> web.StreamResponse:
        sim = self.sim
        resp = await self._open_stream(request)
        sender = StreamSender(
            sim,
            request,
            resp,
            StreamFaults(
                drop_final=parsed.is_single and sched_err is None and sim.fleet.take_unfinished(),
                cut=reset or crash,
                crash=crash,
            ),
            incremental=sim.args.incremental_streaming_output,
            is_single=parsed.is_single,
            keep_final=self._keep_stream_answer,
        )
        if sched_err is not None:
            for it in parsed.items:  # scheduler refusals arrive as normal chunks with finish_reason abort, HTTP 200
                await sender.send(refused_progress(it, sched_err), True)
        elif parsed.is_single and self.last_stream_answer is not None and sim.fleet.take_stale_answer():
            await resp.write(self.last_stream_answer)  # another request's answer (fleet fault stale_answer)
        else:
            sender.end_early = not sender.cut and sim.fleet.take_cut_stream()
            await self._stream_items(sender, parsed)
            return resp
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _keep_stream_answer(self, final_chunk: bytes) -> None:
        self.last_stream_answer = final_chunk

    async def _stream_items(self, sender: StreamSender, parsed: P.Parsed) -> None:
        """Run every item, streaming its chunks as they come, then [DONE]; on a reset, abort what still runs."""
        sim = self.sim

        async def one(it: P.Item) -> None:
            interval = it.sampling.stream_interval or sim.args.stream_interval
            pr = await self.engine.run(it, interval, on_chunk=lambda p: sender.send(p, False))
            await sender.send(pr, True)

        try:
            await asyncio.gather(*(one(it) for it in parsed.items))
            await sender.resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, StreamEndedEarly):
            # Our own reset or cut_stream fault, or the client went away: abort the remaining items.
            for it in parsed.items:
                st = sim.in_flight.get(it.rid)
                if st:
                    st.abort.set()


def refused_progress(item: P.Item, err: P.SimError) -> Progress:
    """An item the scheduler refused in a stream: finished at once with an abort carrying the refusal."""
    finish = {
        "type": "abort",
        "message": err.message,
        "status_code": err.status,
        "err_type": "BadRequestError" if err.status == 400 else None,
    }
    return Progress(item, None, [], finish, 0, time.time())


def stream_chunk(sim: Sim, pr: Progress, final: bool, incremental: bool) -> dict[str, Any] | None:
    """The next SSE chunk of `pr` (cumulative, or with --incremental-streaming-output only what is new), or None
    while its text ends inside a UTF-8 sequence; records on `pr` what has been sent."""
    text = A.text(sim, pr, final)
    if not final and text.endswith("\ufffd"):
        return None  # hold back an incomplete UTF-8 sequence
    ids = A.output_ids(sim, pr)
    chunk: dict[str, Any] = {"text": text, "output_ids": ids}
    if incremental:
        chunk["output_ids"] = ids[pr.sent_ids :]
        if sim.version == P.V0_5_23:
            chunk["text"] = text[len(pr.sent_text) :]
    pr.sent_ids = len(ids)
    pr.sent_text = text
    chunk["meta_info"] = A.meta(sim, pr, final, True, since=pr.sent_produced if incremental else 0)
    pr.sent_produced = len(pr.produced)
    pr.first_sent = True
    return chunk


class StreamEndedEarly(Exception):
    """The fleet fault cut_stream: the response ends here as if complete (no final chunk, no [DONE])."""


@dataclass(frozen=True)
class StreamFaults:
    """The faults one stream plays: the final chunk dropped (fleet fault unfinished), the connection cut
    after the first chunk (reset_mid_body, crash_after), the process killed there (`crash`)."""

    drop_final: bool = False
    cut: bool = False
    crash: bool = False


class StreamSender:
    """Writes one /generate stream's chunks, one at a time; a reset_mid_body or crash_after fault cuts the
    stream after its first chunk, the fleet fault cut_stream ends it there cleanly (`end_early`), and the
    fleet fault unfinished drops the final one."""

    end_early = False

    def __init__(
        self,
        sim: Sim,
        request: web.Request,
        resp: web.StreamResponse,
        faults: StreamFaults,
        *,
        incremental: bool,
        is_single: bool,
        keep_final: Callable[[bytes], None],
    ) -> None:
        self.sim, self.request, self.resp = sim, request, resp
        self.incremental, self.is_single, self.drop_final = incremental, is_single, faults.drop_final
        self.cut, self.crash = faults.cut, faults.crash
        self.keep_final = keep_final  # a single stream's final chunk, kept for the fleet fault stale_answer
        self.lock = asyncio.Lock()

    async def send(self, pr: Progress, final: bool) -> None:
        if final and self.drop_final:
            return  # fleet fault unfinished: the final chunk never arrives, [DONE] does
        chunk = stream_chunk(self.sim, pr, final, self.incremental)
        if chunk is None:
            return
        if not self.is_single:
            chunk["index"] = pr.item.index
        if final and self.end_early:
            raise StreamEndedEarly  # never the final chunk
        async with self.lock:
            data = sse(chunk)
            await self.resp.write(data)
            if final and self.is_single:
                self.keep_final(data)
            if self.cut:  # headers and a first chunk sent, then cut
                if self.crash:
                    hard_exit()
                reset_connection(self.request)
                raise ConnectionResetError("reset_mid_body fault")
            if self.end_early:  # a first chunk sent, then the response ends as if complete
                raise StreamEndedEarly
