"""Parse a generation from its tokens: reasoning, answer and tool calls.

Everything is derived from `output_ids` by splitting on marker ids from the profile and decoding
the pieces between them; nothing is re-encoded to decide anything. The round trip
(`round_trip_mismatch`) goes the other way, from the parsed message back to ids. A row whose parse
is clean but whose text does not re-encode to its ids (non-canonical tokenization from a real
sampler) is kept in every token-level table and flagged `text_exact = false` with the first differing
position: a trainer that re-tokenizes its text would train on other ids than the model produced.
Parse problems (no `</think>`, unbalanced tool-call markers, tool-call JSON that does not parse) are
reason codes and quarantine the row.

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
from dataclasses import dataclass, field
from typing import Any

from ..profiles import ModelProfile


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


def _kimi_tool_calls(
    ids: list[int], profile: ModelProfile, tokenizer: Any, problems: list[str]
) -> list[dict[str, Any]]:
    t = profile.tool_call_ids
    calls: list[dict[str, Any]] = []
    pos = 0
    while True:
        b = _index(ids, t.call_begin, pos)
        if b < 0:
            break
        a = _index(ids, t.argument_begin, b + 1)
        e = _index(ids, t.call_end, b + 1)
        if a < 0 or e < 0 or a > e:
            problems.append("unterminated_tool_call")
            break
        call_id = _decode(tokenizer, ids[b + 1 : a]).strip()
        args = _decode(tokenizer, ids[a + 1 : e])
        # "functions.get_weather:0" -> "get_weather"
        name = call_id.split(".", 1)[-1].rsplit(":", 1)[0]
        try:
            json.loads(args)
        except ValueError:
            problems.append("tool_arguments_not_json")
        calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
        pos = e + 1
    return calls


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


def parse_generation(output_ids: list[int], profile: ModelProfile, tokenizer: Any) -> ParsedGeneration:
    ids = list(output_ids)
    problems: list[str] = []
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
        return ParsedGeneration(reasoning=_decode(tokenizer, ids[start:]), content="", problems=problems)
    reasoning_ids, rest = ids[start:te], ids[te + 1 :]
    t = profile.tool_call_ids
    tool_calls: list[dict[str, Any]] = []
    if t.section_begin is not None:  # Kimi: one section of calls after the answer text
        sb = _index(rest, t.section_begin)
        if sb >= 0:
            se = _index(rest, t.section_end, sb + 1)
            if se < 0:
                problems.append("unterminated_tool_section")
                se = len(rest)
            elif se != len(rest) - 1:
                problems.append("text_after_tool_section")
            tool_calls = _kimi_tool_calls(rest[sb + 1 : se], profile, tokenizer, problems)
            rest = rest[:sb]
        if _index(reasoning_ids, t.section_begin) >= 0:
            problems.append("tool_call_inside_reasoning")
    tool_text = ""
    if t.section_begin is None and t.call_begin is not None:  # Qwen3: <tool_call> blocks after the answer
        cb = _index(rest, t.call_begin)
        if cb >= 0:
            tool_calls = _qwen_tool_calls(rest[cb:], profile, tokenizer, problems)
            tool_text = _decode(tokenizer, rest[cb:])
            rest = rest[:cb]
    return ParsedGeneration(
        reasoning=_decode(tokenizer, reasoning_ids),
        content=_decode(tokenizer, rest),
        tool_calls=tool_calls,
        think_end_pos=te,
        problems=problems,
        tool_text=tool_text,
    )


def assistant_turn_text(parsed: ParsedGeneration, profile: ModelProfile, tokenizer: Any) -> str:
    """The assistant turn as the chat template renders a kept-reasoning turn, after the generation prompt.

    Kimi's template drops the reasoning of a final plain answer when it renders history, so the
    turn is assembled here exactly as its suffix branch writes it (reasoning kept).
    """
    think_end = tokenizer.convert_ids_to_tokens(profile.think_end_id)
    eot = tokenizer.convert_ids_to_tokens(profile.end_of_turn_id)
    t = profile.tool_call_ids
    if t.section_begin is not None:
        calls = ""
        if parsed.tool_calls:
            tok = tokenizer.convert_ids_to_tokens
            calls = (
                tok(t.section_begin)
                + "".join(
                    f"{tok(t.call_begin)}{c['id']}{tok(t.argument_begin)}{c['function']['arguments']}{tok(t.call_end)}"
                    for c in parsed.tool_calls
                )
                + tok(t.section_end)
            )
        return f"{parsed.reasoning}{think_end}{parsed.content}{calls}{eot}"
    think_start = tokenizer.convert_ids_to_tokens(profile.think_start_id)
    return f"{think_start}{parsed.reasoning}{think_end}{parsed.content}{parsed.tool_text}{eot}"


def round_trip_mismatch(
    output_ids: list[int], parsed: ParsedGeneration, profile: ModelProfile, tokenizer: Any
) -> int | None:
    """None when the parsed turn encodes back to exactly the generated ids, else the first differing position.

    A mismatch with a clean parse is non-canonical tokenization (a sampler emitted e.g. `hel`+`lo` where
    encoding the text gives `hello`): the ids are valid training data, but re-tokenizing the text gives
    other ids, so text-level exports flag or leave out such a row (never the token-level tables).
    """
    text = assistant_turn_text(parsed, profile, tokenizer)
    again = tokenizer.encode(text, add_special_tokens=False)
    ids = list(output_ids)
    if again == ids:
        return None
    return next((i for i, (a, b) in enumerate(zip(again, ids)) if a != b), min(len(again), len(ids)))


def round_trips(output_ids: list[int], parsed: ParsedGeneration, profile: ModelProfile, tokenizer: Any) -> bool:
    """True when the parsed turn encodes back to exactly the generated ids."""
    return round_trip_mismatch(output_ids, parsed, profile, tokenizer) is None
