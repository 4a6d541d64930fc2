"""What the simulator's model says in a conversation: answers that depend on the prompt, and tool calls.

A real model's answer depends on everything in its context; a multi-turn regeneration relies on
that (turn k sees the model's own turns 1..k-1). So that tests can SEE the context, each answer
starts with an echo of the tail of the last user message (`Re "<tail>":`), and everything else
in the turn is drawn from a seed that hashes the whole prompt (model.prompt_seed): a different
history gives a different answer, the same prompt the same answer.

Tool calls: a prompt that declares tools (Kimi `tool_declare`, TypeScript or compact JSON;
Qwen3 `<tools>` JSON lines) is answered with one or two calls of declared functions, with JSON
arguments for the function's required parameters, at `--tool-call-rate` for a fresh user
question. Each tool-call round already answered since the last user message halves the rate, so
agent loops (call -> result -> call ...) end with a plain answer, as real ones do. Formats:

- Kimi-K2.5: `<|tool_calls_section_begin|>(<|tool_call_begin|>functions.NAME:IDX
  <|tool_call_argument_begin|>{json}<|tool_call_end|>)+<|tool_calls_section_end|>`, where IDX counts
  the tool calls of the whole conversation (Kimi's convention), i.e. those already in the prompt.
- Qwen3: `<tool_call>\\n{"name": NAME, "arguments": {json}}\\n</tool_call>`, calls separated by `\\n`.

Everything here is a pure function of the decoded prompt text and the prompt-seeded rng.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

# Characters removed from echoed user text: every special/marker token of both models is spelled
# with them (`<|im_end|>`, `</think>`, `<tool_call>`, `[EOS]`), so an echo can never emit a marker.
_MARKER_CHARS = re.compile(r"[<>|\[\]]")
_KIMI_USER = re.compile(r"<\|im_user\|>[^<]*<\|im_middle\|>(.*?)<\|im_end\|>", re.S)
_QWEN_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_KIMI_CALL_BEGIN = "<|tool_call_begin|>"
_QWEN_CALL_BEGIN = "<tool_call>"
ECHO_WORDS = 6


def last_user_text(prompt_text: str, kimi: bool) -> str:
    """The content of the last real user message in a rendered prompt ('' if none).

    Qwen3 renders tool results as a user turn of `<tool_response>` blocks: those are not questions.
    """
    if kimi:
        found = _KIMI_USER.findall(prompt_text)
    else:
        found = [
            m
            for m in _QWEN_USER.findall(prompt_text)
            if not (m.lstrip("\n").startswith("<tool_response>") and m.rstrip("\n").endswith("</tool_response>"))
        ]
    return found[-1] if found else ""


def echo_of(user_text: str, n_words: int = ECHO_WORDS) -> str:
    """The last words of the user text with marker characters removed (never a special token)."""
    words = _MARKER_CHARS.sub(" ", user_text).split()
    return " ".join(words[-n_words:])


def tool_rounds_since_user(prompt_text: str, kimi: bool) -> int:
    """Assistant tool-call turns after the last real user message (the length of the running chain)."""
    if kimi:
        cut = prompt_text.rfind("<|im_user|>")
        return prompt_text[cut if cut >= 0 else 0 :].count("<|tool_calls_section_begin|>")
    user = last_user_text(prompt_text, kimi=False)
    cut = prompt_text.rfind("<|im_start|>user\n" + user) if user else -1
    tail = prompt_text[cut if cut >= 0 else 0 :]
    # one assistant turn may hold several calls: count assistant turns that contain a call
    return sum(1 for turn in tail.split("<|im_start|>assistant\n")[1:] if _QWEN_CALL_BEGIN in turn)


@dataclass(frozen=True)
class PlannedCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class TurnPlan:
    """The answer part of a turn: the echo prefix and any tool calls (markers rendered by the caller)."""

    echo: str
    calls: tuple[PlannedCall, ...]
    first_call_index: int  # Kimi: IDX of the first call (calls already in the conversation)


def plan_turn(
    prompt_text: str,
    tools: list[Any],
    rng: random.Random,
    *,
    kimi: bool,
    tool_call_rate: float,
) -> TurnPlan:
    """Decide the echo and the tool calls for one prompt. `tools` are sim.model.ToolDecl-like
    objects (`.name`, `.args`) found in the prompt's declaration; none -> no calls."""
    user = last_user_text(prompt_text, kimi)
    echo = echo_of(user)
    calls: list[PlannedCall] = []
    rounds = tool_rounds_since_user(prompt_text, kimi)
    if tools and rng.random() < tool_call_rate * 0.5**rounds:
        n = 2 if rng.random() < 0.3 else 1
        words = echo.split()
        for _ in range(n):
            t = rng.choice(tools)
            args = dict(t.args)
            # a string argument takes a word of the question, like a model filling a parameter
            for key, value in args.items():
                if isinstance(value, str) and words and rng.random() < 0.5:
                    args[key] = rng.choice(words)
            calls.append(PlannedCall(t.name, args))
    marker = _KIMI_CALL_BEGIN if kimi else _QWEN_CALL_BEGIN
    return TurnPlan(echo, tuple(calls), prompt_text.count(marker))


def kimi_calls_text(plan: TurnPlan, tk: Any, ids: Any) -> str:
    """Kimi's tool-call section for the plan ('' without calls). `tk` converts an id to its token."""
    markers = (ids.section_begin, ids.call_begin, ids.argument_begin, ids.call_end, ids.section_end)
    if not plan.calls or None in markers:
        return ""
    parts = [tk(ids.section_begin)]
    for i, call in enumerate(plan.calls):
        args = json.dumps(call.arguments, ensure_ascii=False)
        parts.append(
            f"{tk(ids.call_begin)}functions.{call.name}:{plan.first_call_index + i}"
            f"{tk(ids.argument_begin)}{args}{tk(ids.call_end)}"
        )
    parts.append(tk(ids.section_end))
    return "".join(parts)


def qwen_calls_text(plan: TurnPlan) -> str:
    """Qwen3's tool calls for the plan ('' without calls)."""
    return "\n".join(
        "<tool_call>\n" + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False) + "\n</tool_call>"
        for c in plan.calls
    )
