"""Parse a generation from its tokens: reasoning, answer and tool calls.

Everything is derived from `output_ids` by splitting on marker ids from the profile and decoding
the pieces between them; nothing is re-encoded to decide anything. The round trip
(`round_trip_mismatch`) goes the other way, from the parsed message back to ids. A row whose parse
is clean but whose text does not re-encode to its ids (non-canonical tokenization from a real
sampler) is kept in every token-level table and flagged `text_exact = false` with the first differing
position: a trainer that re-tokenizes its text would train on other ids than the model produced.
Parse problems (no `</think>`, unbalanced tool-call markers, tool-call JSON that does not parse) are
reason codes and quarantine the row.

Speed: the training stage parses and round-trips whole batches (`parse_generations_batch`,
`round_trip_mismatches`). A batch's output ids are read as one flat Arrow array (`IdBatch`: the marker
positions every plan needs are found in one pass, no Python int per id); every segment is decoded, and
every turn re-encoded, through an exact tiktoken twin of a byte-level BPE tokenizer (tokenize/fast_bpe.py,
probed against the tokenizer when built; the turns of a batch in ONE call, `FastBPE.encode_turns`) or
else the `tokenizers` Rust library in one batch call (threads when TOKENIZERS_PARALLELISM allows, set in
config.py); never per token through transformers. `parse_generation` / `round_trip_mismatch` are the
per-sample reference through the tokenizer's own decode/encode; tests/tokenize/test_parse.py checks
both give the same result on every shared dataset and on non-canonical sampler output.

Kimi-K2.5 layout (prompt ends with `<think>`):
    reasoning </think> answer [<|tool_calls_section_begin|> (<|tool_call_begin|> id
    <|tool_call_argument_begin|> args <|tool_call_end|>)* <|tool_calls_section_end|>] <|im_end|>
Qwen3 layout (the model opens the block itself):
    <think>\\n reasoning \\n</think>\\n\\n answer [<tool_call>\\n{json}\\n</tool_call>]* <|im_end|>
    Tool calls become OpenAI-shape `tool_calls` (ids `call_<i>`, arguments the exact JSON text the
    model wrote for "arguments"); `content` is the text before the first `<tool_call>`.
"""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ..profiles import ModelProfile
from .fast_bpe import fast_bpe_for


@dataclass
class ParsedGeneration:
    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    think_end_pos: int | None = None
    problems: list[str] = field(default_factory=list)  # reason codes: no_think_end, unterminated_tool_call, ...
    # Qwen3: the generated text from the first `<tool_call>` on (calls and what lies between them),
    # exactly as decoded, so the turn re-encodes to its ids; `content` is the text before it.
    tool_text: str = ""

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content, "reasoning_content": self.reasoning}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) if ids else ""


def _index(ids: list[int], token: int | None, start: int = 0) -> int:
    if token is None:
        return -1
    try:
        return ids.index(token, start)
    except ValueError:
        return -1


def _json_member_text(obj_text: str, key: str) -> str | None:
    """The exact text of a top-level member's value in a JSON object text (None: not there).

    The model's own bytes: `{"name": "f", "arguments": {"b": 1, "a": 2}}` -> `{"b": 1, "a": 2}`,
    spacing and key order as generated (json.dumps of the parsed value could differ)."""
    dec = json.JSONDecoder()
    text = obj_text.strip()
    if not text.startswith("{"):
        return None
    pos = 1
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "}":
            return None
        name, pos = dec.raw_decode(text, pos)
        while pos < len(text) and text[pos] in " \t\r\n:":
            pos += 1
        start = pos
        _, pos = dec.raw_decode(text, pos)
        if name == key:
            return text[start:pos]
    return None


