"""Every 200 answer is a claim about the request it came back on: checked here, in one place, before
it becomes a row.

`check_answer(sent, answer)` takes what was sent (`Sent`: the input ids, max_new_tokens, the rid, the
vocabulary size, the shard's weight version) and the answer as parsed from the wire (a non-stream body,
or a stream folded into one body by sse.read_stream: cumulative or delta), and returns either
`Refused` (a reason code and a detail naming the field and the values) or `Accepted` (the answer and
its flags, the row's `integrity_violations`). A refused answer becomes a failed request with its
reason in errors.parquet, never a stored row and never an exception: one bad answer must not crash
the shard's step (Dagster would retry the whole step and send every request again).

Refused (none is permanent: the request was valid, the server or something between it and the
client answered wrongly; the next run sends it again, so a fixed server or gateway heals the shard):

* `answer_rid_mismatch`: `meta_info.id` names another rid (SGLang echoes the request's rid), so the
  answer holds another request's tokens (a proxy or cache mixed answers up). An answer without
  `meta_info.id` (an older or non-SGLang server) is not judged on it.
* `prompt_tokens_mismatch`: `meta_info.prompt_tokens` differs from the number of input ids sent.
  SGLang 0.5.23 reports `len(req.origin_input_ids)` (scheduler output_streamer), the ids as sent
  unless `--allow-auto-truncate` cut them: either way an answer counting other prompt tokens was
  generated for another prompt (a gateway that truncated it). A missing prompt_tokens (SGLang always
  sends it; an older or non-SGLang server may not) is no claim to check: the answer is kept, flagged
  `prompt_tokens_missing`.
* `cached_tokens_exceed_prompt`: more prefix-cache hits than prompt tokens (SGLang counts cached
  tokens once, before any retraction: they never exceed the prompt).
* `output_id_not_integer`: an output id that is not a JSON integer (412.5, 412.0, "412", true, null):
  nothing is cast or repaired, a float or a string is no token id. `bool` is refused too (Python's
  bool is an int).
* `output_id_exceeds_int32`: an id that the int32 column cannot hold as received.
* `answer_field_invalid`: output_ids not a list, or a meta_info field of the wrong type or range
  (prompt_tokens, completion_tokens, cached_tokens: integers 0..2**31-1; finish_reason an object with
  a string `type`; text a string; e2e_latency a number).
* `weight_version_changed`: the answer names a weight version other than the shard's.
* `stop_at_max_new_tokens`: finish_reason `stop` on an answer of max_new_tokens ids (or more) whose last
  id is no stop id and that matched no stop string: a length cut reported as a stop (a proxy rewriting
  finish reasons). SGLang reports `stop` there only when the last id is the stop token it matched
  (0.5.23 checks stop ids before the length; 0.5.9 reports `length`).

Flagged (stored exactly as received; the generations gate quarantines what must not reach training):
`output_id_negative_<min>` and `output_id_<max>_out_of_vocab` (the gate's output_ids_in_vocabulary
fails the row), `prompt_tokens_missing`, `e2e_latency_invalid:<what>` (NaN, infinite, negative, no
float64, or longer than the client waited for the answer: the row's e2e_latency column is null, meta_info
keeps what was sent), and the spec's integrity checks (`integrity_violations`).

Every integer a server sends that reaches a column is checked against the column before the row is
built (`fits_int`, `fits_float64`: the helpers for any such check): one that does not fit is refused or
flagged here, never left to crash the chunk write (a crashed write fails the step, and Dagster's retry
would send every request again).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..secret import printable, redact
from .client import Outcome

log = logging.getLogger(__name__)

RID_MISMATCH = "answer_rid_mismatch"
PROMPT_TOKENS_MISMATCH = "prompt_tokens_mismatch"
CACHED_EXCEEDS_PROMPT = "cached_tokens_exceed_prompt"
ID_NOT_INTEGER = "output_id_not_integer"
ID_EXCEEDS_INT32 = "output_id_exceeds_int32"
FIELD_INVALID = "answer_field_invalid"
WEIGHT_VERSION_CHANGED = "weight_version_changed"
STOP_AT_MAX_NEW_TOKENS = "stop_at_max_new_tokens"
REFUSALS = frozenset(
    {RID_MISMATCH, PROMPT_TOKENS_MISMATCH, CACHED_EXCEEDS_PROMPT, ID_NOT_INTEGER, ID_EXCEEDS_INT32, FIELD_INVALID}
    | {WEIGHT_VERSION_CHANGED, STOP_AT_MAX_NEW_TOKENS}
)
NAN_FINISH = "NaN happened"
LATENCY_INVALID = "e2e_latency_invalid"
INT32_MAX = 2**31 - 1
# a server's e2e_latency is measured inside the request the client timed: a little clock slack, no more
LATENCY_SLACK_S = 1.0
LATENCY_SLACK_RATIO = 1.1


def fits_int(v: Any, bits: int = 32, *, minimum: int | None = None) -> bool:
    """`v` is a JSON integer (not a bool, not 412.0) that a signed `bits`-bit column holds, and at least
    `minimum` when given (0: a count). The check for any integer a server sends before it reaches a column."""
    if type(v) is not int:
        return False
    lo = -(2 ** (bits - 1)) if minimum is None else max(minimum, -(2 ** (bits - 1)))
    return lo <= v <= 2 ** (bits - 1) - 1


def fits_float64(v: Any) -> bool:
    """`v` is a JSON number (not a bool) that a float64 column holds: a float (NaN and infinities included),
    or an integer no larger in magnitude than the largest float64 (a larger one cannot be written)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return isinstance(v, float) or abs(v) <= sys.float_info.max


