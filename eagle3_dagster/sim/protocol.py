"""SGLang `/generate` protocol rules, as pure functions (no HTTP): parsing, validation, generation.

Follows /work/shared/specs/sglang-generate.md (§2-§4, §9). The two version profiles differ in:
unknown/mistyped sampling keys (0.5.23: 400 contract gate; 0.5.9: 500 plain text), the
context check (`>` vs `>=`), rid duplicate checks, stop-vs-length precedence and meta_info keys.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import OutputModel

V0_5_23 = "0.5.23"
V0_5_9 = "0.5.9"
VERSIONS = (V0_5_23, V0_5_9)

# Sampling keys the 0.5.23 contract gate knows, with the serde type it expects.
SAMPLING_TYPES: dict[str, str] = {
    "max_new_tokens": "i32",
    "min_new_tokens": "i32",
    "temperature": "f32",
    "top_p": "f32",
    "top_k": "i32",
    "min_p": "f32",
    "frequency_penalty": "f32",
    "presence_penalty": "f32",
    "repetition_penalty": "f32",
    "stop": "str_or_seq",
    "stop_regex": "str_or_seq",
    "stop_token_ids": "seq_int",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "spaces_between_special_tokens": "bool",
    "no_stop_trim": "bool",
    "n": "i32",
    "sampling_seed": "i64",
    "json_schema": "str",
    "regex": "str",
    "ebnf": "str",
    "structural_tag": "str",
    "logit_bias": "map",
    "stream_interval": "i32",
    "custom_params": "map",
    "beam_width": "i32",
    "watermark": "map",
    "choice": "seq",
}
_V059_ONLY_MISSING = {"beam_width", "watermark", "choice"}  # 0.5.23-only keys: TypeError in 0.5.9


class SimError(Exception):
    """An error that maps to one HTTP answer. `kind` picks the body shape (spec §4.1)."""

    def __init__(self, status: int, message: str, kind: str = "value") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind  # value | pydantic | contract | internal | scheduler


@dataclass
class Sampling:
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    stream_interval: int | None = None
    grammar_count: int = 0


@dataclass
class Item:
    """One scheduler request after normalization."""

    rid: str
    input_ids: list[int]
    sampling: Sampling
    index: int  # position in the expanded response list
    sample_index: int = 0
    return_logprob: bool = False
    top_logprobs_num: int = 0


@dataclass
class Parsed:
    items: list[Item]
    is_single: bool  # answer a dict (else a list)
    stream: bool
    raw_sampling: list[dict[str, Any]]


# ---------------------------------------------------------------------------------------------
# Body shape ("pydantic") checks


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _pyd(msg: str) -> SimError:
    # FastAPI's RequestValidationError text, rewritten to 400 by SGLang's handler.
    return SimError(400, msg, "pydantic")


def check_shape(body: Any) -> None:
    if not isinstance(body, dict):
        raise _pyd(
            "1 validation error for GenerateReqInput: Input should be a valid dictionary "
            f"[{{'type': 'model_attributes_type', 'loc': ('body',), 'input': {body!r:.80}}}]"
        )
    ids = body.get("input_ids")
    if ids is not None:
        ok = isinstance(ids, list) and (
            all(_is_int(x) for x in ids) or all(isinstance(r, list) and all(_is_int(x) for x in r) for r in ids)
        )
        if not ok:
            raise _pyd(
                "1 validation error for GenerateReqInput: input_ids: Input should be a valid "
                f"list of integers or a list of lists of integers [{{'type': 'list_type', "
                f"'loc': ('body', 'input_ids'), 'input': {ids!r:.80}}}]"
            )
    sp = body.get("sampling_params")
    if sp is not None and not (isinstance(sp, dict) or (isinstance(sp, list) and all(isinstance(d, dict) for d in sp))):
        raise _pyd(
            "1 validation error for GenerateReqInput: sampling_params: Input should be a valid "
            f"dictionary [{{'type': 'dict_type', 'loc': ('body', 'sampling_params'), 'input': {sp!r:.80}}}]"
        )
    rid = body.get("rid")
    if rid is not None and not (
        isinstance(rid, str) or (isinstance(rid, list) and all(isinstance(r, str) for r in rid))
    ):
        raise _pyd(
            "1 validation error for GenerateReqInput: rid: Input should be a valid string "
            f"[{{'type': 'string_type', 'loc': ('body', 'rid'), 'input': {rid!r:.80}}}]"
        )
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _pyd(
            "1 validation error for GenerateReqInput: stream: Input should be a valid boolean "
            f"[{{'type': 'bool_type', 'loc': ('body', 'stream'), 'input': {body['stream']!r:.80}}}]"
        )
    if "text" in body and body["text"] is not None and not isinstance(body["text"], (str, list)):
        raise _pyd("1 validation error for GenerateReqInput: text: Input should be a valid string")


# ---------------------------------------------------------------------------------------------
# Sampling params: contract gate (0.5.23) / TypeError (0.5.9), then range checks


def _serde_unexpected(v: Any) -> str:
    if isinstance(v, bool):
        return f"boolean `{str(v).lower()}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "a sequence"
    if isinstance(v, dict):
        return "a map"
    return "null"


def _type_ok(kind: str, v: Any) -> tuple[bool, str]:
    if v is None:
        return True, ""
    if kind in ("i32", "i64"):
        return _is_int(v), kind
    if kind == "f32":
        return (isinstance(v, (int, float)) and not isinstance(v, bool)), "f32"
    if kind == "bool":
        return isinstance(v, bool), "a boolean"
    if kind == "str":
        return isinstance(v, str), "a string"
    if kind == "str_or_seq":
        return isinstance(v, str) or (
            isinstance(v, list) and all(isinstance(s, str) for s in v)
        ), "string or sequence of strings"
    if kind == "seq_int":
        return isinstance(v, list) and all(_is_int(s) for s in v), "a sequence of integers"
    if kind == "map":
        return isinstance(v, dict), "a map"
    if kind == "seq":
        return isinstance(v, list), "a sequence"
    return True, ""


def gate_sampling(sp: dict[str, Any], version: str) -> None:
    """Unknown keys and wrong JSON types: 0.5.23 400 `{"error": str}`; 0.5.9 500 plain text."""
    known = [k for k in SAMPLING_TYPES if not (version == V0_5_9 and k in _V059_ONLY_MISSING)]
    for k, v in sp.items():
        if k not in known:
            if version == V0_5_9:
                raise SimError(500, "Internal Server Error", "internal")
            exp = ", ".join(f"`{x}`" for x in known)
            raise SimError(400, f"unknown field `{k}`, expected one of {exp}", "contract")
        kind = SAMPLING_TYPES[k]
        if version == V0_5_9:
            # No schema: Python compares e.g. a str with a number in verify() -> TypeError -> 500.
            # A float where an int is expected passes, as in Python.
            numeric = kind in ("i32", "i64", "f32")
            if numeric and v is not None and not isinstance(v, (int, float)):
                raise SimError(500, "Internal Server Error", "internal")
            continue
        ok, expected = _type_ok(kind, v)
        if not ok:
            raise SimError(400, f"invalid type: {_serde_unexpected(v)}, expected {expected}", "contract")


def _fmt(x: Any) -> str:
    return repr(x) if isinstance(x, float) else str(x)


def to_sampling(sp: dict[str, Any]) -> Sampling:
    s = Sampling()
    for k in (
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "n",
        "sampling_seed",
        "stream_interval",
    ):
        if k in sp and (sp[k] is not None or k in ("max_new_tokens", "sampling_seed", "stream_interval")):
            v = sp[k]
            if isinstance(getattr(Sampling, k, None), int) and isinstance(v, float) and not isinstance(v, bool):
                v = int(v)  # 0.5.9 lets 8.0 through where an int belongs
            setattr(s, k, v)
    stop = sp.get("stop")
    s.stop = [stop] if isinstance(stop, str) else list(stop or [])
    s.stop_token_ids = list(sp.get("stop_token_ids") or [])
    s.grammar_count = sum(1 for k in ("regex", "json_schema", "ebnf") if sp.get(k) is not None)
    return s


def check_ranges(s: Sampling, version: str) -> None:
    """Range checks with SGLang's exact messages (§2.3); ValueError -> 400."""

    def bad(msg: str) -> SimError:
        return SimError(400, msg)

    if s.temperature < 0 or (version == V0_5_23 and not math.isfinite(s.temperature)):
        raise bad(f"temperature must be non-negative, got {_fmt(s.temperature)}.")
    if not 0 < s.top_p <= 1:
        raise bad(f"top_p must be in (0, 1], got {_fmt(s.top_p)}.")
    if not 0 <= s.min_p <= 1:
        raise bad(f"min_p must be in [0, 1], got {_fmt(s.min_p)}.")
    if s.top_k < 1 and s.top_k != -1:
        raise bad(f"top_k must be -1 (disable) or at least 1, got {s.top_k}.")
    if not -2 <= s.frequency_penalty <= 2:
        raise bad(f"frequency_penalty must be in [-2, 2], got {_fmt(s.frequency_penalty)}.")
    if not -2 <= s.presence_penalty <= 2:
        raise bad(f"presence_penalty must be in [-2, 2], got {_fmt(s.presence_penalty)}.")
    lo_ok = s.repetition_penalty > 0 if version == V0_5_23 else s.repetition_penalty >= 0
    if not (lo_ok and s.repetition_penalty <= 2):
        rng = "(0, 2]" if version == V0_5_23 else "[0, 2]"
        raise bad(f"repetition_penalty must be in {rng}, got {_fmt(s.repetition_penalty)}.")
    if s.max_new_tokens is not None and s.max_new_tokens < 0:
        raise bad(f"max_new_tokens must be at least 0, got {s.max_new_tokens}.")
    if s.max_new_tokens is not None and not 0 <= s.min_new_tokens <= s.max_new_tokens:
        raise bad(f"min_new_tokens must be in [0, max_new_tokens({s.max_new_tokens})], got {s.min_new_tokens}.")
    if s.grammar_count > 1:
        raise bad("Only one of regex, json_schema, or ebnf can be set.")
    if version == V0_5_23 and len(s.stop) > 32:
        raise bad(f"stop must have at most 32 entries, got {len(s.stop)}.")