def _qwen_tool_calls(
    ids: list[int], profile: ModelProfile, tokenizer: Any, problems: list[str]
) -> list[dict[str, Any]]:
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks (ids start at the first
    `<tool_call>`) -> OpenAI-shape calls, arguments the model's own JSON text. Text between or after
    the blocks (other than whitespace) is `text_after_tool_section`."""
    t = profile.tool_call_ids
    calls: list[dict[str, Any]] = []
    pos = 0
    while pos < len(ids):
        b = _index(ids, t.call_begin, pos)
        if b < 0:
            if _decode(tokenizer, ids[pos:]).strip():
                problems.append("text_after_tool_section")
            break
        if _decode(tokenizer, ids[pos:b]).strip():
            problems.append("text_after_tool_section")
        e = _index(ids, t.call_end, b + 1)
        if e < 0:
            problems.append("unterminated_tool_call")
            break
        body = _decode(tokenizer, ids[b + 1 : e])
        try:
            obj = json.loads(body)
            args = _json_member_text(body, "arguments") if isinstance(obj, dict) else None
        except ValueError:
            obj, args = None, None
        name = obj.get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str) or args is None:
            problems.append("tool_arguments_not_json")
            name, args = (name if isinstance(name, str) else ""), body
        calls.append({"id": f"call_{len(calls)}", "type": "function", "function": {"name": name, "arguments": args}})
        pos = e + 1
    return calls


_JSON_CHECK = "tool_arguments_not_json"


@dataclass
class _Plan:
    """The id-level part of a parse: which runs of ids to decode, and the reason codes.

    segments: [reasoning, content, (call id, arguments) per tool call] as (start, end) spans of the
    output's ids; only [reasoning] without a think-end. problems holds an int k where call k's arguments
    must be checked as JSON (the check needs their text), so reason codes keep the order of the
    per-sample parse.
    """

    segments: list[tuple[int, int]]
    problems: list[str | int]
    think_end_pos: int | None
    n_calls: int = 0
    qwen_tools: tuple[int, int] | None = None  # Qwen3: the span from the first `<tool_call>` on (parsed per sample)


class _ListIds:
    """One output's ids as a list: what the plan looks at (the per-sample reference path)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)
        self.n = len(self.ids)
        self.first = self.ids[0] if self.ids else None
        self.last = self.ids[-1] if self.ids else None

    def find(self, token: int | None, lo: int, hi: int) -> int:
        """The first position of `token` in [lo, hi), -1 when none."""
        if token is None or lo >= hi:
            return -1
        try:
            return self.ids.index(token, lo, hi)
        except ValueError:
            return -1


class _MarkedIds:
    """One output of a batch, seen through its marker positions only (the batch path): its length, first and
    last id, and where each marker id the plan looks for occurs (found for the whole batch at once)."""

    def __init__(self, n: int, first: int | None, last: int | None, marks: dict[int, list[int]]) -> None:
        self.n, self.first, self.last, self.marks = n, first, last, marks

    def find(self, token: int | None, lo: int, hi: int) -> int:
        at = self.marks.get(token) if token is not None else None
        if not at or lo >= hi:
            return -1
        k = bisect.bisect_left(at, lo)
        return at[k] if k < len(at) and at[k] < hi else -1


def _kimi_tool_call_plan(ids: _ListIds | _MarkedIds, lo: int, hi: int, profile: ModelProfile, plan: _Plan) -> None:
    """The calls between a tool-call section's markers (ids[lo:hi])."""
    t = profile.tool_call_ids
    pos = lo
    while True:
        b = ids.find(t.call_begin, pos, hi)
        if b < 0:
            break
        a = ids.find(t.argument_begin, b + 1, hi)
        e = ids.find(t.call_end, b + 1, hi)
        if a < 0 or e < 0 or a > e:
            plan.problems.append("unterminated_tool_call")
            break
        plan.segments += [(b + 1, a), (a + 1, e)]
        plan.problems.append(plan.n_calls)
        plan.n_calls += 1
        pos = e + 1


def _plan(ids: _ListIds | _MarkedIds, profile: ModelProfile) -> _Plan:
    problems: list[str | int] = []
    end = ids.n
    if ids.n and ids.last in profile.stop_token_ids:
        end -= 1
    else:
        problems.append("no_end_of_turn")
    start = 0
    if not profile.generation_prompt_ends_with_think_start:
        if end >= 1 and ids.first == profile.think_start_id:
            start = 1
        else:
            problems.append("no_think_start")
    te = ids.find(profile.think_end_id, start, end)
    if te < 0:
        problems.append("no_think_end")
        return _Plan(segments=[(start, end)], problems=problems, think_end_pos=None)
    t = profile.tool_call_ids
    plan = _Plan(segments=[(start, te), (te + 1, end)], problems=problems, think_end_pos=te)
    if t.section_begin is not None:  # Kimi: one section of calls after the answer text
        sb = ids.find(t.section_begin, te + 1, end)
        if sb >= 0:
            se = ids.find(t.section_end, sb + 1, end)
            if se < 0:
                problems.append("unterminated_tool_section")
                se = end
            elif se != end - 1:
                problems.append("text_after_tool_section")
            plan.segments[1] = (te + 1, sb)
            _kimi_tool_call_plan(ids, sb + 1, se, profile, plan)
        if ids.find(t.section_begin, start, te) >= 0:
            problems.append("tool_call_inside_reasoning")
    if t.section_begin is None and t.call_begin is not None:  # Qwen3: <tool_call> blocks after the answer
        cb = ids.find(t.call_begin, te + 1, end)
        if cb >= 0:
            plan.qwen_tools = (cb, end)
            plan.segments[1] = (te + 1, cb)
    return plan


