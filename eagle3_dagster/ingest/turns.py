"""Where the turns of an `all_turns` conversation are, and how its prompts row is laid out.

A conversation's turns are the positions the model answers, in order:
* every assistant message that has a user or tool message before it (an assistant greeting before
  the first user message is history the model never wrote an answer for, so it stays as it is);
* plus the end of the conversation when it ends with a user or tool message (the final answer).

The prompts row of an `all_turns` conversation (schemas.PROMPTS):
* `messages` = turn 1's prompt (the messages before the first turn), so the tokenize stage renders
  and gates turn 1 exactly like any prompt;
* `conversation` = the whole normalized conversation (canonical JSON), dataset assistant turns
  included (their tool calls are what regenerated tool calls are compared with);
* `regenerate` = the options, canonical JSON {"mode", "max_turns", "on_tool_mismatch", "turns"}.
  BFCL records whose tools change at a later turn (ingest/bfcl.py, miss_func) add "tools_from":
  [[message position, the whole tools list from there on], ...]; `tools` is turn 1's list.
Rows of `final_turn` sources leave both null, so their prompt ids and everything after are unchanged.
"""

from __future__ import annotations

from typing import Any

from .errors import RowReject


def turn_positions(messages: list[dict[str, Any]]) -> list[int]:
    """Indices in `messages` at which the model answers (len(messages) for a trailing question)."""
    out: list[int] = []
    asked = False
    for i, m in enumerate(messages):
        role = m.get("role")
        if role in ("user", "tool"):
            asked = True
        elif role == "assistant" and asked:
            out.append(i)
    if messages and messages[-1].get("role") in ("user", "tool"):
        out.append(len(messages))
    return out


def regenerate_options(
    messages: list[dict[str, Any]], *, max_turns: int | None, on_tool_mismatch: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(turn 1's prompt messages, the `regenerate` options) of one conversation; RowReject if no turn."""
    turns = turn_positions(messages)
    if not turns:
        roles = ",".join(str(m.get("role")) for m in messages[:8])
        raise RowReject("nothing_to_regenerate", f"no assistant turn answers a user or tool message (roles: {roles})")
    planned = turns[:max_turns] if max_turns is not None else turns
    options = {"mode": "all_turns", "max_turns": max_turns, "on_tool_mismatch": on_tool_mismatch, "turns": planned}
    return messages[: planned[0]], options
