"""Fleet-level faults of the simulator: the ways real SGLang deployments go wrong that are not a
protocol error of one request (taken by app.py, generate_route.py, engine.py and answer.py; set through
POST /_sim/faults like the others).

    {"error_body": N,                 next N /generate calls answer HTTP 200 {"error": {"message": ...}}
                                      (non-stream), or a 200 SSE stream carrying only that error chunk
     "stall": N,                      next N requests stop producing after `stall_after_tokens` tokens
                                      and stay silent with the connection open (until aborted or the
                                      client goes away): a stuck request, or a proxy that dropped it
     "stall_after_tokens": K,
     "nan_finish": N,                 next N requests finish {"type":"stop","matched":"NaN happened"} with
                                      the last id replaced by EOS (spec §3.3)
     "out_of_vocab": N,               next N requests have one output id (the first) replaced by an id >=
                                      the vocab size: a server sampling from a padded or another vocab
     "stale_answer": N,               next N requests answer 200 with the answer sent before (a stream:
                                      its last chunk): another request's rid and tokens, as from a proxy
                                      or cache that mixes up answers
     "same_answer": N,                next N requests answer with the output of the first request the fault
                                      took (its ids, text and finish), with their own rid and prompt_tokens:
                                      one answer for every prompt, as a response cache keyed on the wrong
                                      field sends it
     "unfinished": N,                 next N single requests end unfinished: a 200 answer whose meta_info
                                      finish_reason is null and that holds half the output ids (a proxy's
                                      snapshot of a running request); a stream: its final chunk is not sent
     "cut_stream": N,                 next N streamed requests end after their first chunk as a normal end of
                                      the response (the chunked body closed, no error): no final chunk, no
                                      [DONE]; a proxy or gateway that lost the stream upstream (an idle
                                      timeout, a crashed worker) and closes its own side cleanly. Requests
                                      without streaming do not take it
     "quote_headers": N,              next N /generate calls fail with a message quoting the request's
     "quote_headers_as": [...],       headers, Authorization included (as gateways and validation errors
                                      do), in the shapes listed, taken in turn: "http_400" (HTTP 400; in a
                                      stream the 200 error chunk with code 400), "error_body" (200
                                      {"error": ...}; in a stream the error chunk without a code) and
                                      "abort" (a stream's abort chunk, finish_reason.message and
                                      status_code 400; HTTP 400 without streaming, as SGLang's scheduler)
     "truncate_prompt": N,            next N requests lose their first `truncate_prompt_tokens` prompt ids
     "truncate_prompt_tokens": K,     before the server sees them (a gateway that truncates prompts): the
                                      answer is generated for the rest and prompt_tokens reports its count
     "float_ids": N,                  lying wire encodings of output ids, next N requests each (stream and
     "string_ids": N,                 non-stream alike; the ids the model produced are unchanged): float_ids
     "bool_ids": N,                   sends the first id as id + 0.5 and the second as a float (412.0),
     "negative_id": N,                string_ids the first as a JSON string, bool_ids the first as true,
     "huge_id": N,                    negative_id the first as -1 - id, huge_id the first as 2**31 + id
     "string_counts": N,              next N requests' meta_info prompt_tokens / completion_tokens /
                                      cached_tokens written as JSON strings (a re-encoding proxy)
     "string_finish": N,              next N requests' final meta_info finish_reason written as its type
                                      alone ("stop"), not SGLang's object
     "weight_version": "v2",          meta_info / model_info weight_version (weights updated in place)
     "weight_version_after": N,       with "next_weight_version": the next N /generate requests start
     "next_weight_version": "v2",     under the current version, the one after switches weight_version
                                      (answers still in flight then report the new one): a deterministic
                                      "weights updated under a running shard"
     "html": true,                    every SGLang route answers 200 text/html: the URL points at some
                                      other web server (the /_sim/ routes keep working)
     "report_version": "0.5.2",       /server_info `version` (an old server)
     "spec_inconsistent": N,          next N finished answers of a speculating simulator carry spec_* figures
     "spec_inconsistent_kind": K,     that do not add up: K = accept_length (off by 0.5), partial (rate and
                                      proposed missing), histogram (one step too many), negative (verify_ct);
                                      or that agree but no server produces: steps_beyond_tokens (one verify
                                      step more than tokens), histogram_length (ends in 0), huge_count
                                      (spec_verify_ct 2**70, beyond int64)
     "spec_acceptance_scale": 0.6,    from now on every draft's acceptance chance is scaled by this (0 < s <= 1;
                                      1: off): traffic the drafter knows less well, the figures still add up
     "spec_names_unknown": true,      from now on a speculating simulator sends its figures under names no SGLang
                                      release uses (speculative.UNKNOWN_NAMES): a release that renamed them again
     "preferred_sampling_params": {...}   what `--preferred-sampling-params` would show in /model_info
                                          (and merge under each request)
     "claimed_model": {"model_path": "Qwen/Qwen3-8B", "model_type": "qwen3", "architectures": [...]}
                                      from now on /model_info (and /server_info's model_path) name this
                                      model (any of the keys; null: the real one again) while the answers
                                      stay the profile's: a server of another model, or a sibling (Kimi-K2
                                      under a Kimi-K2.5 profile) that shares the tokenizer}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from aiohttp import web

from .speculative import INCONSISTENT_KINDS

HTML_PAGE = (
    b"<!DOCTYPE html><html><head><title>Welcome</title></head><body><h1>It works!</h1>"
    b"<p>This is not the service you are looking for.</p></body></html>"
)
QUOTE_SHAPES = ("http_400", "error_body", "abort")
ERROR_BODY_MESSAGE = (
    "The scheduler did not return an output for this request (detokenizer timeout). Please retry later."
)


@dataclass
class FleetFaults:
    error_body: int = 0
    stall: int = 0
    stall_after_tokens: int = 8
    nan_finish: int = 0
    out_of_vocab: int = 0
    stale_answer: int = 0
    same_answer: int = 0
    unfinished: int = 0
    cut_stream: int = 0
    quote_headers: int = 0
    quote_headers_as: list[str] = field(default_factory=lambda: ["http_400"])
    truncate_prompt: int = 0
    truncate_prompt_tokens: int = 2
    float_ids: int = 0
    string_ids: int = 0
    bool_ids: int = 0
    negative_id: int = 0
    huge_id: int = 0
    string_counts: int = 0
    string_finish: int = 0
    weight_version: str = "default"
    weight_version_after: int = 0
    next_weight_version: str | None = None
    html: bool = False
    report_version: str | None = None
    preferred_sampling_params: dict[str, Any] | None = None
    spec_inconsistent: int = 0
    spec_inconsistent_kind: str = "accept_length"
    spec_acceptance_scale: float = 1.0
    claimed_model: dict[str, Any] | None = None
    spec_names_unknown: bool = False
    injected: dict[str, int] = field(default_factory=dict)
    # the plan every same_answer request gets: the first one it took (not a setting: as_dict leaves it out)
    same_answer_plan: Any = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("injected", "same_answer_plan")}

    def _take(self, name: str) -> bool:
        n = getattr(self, name)
        if n > 0:
            setattr(self, name, n - 1)
            self.injected[name] = self.injected.get(name, 0) + 1
            return True
        return False

    def take_error_body(self) -> bool:
        return self._take("error_body")

    def take_stall(self) -> int | None:
        """The token count after which this request goes silent, or None."""
        return self.stall_after_tokens if self._take("stall") else None

    def take_nan(self) -> bool:
        return self._take("nan_finish")

    def take_out_of_vocab(self) -> bool:
        return self._take("out_of_vocab")

    def take_stale_answer(self) -> bool:
        return self._take("stale_answer")

    def same_answer_for(self, plan: Any) -> Any:
        """The plan this request answers with: the first same_answer request's for every one the fault takes."""
        if not self._take("same_answer"):
            return plan
        if self.same_answer_plan is None:
            self.same_answer_plan = plan
        return self.same_answer_plan

    def take_unfinished(self) -> bool:
        return self._take("unfinished")

    def take_cut_stream(self) -> bool:
        return self._take("cut_stream")

    def take_quote_headers(self) -> str | None:
        """The shape of this request's header-quoting error, or None (shapes taken in turn)."""
        if not self._take("quote_headers"):
            return None
        n = self.injected["quote_headers"] - 1
        return self.quote_headers_as[n % len(self.quote_headers_as)]

    def take_spec_inconsistent(self) -> str | None:
        """How this request's spec figures are to be broken (a speculating simulator), or None."""
        return self.spec_inconsistent_kind if self._take("spec_inconsistent") else None

    def take_truncate(self) -> int:
        """How many leading prompt ids this request loses (0: none)."""
        return self.truncate_prompt_tokens if self._take("truncate_prompt") else 0

    def take_wire_lie(self) -> str | None:
        """Which lying encoding this request's output ids get on the wire (WIRE_LIES), or None."""
        return next((name for name in WIRE_LIES if self._take(name)), None)

    def note_request(self) -> None:
        """Called once per /generate request as it starts: the armed weight-version switch counts down."""
        if self.next_weight_version is None:
            return
        if self.weight_version_after > 0:
            self.weight_version_after -= 1
            return
        self.weight_version, self.next_weight_version = self.next_weight_version, None
        self.injected["weight_version_change"] = self.injected.get("weight_version_change", 0) + 1