def _finish(
    plan: _Plan, texts: list[str], profile: ModelProfile, tokenizer: Any, span_ids: Callable[[int, int], list[int]]
) -> ParsedGeneration:
    """The parse from its plan and the decoded text of each of its segments (same order). Qwen3 tool-call
    blocks (rare: only rows that have one) are parsed here through the tokenizer's own decode."""
    calls: list[dict[str, Any]] = []
    bad_json: set[int] = set()
    for k in range(plan.n_calls):
        call_id = texts[2 + 2 * k].strip()
        args = texts[3 + 2 * k]
        # "functions.get_weather:0" -> "get_weather"
        name = call_id.split(".", 1)[-1].rsplit(":", 1)[0]
        try:
            json.loads(args)
        except ValueError:
            bad_json.add(k)
        calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
    problems = [p if isinstance(p, str) else _JSON_CHECK for p in plan.problems if isinstance(p, str) or p in bad_json]
    tool_text = ""
    if plan.qwen_tools is not None:
        qwen_ids = span_ids(*plan.qwen_tools)
        calls = _qwen_tool_calls(qwen_ids, profile, tokenizer, problems)
        tool_text = _decode(tokenizer, qwen_ids)
    return ParsedGeneration(
        reasoning=texts[0],
        content=texts[1] if plan.think_end_pos is not None else "",
        tool_calls=calls,
        think_end_pos=plan.think_end_pos,
        problems=problems,
        tool_text=tool_text,
    )


def parse_generation(output_ids: list[int], profile: ModelProfile, tokenizer: Any) -> ParsedGeneration:
    """One generation, decoded through the tokenizer's own `decode` (the reference for parse_generations_batch)."""
    ids = _ListIds(output_ids)
    plan = _plan(ids, profile)

    def span_ids(a: int, b: int) -> list[int]:
        return ids.ids[a:b]

    return _finish(plan, [_decode(tokenizer, span_ids(a, b)) for a, b in plan.segments], profile, tokenizer, span_ids)


class IdBatch:
    """The output ids of a batch of generations as one flat array + row offsets (Arrow's list layout,
    zero-copy from a polars/Arrow list column): the batch path reads markers, spans and round trips from
    it without turning every id into a Python int."""

    def __init__(self, outputs: pl.Series | pa.Array | pa.ChunkedArray | Sequence[Sequence[int]]) -> None:
        if isinstance(outputs, pl.Series):
            outputs = outputs.to_arrow()
        if not isinstance(outputs, (pa.Array, pa.ChunkedArray)):
            outputs = pa.array([list(x) if x is not None else None for x in outputs], type=pa.large_list(pa.int64()))
        if isinstance(outputs, pa.ChunkedArray):
            outputs = outputs.combine_chunks() if outputs.num_chunks != 1 else outputs.chunk(0)
        if outputs.null_count:  # a missing output is an empty one (its parse reports no_end_of_turn)
            outputs = pc.if_else(pc.is_null(outputs), pa.scalar([], outputs.type), outputs)
        # offsets index the (unsliced) values buffer directly, also for a sliced array
        self.offsets = outputs.offsets.to_numpy().astype(np.int64)
        self.values = outputs.values.to_numpy(zero_copy_only=False)
        self.rows = len(outputs)

    def __len__(self) -> int:
        return self.rows

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def span(self, i: int, a: int, b: int) -> list[int]:
        o = int(self.offsets[i])
        return cast(list[int], self.values[o + a : o + b].tolist())

    def marked(self, tokens: Sequence[int]) -> list[_MarkedIds]:
        """Every row as _MarkedIds: the positions of `tokens` found in one pass over the batch."""
        starts, ends = self.offsets[:-1], self.offsets[1:]
        lens = (ends - starts).tolist()
        if len(self.values):  # an empty row's first/last are read from a neighbour here, and ignored below
            firsts = self.values[np.minimum(starts, len(self.values) - 1)].tolist()
            lasts = self.values[np.maximum(ends - 1, 0)].tolist()
        else:
            firsts = lasts = [None] * self.rows
        at = np.flatnonzero(np.isin(self.values, np.asarray(list(tokens), dtype=np.int64)))
        vals = self.values[at].tolist()
        lo = np.searchsorted(at, starts).tolist()
        hi = np.searchsorted(at, ends).tolist()
        pos = at.tolist()
        out = []
        for i in range(self.rows):
            marks: dict[int, list[int]] = {}
            o = int(starts[i])
            for k in range(lo[i], hi[i]):
                marks.setdefault(vals[k], []).append(pos[k] - o)
            n = lens[i]
            out.append(_MarkedIds(n, firsts[i] if n else None, lasts[i] if n else None, marks))
        return out