@dataclass(frozen=True)
class Sent:
    """What the request said: the answer is judged against it."""

    input_ids: Sequence[int]
    rid: str
    max_new_tokens: int | None = None
    vocab_size: int | None = None
    weight_version: str | None = None  # the shard's; None: not known yet (the first answer's becomes it)
    revision: str | None = None  # the shard's model revision ("model_path@weight_version"), for messages
    stop_ids: frozenset[int] = frozenset()  # the stop_token_ids sent: the ids a `stop` finish may end on
    waited_s: float | None = None  # how long the client waited for this answer (bounds its e2e_latency)


@dataclass(frozen=True)
class Refused:
    reason: str
    detail: str


@dataclass(frozen=True)
class Accepted:
    answer: dict[str, Any]
    flags: list[str] = field(default_factory=list)
    weight_versions: list[str] = field(default_factory=list)  # every weight version the answer names


def _is_int(v: Any) -> bool:
    return type(v) is int  # a bool, a float (even 412.0), a string: not an integer on the wire


def _shown(v: Any) -> str:
    return f"{v!r} ({type(v).__name__})"


def _ids_refusal(ids: list[Any]) -> Refused | None:
    # the common case at C speed (an 8k-token answer: ~0.1 ms instead of ~1 ms); the rows named only on a refusal
    all_int = set(map(type, ids)) <= {int}
    if all_int and (not ids or max(ids) <= INT32_MAX):
        return None
    bad = [] if all_int else [(i, v) for i, v in enumerate(ids) if not _is_int(v)]
    if bad:
        first = ", ".join(f"output_ids[{i}] is {_shown(v)}" for i, v in bad[:3])
        return Refused(
            ID_NOT_INTEGER,
            f"{len(bad)} of {len(ids)} output ids are not JSON integers: {first}; a token id is an integer, "
            "nothing is cast; not stored",
        )
    huge = [(i, v) for i, v in enumerate(ids) if v > INT32_MAX]
    if huge:
        first = ", ".join(f"output_ids[{i}] is {v}" for i, v in huge[:3])
        return Refused(
            ID_EXCEEDS_INT32,
            f"{len(huge)} output ids exceed 2**31-1 ({first}): the int32 column cannot hold them as received; "
            "not stored",
        )
    return None


_COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def _field_refusal(data: dict[str, Any], meta: dict[str, Any]) -> Refused | None:
    """A field of the wrong type or range: storing it would crash the row's write (or store a forgery)."""
    problems: list[str] = []
    for k in _COUNTS:
        v = meta.get(k)
        if v is not None and not fits_int(v, 32, minimum=0):
            problems.append(f"meta_info.{k} is {_shown(v)[:200]}, expected an integer in [0, 2**31-1]")
    fr = meta.get("finish_reason")
    if fr is not None and not (isinstance(fr, dict) and isinstance(fr.get("type"), str)):
        problems.append(f"meta_info.finish_reason is {_shown(fr)}, expected an object with a string type")
    lat = meta.get("e2e_latency")
    if lat is not None and (isinstance(lat, bool) or not isinstance(lat, int | float)):
        problems.append(f"meta_info.e2e_latency is {_shown(lat)}, expected a number")
    text = data.get("text")
    if text is not None and not isinstance(text, str):
        problems.append(f"text is {_shown(text)[:200]}, expected a string")
    if not problems:
        return None
    return Refused(FIELD_INVALID, "; ".join(problems) + "; not stored")