WIRE_LIES = ("float_ids", "string_ids", "bool_ids", "negative_id", "huge_id", "string_counts", "string_finish")
COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def lie_about_meta(meta: dict[str, Any], lie: str | None) -> dict[str, Any]:
    """`meta` as a lying server writes it: string_counts, its token counts as JSON strings; string_finish,
    a finish_reason object as its type alone."""
    if lie == "string_counts":
        return {k: str(v) if k in COUNTS and v is not None else v for k, v in meta.items()}
    fr = meta.get("finish_reason")
    if lie == "string_finish" and isinstance(fr, dict):
        return {**meta, "finish_reason": fr.get("type")}
    return meta


def lie_about_ids(ids: list[int], lie: str | None) -> list[Any]:
    """`ids` as a lying server writes them (fleet faults WIRE_LIES); the first id (and for float_ids the
    second) changed, the rest as produced."""
    out: list[Any] = list(ids)
    if not out or lie is None:
        return out
    first = out[0]
    if lie == "float_ids":
        out[0] = first + 0.5
        if len(out) > 1:
            out[1] = float(out[1])
    elif lie == "string_ids":
        out[0] = str(first)
    elif lie == "bool_ids":
        out[0] = True
    elif lie == "negative_id":
        out[0] = -1 - first
    elif lie == "huge_id":
        out[0] = 2**31 + first
    return out