def _marker_ids(profile: ModelProfile) -> list[int]:
    t = profile.tool_call_ids
    ids = [profile.think_start_id, profile.think_end_id, t.section_begin, t.section_end, t.call_begin]
    ids += [t.argument_begin, t.call_end]
    return [i for i in ids if i is not None]


def parse_generations_batch(
    outputs: IdBatch | pl.Series | Sequence[Sequence[int]], profile: ModelProfile, tokenizer: Any
) -> list[ParsedGeneration]:
    """parse_generation for many samples: the markers found for the whole batch at once (IdBatch), every
    segment decoded in one batch call (see batch_decode)."""
    batch = outputs if isinstance(outputs, IdBatch) else IdBatch(outputs)
    rows = batch.marked(_marker_ids(profile))
    plans = [_plan(r, profile) for r in rows]
    texts = batch_decode(tokenizer, [batch.span(i, a, b) for i, p in enumerate(plans) for a, b in p.segments])
    out: list[ParsedGeneration] = []
    pos = 0
    for i, p in enumerate(plans):
        n = len(p.segments)
        out.append(_finish(p, texts[pos : pos + n], profile, tokenizer, functools.partial(batch.span, i)))
        pos += n
    return out


def _backend(tokenizer: Any) -> Any:
    """The `tokenizers` (Rust) tokenizer behind a transformers fast tokenizer, or None for a slow one."""
    backend = getattr(tokenizer, "_tokenizer", None)
    return backend if backend is not None and hasattr(backend, "encode_batch") else None


def batch_decode(tokenizer: Any, seqs: list[list[int]]) -> list[str]:
    """tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for each sequence.

    A byte-level BPE tokenizer decodes through its probed tiktoken twin (tokenize/fast_bpe.py): ids to
    bytes, no token strings. Otherwise (or when a sequence holds an id outside the vocabulary, which
    `tokenizers` skips) a fast tokenizer decodes the whole batch in Rust (`tokenizers.Tokenizer.decode_batch`,
    threads when TOKENIZERS_PARALLELISM allows). A slow tokenizer decodes one by one.
    """
    fast = fast_bpe_for(tokenizer)
    if fast is not None:
        try:
            return fast.decode_batch(seqs)
        except KeyError:  # an id the vocabulary does not have: the reference path drops it, as tokenizers does
            pass
    backend = _backend(tokenizer)
    if backend is None:
        return [_decode(tokenizer, s) for s in seqs]
    return list(backend.decode_batch(seqs, skip_special_tokens=False))