# ---------------------------------------------------------------------------------------------
# Normalization: single vs batch, rid rules, n expansion


def parse_generate(body: dict[str, Any], version: str, in_flight: set[str] | None = None) -> Parsed:
    """A /generate body as SGLang's GenerateReqInput normalizes it: one scheduler item per prompt and sample."""
    check_shape(body)
    prompts, is_batch = _prompts(body.get("input_ids"))
    sp_list, n = _sampling_list(body.get("sampling_params"), len(prompts), is_batch, version)
    expanded = is_batch or n > 1
    rids = _rids(body.get("rid"), len(prompts), expanded, version)
    if version == V0_5_23 and in_flight:
        for r in rids:
            if r in in_flight:
                raise SimError(400, f"Duplicate request ID detected: {r}")
    ret_lp = body.get("return_logprob") or False
    top_lp = body.get("top_logprobs_num") or 0
    if n > 1 and (isinstance(ret_lp, list) or isinstance(top_lp, list)):
        raise SimError(400, "Cannot use list return_logprob with parallel_sample_num > 1")
    items: list[Item] = []
    for i, (p, sp) in enumerate(zip(prompts, sp_list)):
        s = to_sampling(sp)
        lp = ret_lp[i] if isinstance(ret_lp, list) and i < len(ret_lp) else ret_lp
        tl = top_lp[i] if isinstance(top_lp, list) and i < len(top_lp) else top_lp
        for j in range(n):
            # n>1: every sample gets a fresh uuid rid (meta_info.id != the user's rid), prompt-major.
            r = rids[i] if n == 1 else uuid.uuid4().hex
            items.append(
                Item(r, p, s, len(items), sample_index=j, return_logprob=bool(lp), top_logprobs_num=int(tl or 0))
            )
    return Parsed(items, is_single=not expanded, stream=bool(body.get("stream", False)), raw_sampling=sp_list)


