"""`eagle3-sim`: an SGLang-protocol simulator (native `/generate`, no GPU), built on aiohttp.web.

It follows /work/shared/specs/sglang-generate.md so the generation client runs unchanged against it.
Version profiles `--version 0.5.23` (default) and `0.5.9` switch the documented differences.

SGLang routes: POST|PUT /generate; GET /health, /health_generate, /ready (0.5.23), /model_info,
/get_model_info, /server_info, /get_server_info, /v1/models; GET|POST /flush_cache;
POST /abort_request; POST /tokenize, /detokenize; POST /v1/chat/completions (emulated reasoning
parser, to demonstrate the `</think>` stripping bug next to /generate).

Simulator-only admin routes (not SGLang; prefixed `/_sim/` so nobody mistakes them):

  GET  /_sim/faults           current fault state
  POST /_sim/faults           JSON, any subset of:
       {"queue_full_burst": N,      next N /generate calls answer 503 "The request queue is full."
        "reset_mid_body": N,        next N /generate responses send headers + part of the body,
                                    then reset the TCP connection
        "crash_after": N,           the N-th /generate call from now kills the process
                                    (os._exit) mid-response; 0/null disables
        "slow_tokens_ms": F,        per-token decode latency (ms)
        "prefill_ms_per_1k": F,     prefill latency per 1000 uncached prompt tokens (ms)
        "health": "ok"|"starting"|"draining",   lifecycle state shown by /health
        "mode": "normal"|"drop-think-end"|"echo-prompt-tail",   output bug mode (as --mode)
        "clear": true}              reset every fault first
       plus the fleet faults of fleet_faults.py: "error_body" (200 {"error": ...}), "stall" (silent
       with the connection open), "nan_finish", "weight_version", "html" (not SGLang at all),
       "report_version", "preferred_sampling_params"
  GET  /_sim/stats            counters: requests, items, finish reasons, errors and faults injected,
                              rids seen/repeated, tokens, cached tokens, GPU busy time, in-flight.
                              `?rids=1` adds the per-rid request counts.

Modes (`--mode`) reproduce the bugs the pipeline must catch: `drop-think-end` drops the think-end
id from output_ids; `echo-prompt-tail` prefixes output_ids with the last prompt ids (sglang
#10896) while completion_tokens counts only the real tokens.

A changed deployment (sim/deployment.py): `--weight-version V` is reported as weight_version in
/model_info and meta_info; `--reasoning-scale 0.2` makes reasoning about 5x shorter.

Lifecycle: `--loading-seconds S` delays binding (clients see connection refused, as while SGLang
loads weights); `--starting-seconds S` keeps /health at 503 while /generate works; SIGTERM turns
/health to 503 and exits once in-flight requests drain.

Emulated GPU: `--max-running-requests` slots; a request waits for a slot, then takes
prefill (`--prefill-ms-per-1k` per 1000 uncached prompt tokens) + tokens x `--token-latency-ms`.
`--max-queued-requests Q` answers 503 "The request queue is full." beyond Q waiting requests.

Useful flags: `--context-length`, `--max-total-num-tokens` (KV capacity; gives max_req_input_len),
`--stream-interval`, `--incremental-streaming-output` (alias `--stream-output`), `--seed`,
`--reasoning-parser`, `--noncanonical-rate R` (a share R of samples carries up to 3 non-canonical token
splits, text unchanged: sim/noncanonical.py), `--timeout-keep-alive` (5 s, like uvicorn), `--api-key-env VAR` (the key is
read from the environment, never from argv, and never logged). `eagle3-sim --help` lists all.

Not emulated: sampling (temperature/top_p/... are validated but the output is a deterministic
function of the prompt ids), `spaces_between_special_tokens` (no effect with fast tokenizers),
grammars, hidden states, LoRA, sessions, the router/gateway mode (spec §9.10).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from aiohttp import web

from ..profiles import ModelProfile, active_profile, load_profile
from . import fleet_faults as FF
from . import protocol as P
from .deployment import Deployment
from .model import OutputModel
from .noncanonical import NonCanonicalSplitter, check_noncanonical_args
from .record import RequestRecorder

log = logging.getLogger("eagle3_dagster.sim")

MODES = ("normal", "drop-think-end", "echo-prompt-tail")


class SimConfigError(Exception):
    """A command-line setting the simulator cannot run with."""


_FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)


def dumps(obj: Any) -> str:
    # SGLang serializes with orjson: compact, UTF-8.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps(obj), status=status, content_type="application/json")


# ---------------------------------------------------------------------------------------------
# State


class PrefixTrie:
    """Prompt prefix cache (radix-cache stand-in): longest common prefix with earlier prompts."""

    def __init__(self, max_nodes: int) -> None:
        self.root: dict[int, dict] = {}
        self.nodes = 0
        self.max_nodes = max_nodes
        self.evictions = 0

    def match_and_insert(self, ids: Sequence[int]) -> int:
        node, matched, inserting = self.root, 0, False
        if self.nodes + len(ids) > self.max_nodes:
            self.clear()  # crude whole-cache eviction under memory pressure
            self.evictions += 1
        for t in ids:
            nxt = None if inserting else node.get(t)
            if nxt is None:
                inserting = True
                nxt = node[t] = {}
                self.nodes += 1
            else:
                matched += 1
            node = nxt
        return matched

    def clear(self) -> None:
        self.root = {}
        self.nodes = 0


@dataclass
class Faults:
    queue_full_burst: int = 0
    reset_mid_body: int = 0
    crash_after: int = 0
    slow_tokens_ms: float = 0.0
    prefill_ms_per_1k: float = 0.0
    health: str = "ok"  # ok | starting | draining
    mode: str = "normal"  # normal | drop-think-end | echo-prompt-tail

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ReqState:
    rid: str
    status: str = "queued"  # queued | running
    abort: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Stats:
    requests: int = 0  # HTTP /generate calls
    items: int = 0  # scheduler requests (batch items, n samples)
    finished: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # by status code
    faults_injected: dict[str, int] = field(default_factory=dict)
    rid_counts: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    slot_seconds: float = 0.0  # sum over requests of time holding a GPU slot
    busy_seconds: float = 0.0  # wall time with at least one request running
    client_disconnects: int = 0
    peak_in_flight: int = 0  # highest number of concurrent scheduler requests seen
    peak_running: int = 0  # highest number of requests holding a GPU slot at once
    chat_requests: int = 0

    def bump(self, d: dict[str, int], key: str, by: int = 1) -> None:
        d[key] = d.get(key, 0) + by


class Sim:
    def __init__(self, args: argparse.Namespace, profile: ModelProfile, tokenizer: Any) -> None:
        self.args = args
        self.version: str = args.version
        self.profile = profile
        self.tok = tokenizer
        self.model = OutputModel(tokenizer, profile, tool_call_rate=args.tool_call_rate)
        # --weight-version / --reasoning-scale: a changed deployment (sim/deployment.py)
        self.deployment = Deployment(getattr(args, "weight_version", "default"), getattr(args, "reasoning_scale", 1.0))
        self.model.shape_reasoning = self.deployment.shape_reasoning
        self.context_length: int = args.context_length or profile.context_length
        self.max_total_num_tokens: int = args.max_total_num_tokens
        self.max_req_input_len = min(self.context_length - 1, self.max_total_num_tokens - 1) - 5
        self.eos_ids = tuple(profile.stop_token_ids)
        self.api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
        self.faults = Faults(
            queue_full_burst=args.queue_full_burst,
            reset_mid_body=args.reset_mid_body,
            crash_after=args.crash_after,
            slow_tokens_ms=args.token_latency_ms,
            prefill_ms_per_1k=args.prefill_ms_per_1k,
            mode=args.mode,
        )
        self.stats = Stats()
        self.fleet = FF.FleetFaults(
            weight_version=self.deployment.weight_version
        )  # fleet-level faults (fleet_faults.py); --weight-version is the starting version
        self.trie = PrefixTrie(args.prefix_cache_nodes)
        self.in_flight: dict[str, ReqState] = {}
        self.slots = asyncio.Semaphore(args.max_running_requests)
        self.running = 0
        self.waiting = 0
        self._busy_since: float | None = None
        self.started_at = time.time()
        self.ready_at = self.started_at + args.starting_seconds
        self.reasoning_parser = args.reasoning_parser if args.reasoning_parser != "none" else None
        # --record-requests FILE: one JSON line per item run (sim/record.py), for tests
        self.recorder = RequestRecorder(args.record_requests) if getattr(args, "record_requests", None) else None
        if args.reasoning_parser == "auto":
            self.reasoning_parser = "kimi_k2" if profile.template_family == "kimi_ts" else "qwen3"

    # -- lifecycle ---------------------------------------------------------------------------
    def health_state(self) -> str:
        if self.faults.health != "ok":
            return self.faults.health
        return "starting" if time.time() < self.ready_at else "ok"

    def _slot_acquired(self) -> None:
        if self.running == 0:
            self._busy_since = time.monotonic()
        self.running += 1
        self.stats.peak_running = max(self.stats.peak_running, self.running)

    def _slot_released(self) -> None:
        self.running -= 1
        if self.running == 0 and self._busy_since is not None:
            self.stats.busy_seconds += time.monotonic() - self._busy_since
            self._busy_since = None

    def busy_seconds(self) -> float:
        extra = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        return self.stats.busy_seconds + extra


# ---------------------------------------------------------------------------------------------
# Generation of one item, token by token in (simulated) time


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


def _logprob(tok_id: int, pos: int) -> float:
    # Deterministic fake logprob in (-3, 0].
    return -((tok_id * 2654435761 + pos * 40503) % 3000) / 1000.0


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
        sim = self.sim
        st = ReqState(item.rid)
        sim.in_flight[item.rid] = st
        sim.stats.peak_in_flight = max(sim.stats.peak_in_flight, len(sim.in_flight))
        sim.stats.items += 1
        if sim.recorder is not None:
            sim.recorder.record(item.rid, item.input_ids)
        t0 = time.time()
        pr = Progress(item, None, [], None, 0, t0)
        sim.waiting += 1
        holding = False  # True while this request owns a GPU slot
        try:
            acq = asyncio.ensure_future(sim.slots.acquire())
            ab = asyncio.ensure_future(st.abort.wait())
            try:
                await asyncio.wait({acq, ab}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sim.waiting -= 1
                ab.cancel()
                if not acq.done():
                    acq.cancel()
                elif not acq.cancelled() and acq.exception() is None:
                    holding = True
                    sim._slot_acquired()
                    slot_t0 = time.monotonic()
            if not holding:
                pr.queued_abort = True
                pr.finish_reason = {
                    "type": "abort",
                    "message": "Abort in waiting queue",
                    "status_code": None,
                    "err_type": None,
                }
                return pr
            st.status = "running"
            pr.cached = min(sim.trie.match_and_insert(item.input_ids), len(item.input_ids) - 1)
            plan = P.plan_output(
                sim.model,
                item,
                eos_ids=sim.eos_ids,
                context_length=sim.context_length,
                version=sim.version,
                mode=sim.faults.mode,
            )
            sim.fleet.note_request()  # an armed weight-version switch (fleet_faults.py)
            if sim.fleet.take_nan():
                plan = FF.nan_plan(plan, sim.eos_ids[0])
            pr.plan = plan
            stall_at = sim.fleet.take_stall()
            prefill = (len(item.input_ids) - pr.cached) / 1000 * sim.faults.prefill_ms_per_1k / 1000
            aborted = await self._wait(st, prefill)
            total = len(plan.output_ids)
            step = max(1, stream_interval or 1) if on_chunk else max(total, 1)
            loop = asyncio.get_running_loop()
            start = loop.time()
            k = 0
            while not aborted and k < total:
                nk = min(total, k + step)
                if stall_at is not None and nk > stall_at:
                    await st.abort.wait()  # silent, connection open, until aborted or the client leaves
                    aborted = True
                    break
                lat = sim.faults.slow_tokens_ms / 1000  # read each step: the fault can change live
                if await self._wait(st, start + nk * lat - loop.time()):
                    aborted = True
                    if lat > 0:  # tokens decoded by now, not the whole step
                        k = max(k, min(nk, int((loop.time() - start) / lat)))
                    break
                k = nk
                pr.produced = plan.output_ids[:k]
                if k < total and on_chunk is not None:
                    await on_chunk(pr)
            if aborted:
                pr.produced = plan.output_ids[:k]
                pr.finish_reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
            else:
                pr.produced = list(plan.output_ids)
                pr.finish_reason = plan.finish_reason
            return pr
        except asyncio.CancelledError:
            sim.stats.client_disconnects += 1
            raise
        finally:
            if holding:
                sim.stats.slot_seconds += time.monotonic() - slot_t0
                sim._slot_released()
                sim.slots.release()
            if sim.in_flight.get(item.rid) is st:
                del sim.in_flight[item.rid]
            if pr.finish_reason is not None:
                sim.stats.bump(sim.stats.finished, pr.finish_reason["type"])
                sim.stats.prompt_tokens += len(item.input_ids)
                sim.stats.completion_tokens += len(pr.produced)
                sim.stats.cached_tokens += pr.cached

    # -- response bodies ------------------------------------------------------------------------
    def output_ids(self, pr: Progress, ids: Sequence[int]) -> list[int]:
        if self.sim.faults.mode == "echo-prompt-tail":
            # sglang #10896: the last prompt ids leak to the front of output_ids.
            return list(pr.item.input_ids[-self.sim.args.echo_tail_tokens :]) + list(ids)
        return list(ids)

    def text(self, pr: Progress, final: bool) -> str:
        s = pr.item.sampling
        trim = pr.plan.stop_trim if (final and pr.plan and pr.finish_reason == pr.plan.finish_reason) else 0
        stop_str = pr.plan.stop_str if (final and pr.plan) else None
        return P.render_text(self.sim.model, pr.produced, trim, s, stop_str)

    def meta(self, pr: Progress, final: bool, stream: bool) -> dict[str, Any]:
        sim = self.sim
        m: dict[str, Any] = {"id": pr.item.rid, "finish_reason": pr.finish_reason if final else None}
        if not pr.queued_abort:
            m["prompt_tokens"] = len(pr.item.input_ids)
        m["weight_version"] = sim.fleet.weight_version
        m["total_retractions" if sim.version == P.V0_5_9 else "num_retractions"] = 0
        m["completion_tokens"] = len(pr.produced)
        if not pr.queued_abort:
            m["cached_tokens"] = pr.cached
        if sim.version == P.V0_5_23:
            m["reasoning_tokens"] = self.reasoning_tokens(pr.produced) if sim.reasoning_parser else 0
        if pr.item.return_logprob:
            m["input_token_logprobs"] = []
            m["output_token_logprobs"] = [[_logprob(t, i), t, None] for i, t in enumerate(pr.produced)]
            if pr.item.top_logprobs_num:
                m["output_top_logprobs"] = [
                    [[_logprob(t, i), t, None]]
                    + [
                        [_logprob(t + j, i) - 1.0, (t + j) % sim.profile.vocab_size, None]
                        for j in range(1, pr.item.top_logprobs_num)
                    ]
                    for i, t in enumerate(pr.produced)
                ]
        if final:
            m["e2e_latency"] = time.time() - pr.started
        if (final and not stream) or (stream and not pr.first_sent):
            m["response_sent_to_client_ts"] = time.time()
        return m

    def reasoning_tokens(self, ids: Sequence[int]) -> int:
        te = self.sim.profile.think_end_id
        return ids.index(te) if te in ids else len(ids)

    def body(self, pr: Progress, return_prompt_ids: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "text": self.text(pr, True),
            "output_ids": self.output_ids(pr, pr.produced),
            "meta_info": self.meta(pr, True, False),
        }
        if return_prompt_ids and self.sim.version == P.V0_5_23:
            d["prompt_token_ids"] = list(pr.item.input_ids)
        return d


# ---------------------------------------------------------------------------------------------
# HTTP


def error_body(e: P.SimError, version: str) -> web.Response:
    if e.kind == "pydantic":
        return json_response(
            {"object": "error", "message": e.message, "type": "Bad Request", "param": None, "code": 400}, 400
        )
    if e.kind == "contract":
        return json_response({"error": e.message}, e.status)
    if e.kind == "internal":
        return web.Response(text="Internal Server Error", status=500, content_type="text/plain")
    if e.status >= 500:
        return json_response(
            {"object": "error", "message": e.message, "type": str(e.status), "param": None, "code": e.status}, e.status
        )
    return json_response({"error": {"message": e.message}}, e.status)


def stream_error_chunk(e: P.SimError, version: str) -> dict[str, Any]:
    err: dict[str, Any] = {"message": e.message}
    if version == P.V0_5_23:
        err.update({"type": "invalid_request_error", "code": e.status, "retryable": False})
    return {"error": err}


def _sse(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


def _rst(request: web.Request) -> None:
    """Abort the TCP connection with a reset (SO_LINGER 0), like a crashed peer."""
    tr = request.transport
    if tr is None:
        return
    sock = tr.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    tr.abort()


def _hard_exit() -> None:
    log.error("crash_after fault: exiting hard mid-response")
    logging.shutdown()
    os._exit(70)


class Handlers:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.engine = Engine(sim)

    # -- auth ------------------------------------------------------------------------------------
    @web.middleware
    async def auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = self.sim.api_key
        if key and not (request.path.startswith("/health") or request.path.startswith("/metrics")):
            got = request.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {key}".encode()):
                self.sim.stats.bump(self.sim.stats.errors, "401")
                return json_response({"error": "Unauthorized"}, 401)
        return await handler(request)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.sim.health_state() == "ok" else 503)

    async def ready(self, request: web.Request) -> web.Response:
        if self.sim.version == P.V0_5_9:
            raise web.HTTPNotFound(text=dumps({"detail": "Not Found"}), content_type="application/json")
        return web.Response(status=200 if self.sim.health_state() == "ok" else 503)

    async def model_info(self, request: web.Request) -> web.Response:
        sim = self.sim
        d: dict[str, Any] = {
            "model_path": sim.args.model_path,
            "tokenizer_path": sim.args.model_path,
            "is_generation": True,
            "preferred_sampling_params": FF.preferred_for_model_info(sim.fleet),
            "weight_version": sim.fleet.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": sim.args.model_type,
            "architectures": [sim.args.architecture],
        }
        if sim.version == P.V0_5_23:
            d.update(
                {
                    "served_model_name": sim.args.served_model_name,
                    "load_format": "auto",
                    "reasoning_parser": sim.reasoning_parser,
                    "tool_call_parser": sim.args.tool_call_parser,
                    "disaggregation_mode": "null",
                }
            )
        return json_response(d)

    async def server_info(self, request: web.Request) -> web.Response:
        sim = self.sim
        a = sim.args
        d: dict[str, Any] = {
            "model_path": a.model_path,
            "tokenizer_path": a.model_path,
            "served_model_name": a.served_model_name,
            "host": a.host,
            "port": a.port,
            "tp_size": 1,
            "dp_size": 1,
            "context_length": sim.context_length,
            "max_running_requests": a.max_running_requests,
            "max_queued_requests": a.max_queued_requests,
            "reasoning_parser": sim.reasoning_parser,
            "tool_call_parser": a.tool_call_parser,
            "skip_tokenizer_init": False,
            "stream_interval": a.stream_interval,
            "stream_output"
            if sim.version == P.V0_5_9
            else "incremental_streaming_output": a.incremental_streaming_output,
            "api_key": None,
            "allow_auto_truncate": False,
            "disable_radix_cache": False,
            "schedule_policy": "fcfs",
            "max_total_num_tokens": sim.max_total_num_tokens,
            "max_req_input_len": sim.max_req_input_len,
            "internal_states": [
                {
                    "last_gen_throughput": 0.0 if not sim.running else 1000.0 / max(sim.faults.slow_tokens_ms, 1e-3),
                    "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": sim.max_total_num_tokens},
                    "effective_max_running_requests_per_dp": a.max_running_requests,
                    "num_running_reqs": sim.running,
                    "num_waiting_reqs": sim.waiting,
                }
            ],
            "version": sim.fleet.report_version or sim.version,
        }
        if sim.version == P.V0_5_23:
            d.update(
                {
                    "launch_command": "python -m sglang.launch_server (simulated)",
                    "startup_time": sim.started_at,
                    "frontend": "python",
                }
            )
        return json_response(d)

    async def v1_models(self, request: web.Request) -> web.Response:
        sim = self.sim
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": sim.args.served_model_name,
                        "object": "model",
                        "created": int(sim.started_at),
                        "owned_by": "sglang",
                        "root": sim.args.model_path,
                        "parent": None,
                        "max_model_len": sim.context_length,
                    }
                ],
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.sim.in_flight:
            msg = _FLUSH_TEXT if self.sim.version == P.V0_5_9 else "Flush cache failed."
            return web.Response(text=msg, status=400, content_type="text/plain")
        self.sim.trie.clear()
        return web.Response(text=_FLUSH_TEXT, status=200, content_type="text/plain")

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            body = {}
        rid = body.get("rid") if isinstance(body, dict) else None
        abort_all = bool(body.get("abort_all")) if isinstance(body, dict) else False
        for r, st in list(self.sim.in_flight.items()):
            # The scheduler matches by prefix: "x" aborts batch items x_0, x_1, ...
            if abort_all or (isinstance(rid, str) and rid and r.startswith(rid)):
                st.abort.set()
        return web.Response(status=200)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        prompt = body.get("prompt", "")
        add = bool(body.get("add_special_tokens", True))
        if isinstance(prompt, list):
            toks = [list(self.sim.tok.encode(p, add_special_tokens=add)) for p in prompt]
            return json_response(
                {"tokens": toks, "count": [len(t) for t in toks], "max_model_len": self.sim.context_length}
            )
        toks1 = list(self.sim.tok.encode(prompt, add_special_tokens=add))
        return json_response({"tokens": toks1, "count": len(toks1), "max_model_len": self.sim.context_length})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        text = self.sim.tok.decode(
            body.get("tokens", []), skip_special_tokens=bool(body.get("skip_special_tokens", True))
        )
        return json_response({"text": text})

    # -- admin ---------------------------------------------------------------------------------------
    async def get_faults(self, request: web.Request) -> web.Response:
        return json_response({**self.sim.faults.as_dict(), **self.sim.fleet.as_dict()})

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            a = self.sim.args
            clear = body.pop("clear", False)
            f = (
                Faults(slow_tokens_ms=a.token_latency_ms, prefill_ms_per_1k=a.prefill_ms_per_1k, mode=a.mode)
                if clear
                else self.sim.faults
            )
            fleet = (
                FF.FleetFaults(injected=self.sim.fleet.injected, weight_version=self.sim.deployment.weight_version)
                if clear
                else self.sim.fleet
            )
            FF.apply(fleet, body)
            self.sim.fleet = fleet
            unknown = set(body) - set(Faults.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown fault(s): {sorted(unknown)}")
            for k in ("queue_full_burst", "reset_mid_body", "crash_after"):
                if k in body:
                    setattr(f, k, int(body[k] or 0))
            for k in ("slow_tokens_ms", "prefill_ms_per_1k"):
                if k in body:
                    setattr(f, k, float(body[k] or 0.0))
            if "mode" in body:
                if body["mode"] not in MODES:
                    raise ValueError(f"mode must be one of {MODES}")
                f.mode = body["mode"]
            if "health" in body:
                if body["health"] not in ("ok", "starting", "draining"):
                    raise ValueError("health must be ok, starting or draining")
                f.health = body["health"]
                if f.health == "ok":
                    self.sim.ready_at = 0.0  # an explicit "ok" also ends --starting-seconds
        except (ValueError, TypeError) as e:
            return json_response({"error": str(e)}, 400)
        self.sim.faults = f
        log.info("faults now %s %s", f.as_dict(), self.sim.fleet.as_dict())
        return json_response({**f.as_dict(), **self.sim.fleet.as_dict()})

    async def get_stats(self, request: web.Request) -> web.Response:
        sim, s = self.sim, self.sim.stats
        up = time.time() - sim.started_at
        d: dict[str, Any] = {
            "version": sim.version,
            "mode": sim.faults.mode,
            "model": sim.profile.name,
            "uptime_seconds": up,
            "health": sim.health_state(),
            "requests": s.requests,
            "items": s.items,
            "chat_requests": s.chat_requests,
            "finished": s.finished,
            "errors": s.errors,
            "faults_injected": {**s.faults_injected, **sim.fleet.injected},
            "rids_seen": len(s.rid_counts),
            "rids_repeated": sum(1 for c in s.rid_counts.values() if c > 1),
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "cached_tokens": s.cached_tokens,
            "running": sim.running,
            "waiting": sim.waiting,
            "in_flight": len(sim.in_flight),
            "peak_in_flight": s.peak_in_flight,
            "peak_running": s.peak_running,
            "max_running_requests": sim.args.max_running_requests,
            "slot_seconds": s.slot_seconds,
            "busy_seconds": sim.busy_seconds(),
            "client_disconnects": s.client_disconnects,
            "prefix_cache_nodes": sim.trie.nodes,
            "prefix_cache_evictions": sim.trie.evictions,
            "faults": sim.faults.as_dict(),
            "noncanonical": sim.model.splitter.stats() if sim.model.splitter is not None else None,
        }
        d["utilization"] = s.slot_seconds / (up * sim.args.max_running_requests) if up > 0 else 0.0
        if request.query.get("rids"):
            d["rid_counts"] = s.rid_counts
        return json_response(d)

    # -- /generate -----------------------------------------------------------------------------------
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
            _hard_exit()
        _rst(request)
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
            await resp.write(_sse(stream_error_chunk(e, sim.version)))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        for it in parsed.items:
            sim.stats.bump(sim.stats.rid_counts, it.rid)
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
        sched_err: P.SimError | None = None
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
        payload = dumps(bodies[0] if parsed.is_single else bodies).encode()
        if reset or crash:
            return await self._send_partial(request, 200, "application/json", payload, crash=crash)
        return web.Response(body=payload, status=200, content_type="application/json")

    def _validate(self, body: dict[str, Any]) -> P.Parsed:
        sim = self.sim
        parsed = P.parse_generate(body, sim.version, set(sim.in_flight) if sim.version == P.V0_5_23 else None)
        for it in parsed.items:
            P.context_checks(it, sim.context_length, sim.version)
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

        async def send(pr: Progress, final: bool) -> None:
            nonlocal chunks_sent
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
            chunk["meta_info"] = self.engine.meta(pr, final, True)
            pr.first_sent = True
            if not parsed.is_single:
                chunk["index"] = pr.item.index
            async with lock:
                await resp.write(_sse(chunk))
                chunks_sent += 1
                if (reset or crash) and chunks_sent >= 1:  # headers and a first chunk sent, then cut
                    if crash:
                        _hard_exit()
                    _rst(request)
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

    # -- OpenAI chat (to show the reasoning-parser bug) ------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.Response:
        from .chat import chat_completion

        self.sim.stats.chat_requests += 1
        try:
            body = json.loads(await request.read())
        except ValueError:
            return json_response(
                {
                    "object": "error",
                    "message": "JSON decode error",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
                400,
            )
        return await chat_completion(self.sim, self.engine, body)


def build_app(sim: Sim) -> web.Application:
    h = Handlers(sim)
    app = web.Application(middlewares=[FF.html_middleware(lambda: sim.fleet), h.auth], client_max_size=1024**3)
    r = app.router
    r.add_route("POST", "/generate", h.generate)
    r.add_route("PUT", "/generate", h.generate)
    for p in ("/health", "/health_generate"):
        r.add_get(p, h.health)
    r.add_get("/ready", h.ready)
    for p in ("/model_info", "/get_model_info"):
        r.add_get(p, h.model_info)
    for p in ("/server_info", "/get_server_info"):
        r.add_get(p, h.server_info)
    r.add_get("/v1/models", h.v1_models)
    r.add_route("GET", "/flush_cache", h.flush_cache)
    r.add_route("POST", "/flush_cache", h.flush_cache)
    r.add_post("/abort_request", h.abort_request)
    for p in ("/tokenize", "/v1/tokenize"):
        r.add_post(p, h.tokenize)
    for p in ("/detokenize", "/v1/detokenize"):
        r.add_post(p, h.detokenize)
    r.add_post("/v1/chat/completions", h.chat_completions)
    r.add_get("/_sim/faults", h.get_faults)
    r.add_post("/_sim/faults", h.set_faults)
    r.add_get("/_sim/stats", h.get_stats)
    return app


# ---------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="eagle3-sim", description="SGLang /generate simulator (no GPU).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--model", default=None, help="profile name or YAML path (default: EAGLE3_MODEL / active profile)")
    ap.add_argument("--tokenizer", default=None, help="local tokenizer folder (default: profile, EAGLE3_TOKENIZER)")
    ap.add_argument("--mode", choices=MODES, default="normal")
    ap.add_argument("--version", choices=P.VERSIONS, default=P.V0_5_23)
    ap.add_argument("--api-key-env", default=None, help="name of the env var holding the API key")
    ap.add_argument("--seed", type=int, default=None, help="mixed into every prompt seed (default: none)")
    ap.add_argument("--token-latency-ms", "--slow-tokens-ms", dest="token_latency_ms", type=float, default=0.0)
    ap.add_argument("--prefill-ms-per-1k", type=float, default=0.0, help="prefill latency per 1000 uncached tokens")
    ap.add_argument("--max-running-requests", type=int, default=64, help="GPU slots")
    ap.add_argument("--max-queued-requests", type=int, default=None)
    ap.add_argument("--max-total-num-tokens", type=int, default=1_000_000, help="KV capacity reported and checked")
    ap.add_argument("--context-length", type=int, default=None, help="override the profile's context length")
    ap.add_argument("--stream-interval", type=int, default=1)
    ap.add_argument(
        "--incremental-streaming-output", "--stream-output", dest="incremental_streaming_output", action="store_true"
    )
    ap.add_argument("--reasoning-parser", default="auto", help="auto, none or a parser name (reasoning_tokens)")
    ap.add_argument("--tool-call-parser", default=None)
    ap.add_argument("--model-path", default=None, help="reported model_path (default: the profile's tokenizer id)")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--echo-tail-tokens", type=int, default=3)
    ap.add_argument("--tool-call-rate", type=float, default=0.6)
    ap.add_argument(
        "--noncanonical-rate",
        type=float,
        default=0.0,
        help="share of samples emitted with up to --noncanonical-max-splits non-canonical token splits "
        "(text unchanged; sim/noncanonical.py)",
    )
    ap.add_argument("--noncanonical-max-splits", type=int, default=3)
    ap.add_argument("--prefix-cache-nodes", type=int, default=2_000_000)
    ap.add_argument("--loading-seconds", type=float, default=0.0, help="do not bind for S seconds")
    ap.add_argument("--starting-seconds", type=float, default=0.0, help="/health 503 for S seconds after binding")
    ap.add_argument("--queue-full-burst", type=int, default=0)
    ap.add_argument("--reset-mid-body", type=int, default=0)
    ap.add_argument("--crash-after", type=int, default=0)
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--timeout-keep-alive", type=float, default=5.0, help="idle keep-alive close (s), as uvicorn")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--record-requests", default=None, help="append {rid, input_ids} per /generate item (tests)")
    ap.add_argument("--weight-version", default="default", help="reported weight_version (a new deployment)")
    ap.add_argument(
        "--reasoning-scale",
        type=float,
        default=1.0,
        help="keep this fraction of each reasoning passage (0.2: ~5x shorter; sim/deployment.py)",
    )
    return ap.parse_args(argv)


def load_tokenizer_for(profile: ModelProfile) -> Any:
    """The project's tokenizer loader when available (same rules as the tokenize stage), else plain
    transformers from the local folder; never remote code."""
    try:
        from ..tokenize import load_tokenizer
    except Exception:  # the tokenize package is optional for the simulator
        pass
    else:
        return load_tokenizer(profile.tokenizer, trust_remote_code=False)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(profile.tokenizer, trust_remote_code=False)


def resolve_profile(args: argparse.Namespace) -> ModelProfile:
    """--model (name or YAML) else the active profile; --tokenizer overrides the tokenizer folder."""
    from ..config import settings

    base = load_profile(args.model or settings().model)
    prof = base if args.model else active_profile()
    if args.tokenizer:
        prof = prof.with_tokenizer(str(Path(args.tokenizer).expanduser().resolve()))
    if args.model_path is None:
        # Report the model's id, as SGLang reports --model-path, not the local tokenizer folder.
        args.model_path = base.tokenizer
    return prof


async def serve(args: argparse.Namespace) -> None:
    t0 = time.time()
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise SimConfigError(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
    check_noncanonical_args(args.noncanonical_rate, args.noncanonical_max_splits)  # before the slow tokenizer load
    Deployment(args.weight_version, args.reasoning_scale)  # bad flags fail before the tokenizer loads
    profile = resolve_profile(args)
    tok = load_tokenizer_for(profile)
    args.served_model_name = args.served_model_name or args.model_path
    args.model_type = "kimi_k25" if profile.template_family == "kimi_ts" else profile.name.replace("-", "_")
    args.architecture = (
        "KimiK25ForConditionalGeneration" if profile.template_family == "kimi_ts" else "Qwen3ForCausalLM"
    )
    sim = Sim(args, profile, tok)
    if args.seed is not None:
        sim.model.global_seed = args.seed
    if args.noncanonical_rate > 0:
        sim.model.splitter = NonCanonicalSplitter(tok, args.noncanonical_rate, max_splits=args.noncanonical_max_splits)
    log.info(
        "loaded profile %s (tokenizer %s) in %.1fs; version %s, mode %s",
        profile.name,
        profile.tokenizer,
        time.time() - t0,
        args.version,
        args.mode,
    )
    if args.loading_seconds > 0:
        # SGLang loads weights before uvicorn binds: clients see connection refused meanwhile.
        await asyncio.sleep(max(0.0, args.loading_seconds - (time.time() - t0)))
    sim.started_at = time.time()
    sim.ready_at = sim.started_at + args.starting_seconds
    app = build_app(sim)
    # handler_cancellation: a client disconnect cancels the work, as in SGLang. keepalive 5 s like
    # uvicorn's timeout_keep_alive, so clients meet server-closed pooled connections as in production.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, keepalive_timeout=args.timeout_keep_alive)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    log.info(
        "The server is fired up and ready to roll! http://%s:%d (simulator, pid %d)", args.host, args.port, os.getpid()
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_term() -> None:
        # Graceful shutdown: /health 503 at once, drain in-flight requests, then exit.
        sim.faults.health = "draining"
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_term)
    await stop.wait()
    deadline = time.monotonic() + args.drain_timeout
    while sim.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    log.info("drained; shutting down")
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="[%(asctime)s] %(levelname)s sim: %(message)s"
    )
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        asyncio.run(serve(args))
    except (OSError, ValueError, RuntimeError, SimConfigError) as e:  # profile/tokenizer/port: one line
        log.debug("startup failed", exc_info=True)
        log.error("%s: %s", type(e).__name__, e)
        sys.exit(2)


if __name__ == "__main__":
    main()
