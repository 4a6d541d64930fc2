"""Fleet-level faults of the simulator: the ways real SGLang deployments go wrong that are not a
protocol error of one request (taken by app.py, generate_route.py, engine.py and answer.py; set through
POST /_sim/faults like the others).

    {"error_body": N,                 next N /generate calls answer HTTP 200 {"error": {"message": ...}}
     "error_body_code": C,            (non-stream), or a 200 SSE stream carrying only that error chunk; with
                                      error_body_code the error object carries "code": C (null: none), e.g.
                                      2**40, a status no HTTP status is and no int32 holds
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
     "abort_status": N,               next N requests end aborted after half their tokens, finish_reason
     "abort_status_code": C,          {"type": "abort", "status_code": C} (default 2**40: no HTTP status, no
                                      int32 either), the message carrying hostile_text when set
     "bad_latency": N,                next N finished answers' meta_info e2e_latency written as a lie, K =
     "bad_latency_kind": K,           nan (NaN), negative (-2.5), huge (10**400: no float64 holds it) or
                                      long (one million seconds: longer than the request took)
     "meta_secret": N,                next N finished answers' meta_info carry the key
                                      "x_gateway_authorization": "Bearer <a token>" (a gateway echoing
                                      the Authorization header it forwarded into the answer)
     "double_think_end": N,           next N answers carry a second think-end id mid-answer: one answer id
                                      halfway between the first think-end and the end becomes think-end
                                      (an answer without one gets two), completion_tokens unchanged
     "stop_at_length": N,             next N answers cut at max_new_tokens report finish_reason
                                      {"type": "stop", "matched": null} instead of length (a proxy that
                                      rewrites finish reasons); answers that stop by themselves are not taken
     "trickle": N,                    next N requests never finish: after the response headers they send
     "trickle_every_s": S,            one byte (a space) every S seconds (default 2), or with
     "trickle_as": "bytes",           "trickle_as": "keepalive" on a stream an SSE comment event (":") every
                                      S seconds, until the client goes away or /abort_request names them
     "drafter_after": N,              with "next_draft_model_path": the next N /generate requests run under
     "next_draft_model_path": "x/y",  the current drafter, the one after switches the speculative drafter
                                      (its /server_info path and the figures of later answers): a drafter
                                      swapped under a running shard (a worker replaced behind a router, a
                                      quick restart between two health probes)
     "html": true,                    every SGLang route answers 200 text/html: the URL points at some
                                      other web server (the /_sim/ routes keep working)
     "report_version": "0.5.2",       /server_info `version` (an old server)
     "hostile_text": "\n... ESC[2J <b>", from now on every free text the server writes carries this text:
                                      /server_info `version` and the drafter's path and revision (a
                                      speculating server), the message of error bodies (fault error_body)
                                      and of aborts (faults stall, abort_status): a server that forges log
                                      lines, clears a terminal or injects HTML into whatever shows its words
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
    error_body_code: int | None = None
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
    hostile_text: str | None = None
    preferred_sampling_params: dict[str, Any] | None = None
    spec_inconsistent: int = 0
    spec_inconsistent_kind: str = "accept_length"
    spec_acceptance_scale: float = 1.0
    claimed_model: dict[str, Any] | None = None
    spec_names_unknown: bool = False
    abort_status: int = 0
    abort_status_code: int = 2**40
    bad_latency: int = 0
    bad_latency_kind: str = "nan"
    meta_secret: int = 0
    double_think_end: int = 0
    stop_at_length: int = 0
    trickle: int = 0
    trickle_every_s: float = 2.0
    trickle_as: str = "bytes"
    drafter_after: int = 0
    next_draft_model_path: str | None = None
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

    def take_abort_status(self) -> int | None:
        """The status_code this request's abort carries (fault abort_status), or None."""
        return self.abort_status_code if self._take("abort_status") else None

    def take_bad_latency(self) -> str | None:
        return self.bad_latency_kind if self._take("bad_latency") else None

    def take_meta_secret(self) -> bool:
        return self._take("meta_secret")

    def take_double_think_end(self) -> bool:
        return self._take("double_think_end")

    def take_stop_at_length(self, plan: Any) -> bool:
        """Only an answer cut at max_new_tokens can have its length finish disguised."""
        return (plan.finish_reason or {}).get("type") == "length" and self._take("stop_at_length")

    def take_trickle(self) -> bool:
        return self._take("trickle")

    def take_drafter_switch(self) -> str | None:
        """Per /generate request as it starts: the new drafter path once the armed switch fires, else None."""
        if self.next_draft_model_path is None:
            return None
        if self.drafter_after > 0:
            self.drafter_after -= 1
            return None
        path, self.next_draft_model_path = self.next_draft_model_path, None
        self.injected["drafter_change"] = self.injected.get("drafter_change", 0) + 1
        return path

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
LATENCY_LIES: dict[str, Any] = {"nan": float("nan"), "negative": -2.5, "huge": 10**400, "long": 1e6}
TRICKLE_SHAPES = ("bytes", "keepalive")
LEAKED_TOKEN = "Bearer sim-gw-token-5f1c2a9e7b3d"  # what the meta_secret fault echoes into meta_info