def _prompt_refusal(sent: Sent, meta: dict[str, Any]) -> Refused | None:
    n_sent = len(sent.input_ids)
    pt = meta.get("prompt_tokens")
    if pt is not None and pt != n_sent:
        return Refused(
            PROMPT_TOKENS_MISMATCH,
            f"sent {n_sent} input ids, meta_info.prompt_tokens is {pt}: the answer was generated for another "
            "prompt (a gateway or server that truncated or changed it); not stored",
        )
    ct = meta.get("cached_tokens")
    limit = n_sent if pt is None else pt
    if ct is not None and ct > limit:
        return Refused(
            CACHED_EXCEEDS_PROMPT,
            f"meta_info.cached_tokens is {ct}, more than the prompt's {limit} tokens "
            f"(prompt_tokens {pt}, {n_sent} sent): not an answer to this prompt; not stored",
        )
    return None


def _finish_refusal(sent: Sent, ids: list[int], meta: dict[str, Any]) -> Refused | None:
    """A `stop` finish on an answer cut at max_new_tokens that nothing stopped: a length cut disguised."""
    fr = meta.get("finish_reason")
    if sent.max_new_tokens is None or not isinstance(fr, dict) or fr.get("type") != "stop":
        return None
    if len(ids) < sent.max_new_tokens or isinstance(fr.get("matched"), str):
        return None  # shorter than the budget, or a stop string (or SGLang's "NaN happened") ended it
    last = ids[-1] if ids else None
    if last is not None and (last in sent.stop_ids or fr.get("matched") == last):
        return None  # the stop token it matched is the last id: a real stop at the budget (0.5.23)
    return Refused(
        STOP_AT_MAX_NEW_TOKENS,
        f"finish_reason stop (matched {fr.get('matched')!r}) on an answer of {len(ids)} ids, max_new_tokens "
        f"{sent.max_new_tokens}, whose last id {last} is no stop id: a length cut reported as a stop (a proxy "
        "rewriting finish reasons); not stored",
    )


def _latency_flag(meta: dict[str, Any], waited_s: float | None) -> str | None:
    """`e2e_latency_invalid:<what>` for an e2e_latency no request can have taken, else None."""
    lat = meta.get("e2e_latency")
    if lat is None:
        return None
    if not fits_float64(lat):
        what = "not_a_float64"
    elif math.isnan(lat):
        what = "nan"
    elif math.isinf(lat):
        what = "infinite"
    elif lat < 0:
        what = "negative"
    elif waited_s is not None and lat > waited_s * LATENCY_SLACK_RATIO + LATENCY_SLACK_S:
        what = "longer_than_the_request"
    else:
        return None
    return f"{LATENCY_INVALID}:{what}"


def answered_rid(answer: dict[str, Any]) -> str | None:
    """The rid the answer says it is for (`meta_info.id`), or None when it does not say."""
    meta = answer.get("meta_info")
    rid = meta.get("id") if isinstance(meta, dict) else None
    return None if rid is None else str(rid)


def check_answer(sent: Sent, answer: Any) -> Accepted | Refused:
    """`answer` accepted with its flags, or refused with the reason; see the module docstring."""
    if not isinstance(answer, dict):
        return Refused(FIELD_INVALID, f"the answer is {type(answer).__name__}, expected an object; not stored")
    meta = answer.get("meta_info")
    ids = answer.get("output_ids")
    if not isinstance(meta, dict) or not isinstance(ids, list):
        return Refused(
            FIELD_INVALID,
            f"output_ids is {type(ids).__name__}, meta_info is {type(meta).__name__}: expected a list and an "
            "object; not stored",
        )
    got = answered_rid(answer)
    if got is not None and got != sent.rid:
        return Refused(
            RID_MISMATCH,
            f"sent rid {sent.rid}, the answer's meta_info.id is {printable(got)}: another request's answer (a proxy or "
            "cache between the client and the server mixed answers up); not stored",
        )
    refusal = (
        _ids_refusal(ids)
        or _field_refusal(answer, meta)
        or _prompt_refusal(sent, meta)
        or _finish_refusal(sent, ids, meta)
    )
    if refusal is not None:
        return refusal
    versions = answer_weight_versions(answer)
    ref = sent.weight_version if sent.weight_version is not None else next(iter(versions), None)
    if any(v != ref for v in versions):
        new = ", ".join(repr(v) for v in versions if v != ref)
        return Refused(
            WEIGHT_VERSION_CHANGED,
            f"the server now reports weight_version {new} (meta_info.weight_version(s) {versions!r}), the shard "
            f"was started with {sent.revision or repr(ref)}: weights changed under the running shard; not stored "
            "(rerun to generate it under the new revision)",
        )
    return Accepted(answer, _flags(sent, answer, ids, meta), versions)


