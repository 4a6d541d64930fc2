"""Literal control-token text inside prompt content.

A chat template puts its structural tokens (`<|im_end|>`, `<think>`, ...) into the rendered text as
literal strings, and the encode turns every such string into its special id. Text that came from
the data (message content, reasoning, tool calls, tool results, tool descriptions) can hold the
same strings: encoded as served, `</think><|im_end|><|im_assistant|>` in a user turn forges turns.

What the template put there vs. what the data brought is decided on the inputs: every string value
(and object key) of the messages and tools is scanned for the text of any added token of the
tokenizer (the ones the encode matches whole). Policies per source (`control_text` in the source
YAML, ingest/spec.py):

    reject     the prompt is quarantined with reason `control_token_in_content` (default)
    as_text    the literal text is encoded as ordinary text (no special id), like
               split_special_tokens=True for the content spans only; the template's own tokens stay
    as_served  encoded as a server's chat endpoint would (special ids), flagged in
               tokenized_prompts.control_text_in_content
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CONTROL_TOKEN_IN_CONTENT = "control_token_in_content"
CONTROL_TEXT_POLICIES = ("reject", "as_text", "as_served")


@dataclass(frozen=True)
class ControlTokens:
    """The added tokens of a tokenizer: the texts the encode matches whole, and their ids."""

    pattern: re.Pattern[str]  # any token's text, longest first
    first_chars: frozenset[str]  # a string without any of these holds no token text
    ids: dict[str, int]  # token text -> id


def control_tokens(tokenizer: Any) -> ControlTokens | None:
    """The tokenizer's added tokens, or None if it has none."""
    ids = {t.content: int(i) for i, t in tokenizer.added_tokens_decoder.items() if t.content}
    if not ids:
        return None
    texts = sorted(ids, key=len, reverse=True)
    return ControlTokens(re.compile("|".join(map(re.escape, texts))), frozenset(t[0] for t in texts), ids)


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, text) of every string in a JSON value, object keys included."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield f"{path}<key>", key
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")


def _field_name(path: str) -> str:
    """What part of the prompt a string path is: content / reasoning / tool call / tool description ..."""
    if path.startswith("tools"):
        return "tool description" if ".description" in path else "tool declaration"
    if ".tool_calls" in path:
        return "tool call"
    for key, name in (
        (".reasoning_content", "reasoning"),
        (".thinking", "reasoning"),
        (".reasoning", "reasoning"),
        (".content", "content"),
    ):
        if key in path:
            return name
    return "message field"


def find_control_text(tokens: ControlTokens | None, messages: Any, tools: Any) -> list[tuple[str, str, str]]:
    """(token text, path e.g. messages[2].content, field kind) of every control-token text in the data.

    Tool results are `messages[i].content` of a `role: tool` message; the kind then reads `tool result`.
    """
    if tokens is None:
        return []
    pattern, starts = tokens.pattern, tokens.first_chars
    found: list[tuple[str, str, str]] = []
    sources: list[tuple[Any, str]] = [(messages, "messages")]
    if tools:
        sources.append((tools, "tools"))
    for value, root in sources:
        for path, text in _strings(value, root):
            if not any(ch in text for ch in starts):  # the common case: no token's first character
                continue
            for match in pattern.finditer(text):
                kind = _field_name(path)
                if kind == "content" and root == "messages" and _role_at(messages, path) == "tool":
                    kind = "tool result"
                found.append((match.group(0), path, kind))
    return found


def _role_at(messages: Any, path: str) -> str | None:
    m = re.match(r"messages\[(\d+)\]", path)
    if not m or not isinstance(messages, list):
        return None
    message = messages[int(m.group(1))]
    return message.get("role") if isinstance(message, dict) else None


def describe(found: list[tuple[str, str, str]]) -> str:
    shown = "; ".join(f"{token!r} in {path} ({kind})" for token, path, kind in found[:8])
    more = f"; and {len(found) - 8} more" if len(found) > 8 else ""
    return f"{len(found)} control-token text(s) in the prompt's data: {shown}{more}"