def _prompts(ids: Any) -> tuple[list[list[int]], bool]:
    """The prompts of `input_ids` (one, or a batch) and whether it is a batch."""
    if ids is None:
        raise SimError(400, "Either text, input_ids or input_embeds should be provided.")
    if len(ids) == 0:
        raise SimError(400, "input_ids cannot be empty.")
    is_batch = not _is_int(ids[0])
    prompts: list[list[int]] = [list(p) for p in ids] if is_batch else [list(ids)]
    if any(len(p) == 0 for p in prompts):
        raise SimError(400, "input_ids cannot be empty.")
    return prompts, is_batch


def _sampling_list(sp_raw: Any, b: int, is_batch: bool, version: str) -> tuple[list[dict[str, Any]], int]:
    """One sampling_params dict per prompt (a single dict is shared), each through the contract gate, and the
    parallel sample count `n` they agree on."""
    if sp_raw is None:
        sp_list: list[dict[str, Any]] = [{} for _ in range(b)]
    elif isinstance(sp_raw, dict):
        sp_list = [sp_raw] * b
    elif not is_batch:
        sp_list = sp_raw[:1] if sp_raw else [{}]
    else:
        sp_list = list(sp_raw)
        if len(sp_list) != b:
            raise SimError(400, "The length of sampling_params should be equal to the batch size.")
    for sp in sp_list:
        gate_sampling(sp, version)
    ns = {int(sp.get("n") or 1) for sp in sp_list}
    if len(ns) > 1:
        raise SimError(400, "The parallel_sample_num should be the same for all samples in sample params.")
    return sp_list, ns.pop()


