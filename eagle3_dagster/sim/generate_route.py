"""The simulator's `POST|PUT /generate` route: validation, scheduler checks, faults, JSON and SSE answers.

A mixin of server.Handlers (which holds `self.sim` and `self.engine`); it follows
/work/shared/specs/sglang-generate.md: errors before the stream opens are HTTP errors, errors after
it opens are chunks, scheduler aborts are normal chunks with finish_reason abort.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

from aiohttp import web

from . import fleet_faults as FF
from . import protocol as P
from .engine import Engine, Progress, Sim
from .faults import hard_exit, reset_connection
from .responses import dumps, error_body, sse, stream_error_chunk


class GenerateRoutes:
    sim: Sim
    engine: Engine
    last_single_answer: bytes | None = None  # the last single answer (fleet fault stale_answer)
    last_stream_answer: bytes | None = None  # the last single stream's final chunk, as sent (stale_answer)

    def _error(self, e: P.SimError) -> web.Response:
        self.sim.stats.bump(self.sim.stats.errors, str(e.status))
        return error_body(e, self.sim.version)

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
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError (no pos/msg) for a non-UTF-8 body
            pos, msg = getattr(e, "pos", 0), getattr(e, "msg", str(e))
            return self._error(
                P.SimError(
                    400,
                    f"[{{'type': 'json_invalid', 'loc': ('body', {pos}), 'msg': "
                    f"'JSON decode error', 'ctx': {{'error': '{msg}'}}}}]",
                    "pydantic",
                )
            )
        # Errors before the stream opens: body shape and (0.5.23) the contract gate.
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
        stream = bool(body.get("stream", False))
        try:
            parsed = self._validate(body)
        except P.SimError as e:
            if not stream:
                return self._error(e)
            sim.stats.bump(sim.stats.errors, f"{e.status}-in-stream")
            resp = await self._open_stream(request)
            await resp.write(sse(stream_error_chunk(e, sim.version)))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        for it in parsed.items:
            sim.stats.bump(sim.stats.rid_counts, it.rid)
        quoted = await self._quoted_refusal(request, stream)
        if isinstance(quoted, web.StreamResponse):
            return quoted
        if sim.fleet.take_error_body():  # HTTP 200 that is not a result
            payload = FF.error_body_response(stream)
            return web.Response(
                body=payload, status=200, content_type="text/event-stream" if stream else "application/json"
            )
        if len(parsed.items) > 1 and any(it.sample_index for it in parsed.items):
            # n>1: SGLang first runs each prompt with max_new_tokens=0 to warm the prefix cache.
            for it in parsed.items:
                if it.sample_index == 0:
                    sim.trie.match_and_insert(it.input_ids)

        # Scheduler prompt-length check and queue limit: 400 / 503 non-stream, abort chunks in a stream.
        sched_err: P.SimError | None = quoted  # fleet fault quote_headers "abort": a stream's abort chunk
        try:
            for it in parsed.items:
                P.scheduler_check(it, sim.max_req_input_len)
            if sim.faults.queue_full_burst > 0:
                sim.faults.queue_full_burst -= 1
                sim.stats.bump(sim.stats.faults_injected, "queue_full")
                raise P.SimError(503, "The request queue is full.", "scheduler")
            q = sim.args.max_queued_requests
            if q is not None and sim.waiting + len(parsed.items) > q + max(
                0, sim.args.max_running_requests - sim.running
            ):
                raise P.SimError(503, "The request queue is full.", "scheduler")
        except P.SimError as e:
            sched_err = e
        if sched_err is not None and not stream:
            return self._error(sched_err)

        reset = False
        if sim.faults.reset_mid_body > 0 and sched_err is None:  # a refused request has no body to cut
            sim.faults.reset_mid_body -= 1
            sim.stats.bump(sim.stats.faults_injected, "reset_mid_body")
            reset = True

        if stream:
            return await self._generate_stream(request, parsed, sched_err, reset, crash)

        results = await asyncio.gather(*(self.engine.run(it, None) for it in parsed.items))
        bodies = [self.engine.body(pr, bool(body.get("return_prompt_token_ids"))) for pr in results]
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
        resp = await self._open_stream(request)
        await resp.write(sse(stream_error_chunk(err, self.sim.version)))
        await resp.write(b"data: [DONE]\n\n")
        return resp

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
        lock = asyncio.Lock()
        chunks_sent = 0
        incremental = sim.args.incremental_streaming_output
        drop_final = parsed.is_single and sched_err is None and sim.fleet.take_unfinished()

        async def send(pr: Progress, final: bool) -> None:
            nonlocal chunks_sent
            if final and drop_final:
                return  # fleet fault unfinished: the final chunk never arrives, [DONE] does
            ids = self.engine.output_ids(pr, pr.produced) if pr.sent_ids == 0 or not incremental else list(pr.produced)
            text = self.engine.text(pr, final)
            if not final and text.endswith("\ufffd"):
                return  # hold back an incomplete UTF-8 sequence
            chunk: dict[str, Any] = {"text": text, "output_ids": ids}
            if incremental:
                full = self.engine.output_ids(pr, pr.produced)
                chunk["output_ids"] = full[pr.sent_ids :]
                if sim.version == P.V0_5_23:
                    chunk["text"] = text[len(pr.sent_text) :]
                pr.sent_ids = len(full)
            else:
                pr.sent_ids = len(ids)
            pr.sent_text = text
            chunk["meta_info"] = self.engine.meta(pr, final, True, since=pr.sent_produced if incremental else 0)
            pr.sent_produced = len(pr.produced)
            pr.first_sent = True
            if not parsed.is_single:
                chunk["index"] = pr.item.index
            async with lock:
                await resp.write(sse(chunk))
                if final and parsed.is_single:
                    self.last_stream_answer = sse(chunk)
                chunks_sent += 1
                if (reset or crash) and chunks_sent >= 1:  # headers and a first chunk sent, then cut
                    if crash:
                        hard_exit()
                    reset_connection(request)
                    raise ConnectionResetError("reset_mid_body fault")

        if sched_err is not None:
            # Scheduler aborts arrive as a normal chunk with finish_reason abort, HTTP 200.
            for it in parsed.items:
                pr = Progress(
                    it,
                    None,
                    [],
                    {
                        "type": "abort",
                        "message": sched_err.message,
                        "status_code": sched_err.status,
                        "err_type": "BadRequestError" if sched_err.status == 400 else None,
                    },
                    0,
                    time.time(),
                )
                await send(pr, True)
            await resp.write(b"data: [DONE]\n\n")
            return resp

        if parsed.is_single and self.last_stream_answer is not None and sim.fleet.take_stale_answer():
            await resp.write(self.last_stream_answer)  # another request's answer (fleet fault stale_answer)
            await resp.write(b"data: [DONE]\n\n")
            return resp

        async def one(it: P.Item) -> None:
            interval = it.sampling.stream_interval or sim.args.stream_interval
            pr = await self.engine.run(it, interval, on_chunk=lambda p: send(p, False))
            await send(pr, True)

        try:
            await asyncio.gather(*(one(it) for it in parsed.items))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            # Our own reset fault, or the client went away: abort the remaining items.
            for it in parsed.items:
                st = sim.in_flight.get(it.rid)
                if st:
                    st.abort.set()
        return resp