def batch_encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """tokenizer.encode(text, add_special_tokens=False) for each text: through the probed tiktoken twin of a
    byte-level BPE tokenizer (tokenize/fast_bpe.py), else in one `tokenizers` Rust batch call when fast (threads
    per TOKENIZERS_PARALLELISM), else one by one.

    The twin runs on ONE thread: splitting a batch over two (thread pool or tiktoken's own batch call) was
    measured slower on the 2-core machine, in CPU and in wall time (5,000 1,541-token samples: 7.5 s CPU /
    7.5 s wall with two threads, 6.2 s / 6.2 s with one), as every text hands the GIL over twice."""
    fast = fast_bpe_for(tokenizer)
    if fast is not None:
        return fast.encode_batch(texts, threads=1)
    backend = _backend(tokenizer)
    if backend is None:
        return [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    # encode_batch_fast (tokenizers >= 0.21) skips the character offsets nobody reads here
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [e.ids for e in encode(texts, add_special_tokens=False)]


def batch_encode_arrays(tokenizer: Any, texts: list[str], end: str | None = None) -> list[np.ndarray]:
    """batch_encode, each result an integer array: through the fast twin straight from tiktoken's buffer
    (no Python int per id; texts ending with the added token `end`, the end-of-turn marker, in one call:
    FastBPE.encode_turns), else batch_encode's lists as arrays."""
    fast = fast_bpe_for(tokenizer)
    if fast is not None:
        return fast.encode_turns(texts, end) if end is not None else [fast.encode_array(t) for t in texts]
    return [np.asarray(ids, dtype=np.int64) for ids in batch_encode(tokenizer, texts)]


def _markers(profile: ModelProfile, tokenizer: Any) -> dict[str, str]:
    """The marker tokens' strings an assistant turn is assembled with (looked up once per batch)."""
    tok = tokenizer.convert_ids_to_tokens
    t = profile.tool_call_ids
    out = {"think_end": tok(profile.think_end_id), "eot": tok(profile.end_of_turn_id)}
    if t.section_begin is not None:
        out.update(
            section_begin=tok(t.section_begin),
            section_end=tok(t.section_end),
            call_begin=tok(t.call_begin),
            argument_begin=tok(t.argument_begin),
            call_end=tok(t.call_end),
        )
    else:
        out["think_start"] = tok(profile.think_start_id)
    return out


def assistant_turn_text(
    parsed: ParsedGeneration, profile: ModelProfile, tokenizer: Any, markers: dict[str, str] | None = None
) -> str:
    """The assistant turn as the chat template renders a kept-reasoning turn, after the generation prompt.

    Kimi's template drops the reasoning of a final plain answer when it renders history, so the
    turn is assembled here exactly as its suffix branch writes it (reasoning kept).
    """
    m = markers if markers is not None else _markers(profile, tokenizer)
    if "section_begin" in m:
        calls = ""
        if parsed.tool_calls:
            calls = (
                m["section_begin"]
                + "".join(
                    f"{m['call_begin']}{c['id']}{m['argument_begin']}{c['function']['arguments']}{m['call_end']}"
                    for c in parsed.tool_calls
                )
                + m["section_end"]
            )
        return f"{parsed.reasoning}{m['think_end']}{parsed.content}{calls}{m['eot']}"
    return f"{m['think_start']}{parsed.reasoning}{m['think_end']}{parsed.content}{parsed.tool_text}{m['eot']}"


def _first_difference(again: list[int], ids: list[int]) -> int | None:
    if again == ids:
        return None
    return next((i for i, (a, b) in enumerate(zip(again, ids)) if a != b), min(len(again), len(ids)))


def round_trip_mismatch(
    output_ids: list[int], parsed: ParsedGeneration, profile: ModelProfile, tokenizer: Any
) -> int | None:
    """None when the parsed turn encodes back to exactly the generated ids, else the first differing position.

    A mismatch with a clean parse is non-canonical tokenization (a sampler emitted e.g. `hel`+`lo` where
    encoding the text gives `hello`): the ids are valid training data, but re-tokenizing the text gives
    other ids, so text-level exports flag or leave out such a row (never the token-level tables).
    Encodes through the tokenizer's own `encode`: the reference for round_trip_mismatches.
    """
    text = assistant_turn_text(parsed, profile, tokenizer)
    return _first_difference(tokenizer.encode(text, add_special_tokens=False), list(output_ids))


def round_trip_mismatches(
    outputs: IdBatch | pl.Series | Sequence[Sequence[int]],
    parsed: Sequence[ParsedGeneration],
    profile: ModelProfile,
    tokenizer: Any,
) -> list[int | None]:
    """round_trip_mismatch for many samples: the turns assembled with markers looked up once (turn_texts),
    encoded in one batch (batch_encode_arrays: no Python int per id), compared with each row's ids as
    arrays (mismatch_positions)."""
    batch = outputs if isinstance(outputs, IdBatch) else IdBatch(outputs)
    texts, end = turn_texts(parsed, profile, tokenizer)
    return mismatch_positions(batch, batch_encode_arrays(tokenizer, texts, end))


def turn_texts(parsed: Sequence[ParsedGeneration], profile: ModelProfile, tokenizer: Any) -> tuple[list[str], str]:
    """Each parsed turn's text (assistant_turn_text) and the end-of-turn marker they end with."""
    markers = _markers(profile, tokenizer)
    return [assistant_turn_text(p, profile, tokenizer, markers) for p in parsed], markers["eot"]


def mismatch_positions(batch: IdBatch, again: Sequence[np.ndarray]) -> list[int | None]:
    """Per row: None when the re-encoded ids equal the row's ids, else the first differing position."""
    out: list[int | None] = []
    for i, a in enumerate(again):
        ids = batch.row(i)
        if len(a) == len(ids) and np.array_equal(a, ids):
            out.append(None)
            continue
        m = min(len(a), len(ids))
        diff = np.flatnonzero(a[:m] != ids[:m])
        out.append(int(diff[0]) if diff.size else m)
    return out


def round_trips(output_ids: list[int], parsed: ParsedGeneration, profile: ModelProfile, tokenizer: Any) -> bool:
    """True when the parsed turn encodes back to exactly the generated ids."""
    return round_trip_mismatch(output_ids, parsed, profile, tokenizer) is None