def apply(ff: FleetFaults, body: dict[str, Any]) -> FleetFaults:
    """Apply the fleet keys of a POST /_sim/faults body (popped from it); raises ValueError on bad values."""
    for k in (
        "error_body",
        "stall",
        "stall_after_tokens",
        "nan_finish",
        "out_of_vocab",
        "stale_answer",
        "same_answer",
        "unfinished",
        "cut_stream",
        "quote_headers",
        "truncate_prompt",
        "truncate_prompt_tokens",
        *WIRE_LIES,
        "weight_version_after",
        "spec_inconsistent",
    ):
        if k in body:
            v = int(body.pop(k) or 0)
            if v < 0:
                raise ValueError(f"{k} must be >= 0")
            setattr(ff, k, v)
    if "quote_headers_as" in body:
        v = body.pop("quote_headers_as")
        shapes = [v] if isinstance(v, str) else v
        if not isinstance(shapes, list) or not shapes or any(x not in QUOTE_SHAPES for x in shapes):
            raise ValueError(f"quote_headers_as must be one or a list of {', '.join(QUOTE_SHAPES)}")
        ff.quote_headers_as = list(shapes)
    if "weight_version" in body:
        ff.weight_version = str(body.pop("weight_version"))
    if "next_weight_version" in body:
        v = body.pop("next_weight_version")
        if v is not None and not str(v).strip():
            raise ValueError("next_weight_version must be a non-empty string or null")
        ff.next_weight_version = None if v is None else str(v)
    if "spec_inconsistent_kind" in body:
        kind = str(body.pop("spec_inconsistent_kind"))
        if kind not in INCONSISTENT_KINDS:
            raise ValueError(f"spec_inconsistent_kind must be one of {', '.join(INCONSISTENT_KINDS)}")
        ff.spec_inconsistent_kind = kind
    if "spec_acceptance_scale" in body:
        scale = float(body.pop("spec_acceptance_scale"))
        if not 0 < scale <= 1:
            raise ValueError("spec_acceptance_scale must be in (0, 1]")
        ff.spec_acceptance_scale = scale
    if "html" in body:
        ff.html = bool(body.pop("html"))
    if "spec_names_unknown" in body:
        ff.spec_names_unknown = bool(body.pop("spec_names_unknown"))
    if "report_version" in body:
        v = body.pop("report_version")
        ff.report_version = None if v is None else str(v)
    if "preferred_sampling_params" in body:
        v = body.pop("preferred_sampling_params")
        if v is not None and not isinstance(v, dict):
            raise ValueError("preferred_sampling_params must be an object or null")
        ff.preferred_sampling_params = v
    if "claimed_model" in body:
        ff.claimed_model = _claimed_model(body.pop("claimed_model"))
    return ff