def _rids(rid: Any, b: int, expanded: bool, version: str) -> list[str]:
    """The request ids of `b` prompts: the user's (`x` becomes x_0, x_1, ... for a batch) or fresh uuids."""
    if not expanded:
        if isinstance(rid, list):
            return [rid[0]] if rid else [uuid.uuid4().hex]
        return [rid if isinstance(rid, str) else uuid.uuid4().hex]
    if rid is None:
        rids = [uuid.uuid4().hex for _ in range(b)]
    elif isinstance(rid, str):
        rids = [f"{rid}_{i}" for i in range(b)]
    else:
        if len(rid) != b:
            raise SimError(400, "The specified rids length mismatch with the batch_size for batch processing.")
        rids = list(rid)
    if version == V0_5_23:
        dups = sorted({r for r in rids if rids.count(r) > 1})
        if dups:
            raise SimError(400, f"Duplicate request IDs detected within the request: {dups}")
    return rids


def feature_checks(body: dict[str, Any], version: str) -> None:
    """Feature flags that are off on a default server (§2.1)."""
    if body.get("return_hidden_states"):
        flag = "--enable-return-hidden-states" if version == V0_5_9 else "--return-hidden-states-mode"
        raise SimError(
            400,
            f"The server is not configured to return the hidden states. Please set `{flag}` to enable this feature.",
        )
    if body.get("custom_logit_processor"):
        raise SimError(
            400,
            "The server is not configured to enable custom logit processor. Please set `--enable-custom-logit-processor` to enable this feature.",
        )
    if version == V0_5_23 and body.get("max_thinking_tokens") is not None:
        raise SimError(400, "max_thinking_tokens requires --enable-strict-thinking.")


def context_checks(item: Item, context_length: int, version: str, *, allow_auto_truncate: bool = False) -> None:
    """Tokenizer-side length checks (§4.2); run before sampling range checks (§9.4).

    As SGLang's TokenizerManager._validate_one_request: a prompt of >= context_length tokens, then (0.5.23)
    prompt + max_new_tokens > context_length (0.5.9: >=) are refused with 400, unless the server runs with
    --allow-auto-truncate: then the prompt is cut to context_length and max_new_tokens lowered to
    max(0, context_length - prompt tokens), in place.
    """
    n = len(item.input_ids)
    if n >= context_length:
        if not allow_auto_truncate:
            raise SimError(
                400, f"The input ({n} tokens) is longer than the model's context length ({context_length} tokens)."
            )
        del item.input_ids[context_length:]
        n = len(item.input_ids)
    m = item.sampling.max_new_tokens
    if m is not None:
        total = n + m
        too_long = total >= context_length if version == V0_5_9 else total > context_length
        if too_long and allow_auto_truncate:
            item.sampling.max_new_tokens = max(0, context_length - n)
        elif too_long:
            raise SimError(
                400,
                f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
                f"You requested a total of {total} tokens: {n} tokens from the input messages and {m} tokens "
                "for the completion. Please reduce the number of tokens in the input messages or the completion "
                "to fit within the limit.",
            )


