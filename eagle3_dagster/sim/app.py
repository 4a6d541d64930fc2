"""The routes of `eagle3-sim`, an SGLang-protocol simulator (native `/generate`, no GPU), built on aiohttp.web.

It follows /work/shared/specs/sglang-generate.md so the generation client runs unchanged against it.
Version profiles `--version 0.5.23` (default) and `0.5.9` switch the documented differences; `--spec-names
RELEASE` picks the release whose acceptance-figure names a speculating simulator speaks (sim/speculative.py),
reported as its /server_info version.

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
       with the connection open), "nan_finish", "out_of_vocab" (an output id >= the vocab size),
       "stale_answer" (the answer sent before: another rid's), "unfinished" (finish_reason null, half
       the ids; a stream without its final chunk), "cut_stream" (a stream that ends cleanly after its first
       chunk, without [DONE]), "quote_headers" (errors quoting the request's headers,
       Authorization included), "truncate_prompt" (a gateway cut the prompt: prompt_tokens reports the
       rest), "float_ids" / "string_ids" / "bool_ids" / "negative_id" / "huge_id" (output ids written as
       no SGLang writes them), "string_counts" (meta_info counts as strings), "string_finish"
       (finish_reason "stop", not an object), "weight_version", "html" (not SGLang at all),
       "report_version", "preferred_sampling_params", "same_answer" (one answer for every prompt, each
       with its own rid and prompt_tokens), "claimed_model" (/model_info names another model),
       "spec_inconsistent", "spec_acceptance_scale", "spec_names_unknown" (a speculating simulator's figures
       under names no SGLang release uses), "hostile_text" (control characters and HTML in every
       free text), "error_body_code", "abort_status", "bad_latency", "meta_secret" (a Bearer echo in
       meta_info), "double_think_end", "stop_at_length" (a length cut reported as a stop), "trickle" (never
       finishes: a byte every few seconds), "drafter_after" + "next_draft_model_path" (a drafter swap)
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

import hmac
import json
import logging
from typing import Any

from aiohttp import web

from . import fleet_faults as FF
from . import protocol as P
from .admin import apply_fault_body, stats_payload
from .engine import Engine
from .generate_route import GenerateRoutes
from .responses import dumps, json_response
from .state import Sim

log = logging.getLogger("eagle3_dagster.sim")

_FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)


class Handlers(GenerateRoutes):
    """Every route but /generate (generate_route.py); `build_app` wires them."""

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
        path = FF.claimed(sim.fleet, "model_path", sim.args.model_path)
        d: dict[str, Any] = {
            "model_path": path,
            "tokenizer_path": path,
            "is_generation": True,
            "preferred_sampling_params": FF.preferred_for_model_info(sim.fleet),
            "weight_version": sim.fleet.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": FF.claimed(sim.fleet, "model_type", sim.args.model_type),
            "architectures": FF.claimed(sim.fleet, "architectures", [sim.args.architecture]),
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
        path = FF.claimed(sim.fleet, "model_path", a.model_path)
        d: dict[str, Any] = {
            "model_path": path,
            "tokenizer_path": path,
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
            "allow_auto_truncate": sim.allow_auto_truncate,
            "disable_radix_cache": False,
            "schedule_policy": "fcfs",
            "max_total_num_tokens": sim.max_total_num_tokens,
            "max_req_input_len": sim.max_req_input_len,
            **_hostile_drafter(sim.spec.server_info(), sim.fleet),
            "internal_states": [
                {
                    "last_gen_throughput": 0.0 if not sim.running else 1000.0 / max(sim.faults.slow_tokens_ms, 1e-3),
                    "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": sim.max_total_num_tokens},
                    "effective_max_running_requests_per_dp": a.max_running_requests,
                    "num_running_reqs": sim.running,
                    "num_waiting_reqs": sim.waiting,
                }
            ],
            "version": FF.with_hostile(sim.fleet, sim.fleet.report_version or sim.release),
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
            f = apply_fault_body(self.sim, json.loads(await request.read() or b"{}"))
        except (ValueError, TypeError) as e:
            return json_response({"error": str(e)}, 400)
        self.sim.faults = f
        log.info("faults now %s %s", f.as_dict(), self.sim.fleet.as_dict())
        return json_response({**f.as_dict(), **self.sim.fleet.as_dict()})

    async def get_stats(self, request: web.Request) -> web.Response:
        return json_response(stats_payload(self.sim, with_rids=bool(request.query.get("rids"))))

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


def _hostile_drafter(info: dict[str, Any], fleet: FF.FleetFaults) -> dict[str, Any]:
    """The drafter's /server_info keys, its path and revision carrying the fleet fault hostile_text."""
    if info.get("speculative_algorithm") is None:
        return info
    keys = ("speculative_draft_model_path", "speculative_draft_model_revision")
    return {k: FF.with_hostile(fleet, str(v or "")) if k in keys else v for k, v in info.items()}


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