def lie_about_finished_meta(meta: dict[str, Any], latency: str | None, secret: bool) -> dict[str, Any]:
    """A finished answer's meta_info with the faults bad_latency (its e2e_latency) and meta_secret (a gateway's
    echo of the Authorization header) applied."""
    if latency is not None:
        meta = {**meta, "e2e_latency": LATENCY_LIES[latency]}
    if secret:
        meta = {**meta, "x_gateway_authorization": LEAKED_TOKEN}
    return meta


def double_think_end_plan(plan: Any, think_end_id: int) -> Any:
    """One id halfway between the first think-end and the end becomes think-end (two in an answer without
    one): a second `</think>` mid-answer; the length and the finish are unchanged."""
    ids = list(plan.output_ids)
    if len(ids) < 4:
        return plan
    first = ids.index(think_end_id) if think_end_id in ids else None
    spots = [len(ids) // 3, 2 * len(ids) // 3] if first is None else [(first + len(ids)) // 2]
    for i in spots:
        if i < len(ids) - 1 and ids[i] != think_end_id:
            ids[i] = think_end_id
    return replace(plan, output_ids=ids)


def stop_at_length_plan(plan: Any) -> Any:
    """A length cut reported as a stop that matched nothing."""
    return replace(plan, finish_reason={"type": "stop", "matched": None}, stop_trim=0)


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
        "abort_status",
        "abort_status_code",
        "bad_latency",
        "meta_secret",
        "double_think_end",
        "stop_at_length",
        "trickle",
        "drafter_after",
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
    _apply_shapes(ff, body)
    if "hostile_text" in body:
        v = body.pop("hostile_text")
        ff.hostile_text = None if v is None else str(v)
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


def _apply_shapes(ff: FleetFaults, body: dict[str, Any]) -> None:
    """The fleet keys that are not counts (popped from `body`); ValueError on a bad value."""
    if "error_body_code" in body:
        v = body.pop("error_body_code")
        ff.error_body_code = None if v is None else int(v)
    if "bad_latency_kind" in body:
        kind = str(body.pop("bad_latency_kind"))
        if kind not in LATENCY_LIES:
            raise ValueError(f"bad_latency_kind must be one of {', '.join(LATENCY_LIES)}")
        ff.bad_latency_kind = kind
    if "trickle_every_s" in body:
        every = float(body.pop("trickle_every_s"))
        if not every > 0:
            raise ValueError("trickle_every_s must be > 0")
        ff.trickle_every_s = every
    if "trickle_as" in body:
        shape = str(body.pop("trickle_as"))
        if shape not in TRICKLE_SHAPES:
            raise ValueError(f"trickle_as must be one of {', '.join(TRICKLE_SHAPES)}")
        ff.trickle_as = shape
    if "next_draft_model_path" in body:
        v = body.pop("next_draft_model_path")
        if v is not None and not str(v).strip():
            raise ValueError("next_draft_model_path must be a non-empty string or null")
        ff.next_draft_model_path = None if v is None else str(v)


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


def with_hostile(ff: FleetFaults, text: str) -> str:
    """`text` as a server with the fault hostile_text writes it (unchanged without the fault)."""
    return text + ff.hostile_text if ff.hostile_text else text


def error_body_response(stream: bool, message: str = ERROR_BODY_MESSAGE, code: int | None = None) -> bytes:
    """The payload of a 200 that is not a result (`code`: the error object's status code, when given)."""
    err: dict[str, Any] = {"error": {"message": message, **({"code": code} if code is not None else {})}}
    if stream:
        return f"data: {json.dumps(err, separators=(',', ':'))}\n\ndata: [DONE]\n\n".encode()
    return json.dumps(err, separators=(",", ":")).encode()