def scheduler_check(item: Item, max_req_input_len: int) -> None:
    n = len(item.input_ids)
    if n >= max_req_input_len:
        raise SimError(
            400,
            f"Input length ({n} tokens) exceeds the maximum allowed length ({max_req_input_len} "
            "tokens). Use a shorter input or enable --allow-auto-truncate.",
            "scheduler",
        )


# ---------------------------------------------------------------------------------------------
# Generation: apply sampling params to the model's script


@dataclass
class Plan:
    """What a request will produce if it runs to completion."""

    output_ids: list[int]
    finish_reason: dict[str, Any]
    stop_trim: int  # trailing tokens to drop from `text` (the matched stop token)
    stop_str: str | None = None


def effective_max_new(item: Item, max_req_len: int) -> int:
    """SGLang's scheduler clamp (0.5.23 scheduler.py): min(max_new_tokens, max_req_len - prompt - 1), at least 0,
    where max_req_len = min(context_len - 1, KV tokens - 1) (tp_worker.py): a request that passed the
    tokenizer's prompt + max_new_tokens <= context_len check still generates at most context_len - prompt - 2."""
    n = len(item.input_ids)
    cap = max(0, max_req_len - n - 1)
    m = item.sampling.max_new_tokens
    return cap if m is None else min(m, cap)


def plan_output(
    model: OutputModel, item: Item, *, eos_ids: Sequence[int], max_req_len: int, version: str, mode: str = "normal"
) -> Plan:
    s = item.sampling
    script = model.script(item.input_ids, item.sample_index, s.sampling_seed)
    stop_set = set() if s.ignore_eos else set(eos_ids) | set(s.stop_token_ids)
    drop = model.profile.think_end_id if mode == "drop-think-end" else None
    max_new = effective_max_new(item, max_req_len)
    out: list[int] = []

    def candidates():
        # The intended output, then (if EOS was masked or ignored) more text and EOS, forever.
        yield from script.ids
        while True:
            yield from script.filler
            yield model.profile.end_of_turn_id

    stop_strs = [x for x in s.stop if x]
    text_so_far = ""
    for c in candidates():
        if len(out) >= max_new:
            return Plan(out, {"type": "length", "length": max_new}, 0)
        if c == drop:
            continue
        if c in stop_set and len(out) < s.min_new_tokens:
            continue  # min_new_tokens masks the stop tokens, so the model says something else
        out.append(c)
        at_len = len(out) >= max_new
        if version == V0_5_9 and at_len:
            return Plan(out, {"type": "length", "length": max_new}, 0)
        if stop_strs:
            text_so_far = model.tok.decode(out, skip_special_tokens=False)
            hit = next((x for x in stop_strs if x in text_so_far), None)
            if hit is not None:
                return Plan(out, {"type": "stop", "matched": hit}, 0, stop_str=hit)
        if c in stop_set:
            return Plan(out, {"type": "stop", "matched": c}, 1)
        if at_len:
            return Plan(out, {"type": "length", "length": max_new}, 0)
    raise AssertionError("unreachable")


def render_text(model: OutputModel, ids: Sequence[int], plan_trim: int, s: Sampling, stop_str: str | None) -> str:
    """`text` per §3.3: drop the matched stop token unless no_stop_trim; cut at a stop string."""
    keep = list(ids)
    if plan_trim and not s.no_stop_trim:
        keep = keep[:-plan_trim]
    text = model.tok.decode(keep, skip_special_tokens=s.skip_special_tokens)
    if stop_str:
        i = text.find(stop_str)
        if i >= 0:
            text = text[: i + len(stop_str)] if s.no_stop_trim else text[:i]
    return text