CLAIMABLE = ("model_path", "model_type", "architectures")


def _claimed_model(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict) or not v or set(v) - set(CLAIMABLE):
        raise ValueError(f"claimed_model must be null or an object with some of {', '.join(CLAIMABLE)}")
    return dict(v)


def claimed(ff: FleetFaults, key: str, real: Any) -> Any:
    """What /model_info says for `key`: the fault claimed_model's value when it names one, else the real one."""
    claim = ff.claimed_model or {}
    return claim.get(key, real)


def preferred_for_model_info(ff: FleetFaults) -> str | None:
    # SGLang shows the CLI's JSON string (server_args.preferred_sampling_params), not an object.
    return None if ff.preferred_sampling_params is None else json.dumps(ff.preferred_sampling_params)


def nan_plan(plan: Any, eos_id: int) -> Any:
    """SGLang's NaN guard: the last sampled id becomes EOS and the finish says so."""
    ids = list(plan.output_ids) or [eos_id]
    ids[-1] = eos_id
    return replace(plan, output_ids=ids, finish_reason={"type": "stop", "matched": "NaN happened"}, stop_trim=1)


def out_of_vocab_plan(plan: Any, vocab_size: int) -> Any:
    """The first output id replaced by one past the vocabulary (`vocab_size + 3`): a sampled padding row."""
    ids = list(plan.output_ids)
    if ids:
        ids[0] = vocab_size + 3
    return replace(plan, output_ids=ids)


def unfinished_answer(body: dict[str, Any]) -> dict[str, Any]:
    """A non-stream answer as if read while its request was still running: half its output ids (and about
    half its text), completion_tokens to match, finish_reason null (SGLang's meta_info before the finish)."""
    ids = list(body.get("output_ids") or [])
    keep = len(ids) // 2
    meta = {**(body.get("meta_info") or {}), "finish_reason": None, "completion_tokens": keep}
    text = str(body.get("text") or "")
    return {**body, "output_ids": ids[:keep], "text": text[: len(text) // 2], "meta_info": meta}


def html_middleware(get_faults: Any) -> Any:
    @web.middleware
    async def mw(request: web.Request, handler: Any) -> web.StreamResponse:
        if get_faults().html and not request.path.startswith("/_sim/"):
            return web.Response(body=HTML_PAGE, status=200, content_type="text/html")
        return await handler(request)

    return mw


def quoted_request(request: web.Request) -> str:
    """A refusal that quotes the request's headers back, as a gateway or a validation error does."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    return f"Request rejected by the gateway: {request.method} {request.path} headers={headers!r}"


def error_body_response(stream: bool, message: str = ERROR_BODY_MESSAGE) -> bytes:
    """The payload of a 200 that is not a result."""
    err = {"error": {"message": message}}
    if stream:
        return f"data: {json.dumps(err, separators=(',', ':'))}\n\ndata: [DONE]\n\n".encode()
    return json.dumps(err, separators=(",", ":")).encode()
