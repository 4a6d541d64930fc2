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
`round_trip_mismatches`): every segment of a batch is decoded, and every turn re-encoded, in one call
(`batch_decode` / `batch_encode`) that goes through an exact tiktoken twin of a byte-level BPE tokenizer
(tokenize/fast_bpe.py, probed against the tokenizer when built) or else the `tokenizers` Rust library;
threads over the batch when TOKENIZERS_PARALLELISM allows (set in config.py), never per token through
transformers. `parse_generation` / `round_trip_mismatch` are the
per-sample reference through the tokenizer's own decode/encode; tests/train/test_train_parse.py checks
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

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..profiles import ModelProfile
from ..tokenize.fast_bpe import fast_bpe_for


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

    segments: [reasoning, content, (call id, arguments) per tool call]; only [reasoning] without a
    think-end. problems holds an int k where call k's arguments must be checked as JSON (the check
    needs their text), so reason codes keep the order of the per-sample parse.
    """

    segments: list[list[int]]
    problems: list[str | int]
    think_end_pos: int | None
    n_calls: int = 0
    qwen_tools: list[int] | None = None  # Qwen3: the ids from the first `<tool_call>` on (parsed per sample)


def _kimi_tool_call_plan(ids: list[int], profile: ModelProfile, plan: _Plan) -> None:
    t = profile.tool_call_ids
    pos = 0
    while True:
        b = _index(ids, t.call_begin, pos)
        if b < 0:
            break
        a = _index(ids, t.argument_begin, b + 1)
        e = _index(ids, t.call_end, b + 1)
        if a < 0 or e < 0 or a > e:
            plan.problems.append("unterminated_tool_call")
            break
        plan.segments += [ids[b + 1 : a], ids[a + 1 : e]]
        plan.problems.append(plan.n_calls)
        plan.n_calls += 1
        pos = e + 1


def _plan(output_ids: Any, profile: ModelProfile) -> _Plan:
    ids = list(output_ids)
    problems: list[str | int] = []
    if ids and ids[-1] in profile.stop_token_ids:
        ids = ids[:-1]
    else:
        problems.append("no_end_of_turn")
    start = 0
    if not profile.generation_prompt_ends_with_think_start:
        if ids[:1] == [profile.think_start_id]:
            start = 1
        else:
            problems.append("no_think_start")
    te = _index(ids, profile.think_end_id, start)
    if te < 0:
        problems.append("no_think_end")
        return _Plan(segments=[ids[start:]], problems=problems, think_end_pos=None)
    reasoning_ids, rest = ids[start:te], ids[te + 1 :]
    t = profile.tool_call_ids
    plan = _Plan(segments=[reasoning_ids, rest], problems=problems, think_end_pos=te)
    if t.section_begin is not None:  # Kimi: one section of calls after the answer text
        sb = _index(rest, t.section_begin)
        if sb >= 0:
            se = _index(rest, t.section_end, sb + 1)
            if se < 0:
                problems.append("unterminated_tool_section")
                se = len(rest)
            elif se != len(rest) - 1:
                problems.append("text_after_tool_section")
            plan.segments[1] = rest[:sb]
            _kimi_tool_call_plan(rest[sb + 1 : se], profile, plan)
        if _index(reasoning_ids, t.section_begin) >= 0:
            problems.append("tool_call_inside_reasoning")
    if t.section_begin is None and t.call_begin is not None:  # Qwen3: <tool_call> blocks after the answer
        cb = _index(rest, t.call_begin)
        if cb >= 0:
            plan.qwen_tools = rest[cb:]
            plan.segments[1] = rest[:cb]
    return plan


def _finish(plan: _Plan, texts: list[str], profile: ModelProfile, tokenizer: Any) -> ParsedGeneration:
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
        calls = _qwen_tool_calls(plan.qwen_tools, profile, tokenizer, problems)
        tool_text = _decode(tokenizer, plan.qwen_tools)
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
    plan = _plan(output_ids, profile)
    return _finish(plan, [_decode(tokenizer, s) for s in plan.segments], profile, tokenizer)


def parse_generations_batch(outputs: Sequence[Any], profile: ModelProfile, tokenizer: Any) -> list[ParsedGeneration]:
    """parse_generation for many samples, every segment decoded in one batch call (see batch_decode)."""
    plans = [_plan(ids, profile) for ids in outputs]
    texts = batch_decode(tokenizer, [s for p in plans for s in p.segments])
    out: list[ParsedGeneration] = []
    pos = 0
    for p in plans:
        n = len(p.segments)
        out.append(_finish(p, texts[pos : pos + n], profile, tokenizer))
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
    outputs: Sequence[Any], parsed: Sequence[ParsedGeneration], profile: ModelProfile, tokenizer: Any
) -> list[int | None]:
    """round_trip_mismatch for many samples: the turns assembled with markers looked up once, encoded in one
    Rust batch call (batch_encode), compared as plain int lists."""
    markers = _markers(profile, tokenizer)
    again = batch_encode(tokenizer, [assistant_turn_text(p, profile, tokenizer, markers) for p in parsed])
    return [_first_difference(a, list(ids)) for a, ids in zip(again, outputs)]


def round_trips(output_ids: list[int], parsed: ParsedGeneration, profile: ModelProfile, tokenizer: Any) -> bool:
    """True when the parsed turn encodes back to exactly the generated ids."""
    return round_trip_mismatch(output_ids, parsed, profile, tokenizer) is None