def judge_outcome(o: Outcome, sent: Sent, *, shard: str, seen: Mapping[str, int]) -> tuple[Outcome, list[str] | None]:
    """`o` and its flags when its answer is accepted; a failed Outcome (the reason, status 200) when refused
    (or `o` itself when it carries no answer). `seen`: refusals this run already counted by reason; the
    first three of each are logged as errors (one per answer would flood the log when a proxy mangles
    every answer; the report counts them all)."""
    if o.response is None:
        return o, None
    verdict = check_answer(sent, o.response)
    if isinstance(verdict, Accepted):
        return o, verdict.flags
    if seen.get(verdict.reason, 0) < 3:
        log.error("shard %s: %s: %s", shard, verdict.reason, verdict.detail)
    failed = Outcome(
        None,
        o.endpoint,
        o.rid,
        o.latency_s,
        reason=verdict.reason,
        status=200,
        detail=verdict.detail,
        attempts=o.attempts,
    )
    return failed, None


def _flags(sent: Sent, answer: dict[str, Any], ids: list[int], meta: dict[str, Any]) -> list[str]:
    flags = integrity_violations(answer, max_new_tokens=sent.max_new_tokens)
    if meta.get("prompt_tokens") is None:
        flags.append("prompt_tokens_missing")
    latency = _latency_flag(meta, sent.waited_s)
    if latency is not None:
        flags.append(latency)
    if ids:
        lo, hi = min(ids), max(ids)
        if lo < 0:
            flags.append(f"output_id_negative_{lo}")
        if sent.vocab_size is not None and hi >= sent.vocab_size:
            flags.append(f"output_id_{hi}_out_of_vocab")
    return flags


def integrity_violations(resp: dict[str, Any], *, max_new_tokens: int | None = None) -> list[str]:
    """Checks the spec asks for on every response (§3.1, §7); violations are recorded, never hidden."""
    out: list[str] = []
    ids = resp.get("output_ids")
    meta = resp.get("meta_info") or {}
    if not isinstance(ids, list):
        return ["output_ids_missing"]
    ct = meta.get("completion_tokens")
    if ct is None:
        out.append("completion_tokens_missing")
    elif len(ids) != ct:
        out.append(f"len_output_ids_{len(ids)}_ne_completion_tokens_{ct}")
    fr = meta.get("finish_reason")
    if isinstance(fr, dict) and fr.get("type") == "stop":
        m = fr.get("matched")
        if isinstance(m, int) and not isinstance(m, bool):
            if not ids or ids[-1] != m:
                out.append(f"stop_matched_{m}_ne_last_output_id_{ids[-1] if ids else None}")
        elif m == NAN_FINISH:
            # SGLang sampled NaN / an out-of-vocab id and replaced the last id with EOS (spec §3.3).
            out.append("nan_happened")
    elif isinstance(fr, dict) and fr.get("type") == "length":
        n = fr.get("length")
        if isinstance(n, int) and len(ids) != n:
            out.append(f"length_finish_{n}_ne_len_output_ids_{len(ids)}")
        elif max_new_tokens is not None and len(ids) < max_new_tokens:
            # The server clamped max_new_tokens (context limit, max_req_len): a truncated trace.
            out.append(f"length_capped_by_server_{len(ids)}_lt_max_new_tokens_{max_new_tokens}")
    return out


def answer_weight_versions(resp: dict[str, Any]) -> list[str]:
    """Every weight version an answer names: `meta_info.weight_version`, then each version of its
    `weight_versions` spans (SGLang 0.5.23: which weights generated which output tokens; weight_version is
    the last span's), each as the model revision shows it. Two distinct values: the sample's tokens come from
    two sets of weights."""
    meta = resp.get("meta_info") or {}
    out = [_as_in_revision(meta["weight_version"])] if meta.get("weight_version") is not None else []
    spans = meta.get("weight_versions")
    for span in spans if isinstance(spans, list) else ():
        v = span.get("version") if isinstance(span, dict) else None
        if v is not None and _as_in_revision(v) not in out:
            out.append(_as_in_revision(v))
    return out


def _as_in_revision(version: Any) -> str:
    """A weight version as the model revision holds it (endpoint_info.model_revision_of: redacted, printable),
    so that the shard's version and an answer's compare alike."""
    return printable(redact(str(version)))
