"""Turn one source record into a canonical prompt: OpenAI-shaped messages plus optional tools.

The prompt rule (configurable per source as `prompt_rule`):

* ``last_user_or_tool`` (default): the final assistant turn(s) are dropped, because the target
  model regenerates them; the prompt is the conversation up to and including the LAST user or tool
  message. Earlier multi-turn history (including assistant turns and tool calls) is kept.
* ``first_user``: only the system message(s) before the first user message, plus that first user
  message.

A record with no messages is rejected as ``empty_conversation``; one with no user/tool message to
answer as ``nothing_to_regenerate``. Only the kept part of the conversation is validated in depth
(content, tool calls, arguments): a broken final assistant turn is discarded anyway, so it does not
cost the prompt. Roles are checked over the whole conversation, since the cut depends on them.

Canonical message shape (what the tokenizer stage receives):

* ``role`` in system | user | assistant | tool; ``content`` a string.
* assistant: optional ``tool_calls`` = [{"id", "type": "function", "function": {"name", "arguments":
  <dict>}}] (arguments parsed: the Kimi template applies ``tojson`` to a dict); optional
  ``reasoning_content``.
* tool: ``tool_call_id``; when the source has no ids (glaive, hermes) they are synthesized as
  ``functions.<name>:<index>`` (index counts tool calls across the conversation, Kimi's convention),
  and results are paired with calls in order.
* optional ``name`` on any message. Other keys are dropped. Empty system messages are dropped.

Tools become OpenAI function schemas [{"type": "function", "function": {name, description?,
parameters?}}]; BFCL/hermes ``"type": "dict"`` becomes ``"object"`` at every depth. An empty tools
list is the same as no tools (null), so ``"[]"`` and a missing field give the same prompt id.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import Any

from .errors import RowReject
from .tools import decode_json_string as _decode_json_string
from .tools import json_type as _json_type
from .tools import normalize_tools

PROMPT_RULES = ("last_user_or_tool", "first_user")
_WHOLE = "_whole_conversation"  # internal: build_conversation keeps every message

# Marks an assistant turn the dataset does not have and the model must generate (BFCL questions):
# {"role": "assistant", "content": "", "generate": True}. Only build_conversation emits it.
GENERATE_KEY = "generate"

# Record layouts; "ultrachat", "hermes" and "no_robots" are the OpenAI messages layout under
# other names, "glaive" is ShareGPT with tools, "magpie"/"gsm8k"/"math" are single questions.
FORMAT_ALIASES: dict[str, str] = {
    "auto": "auto",
    "openai": "openai",
    "messages": "openai",
    "ultrachat": "openai",
    "hermes": "openai",
    "no_robots": "openai",
    "sharegpt": "sharegpt",
    "glaive": "sharegpt",
    "alpaca": "alpaca",
    "question": "question",
    "gsm8k": "question",
    "magpie": "question",
    "math": "question",
    "bfcl": "bfcl",
}

ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function": "tool",
    "ipython": "tool",
    # ShareGPT's tool-call turn: an assistant turn whose value is {"name", "arguments"} JSON.
    "function_call": "function_call",
}

# Keys a source may rename through field_map: {canonical name: name in the source}.
FIELD_NAMES = (
    "messages",
    "conversations",
    "role",
    "content",
    "from",
    "value",
    "tools",
    "system",
    "instruction",
    "input",
    "history",
    "question",
    "function",
)
QUESTION_KEYS = ("question", "problem", "instruction", "prompt", "query")

_MISSING: Any = object()


def build_prompt(
    record: Any,
    *,
    fmt: str = "auto",
    field_map: Mapping[str, str] | None = None,
    prompt_rule: str = "last_user_or_tool",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Record -> (canonical prompt messages, canonical tools or None). Raises RowReject."""
    if not isinstance(record, dict):
        raise RowReject("not_an_object", f"record is a JSON {_json_type(record)}, expected an object")
    fm = dict(field_map or {})
    if fm:
        record = _apply_field_map(record, fm)
    layout = FORMAT_ALIASES.get(fmt)
    if layout is None:
        raise ValueError(f"unknown format {fmt!r}; known: {sorted(FORMAT_ALIASES)}")
    if layout == "auto":
        layout = detect_layout(record)
    role_key = fm.get("role")
    content_key = fm.get("content")
    if layout == "openai":
        raw_messages = _list_field(record, "messages")
        raw_messages = _prepend_system(record, raw_messages)
        messages = _openai_messages(raw_messages, role_key or "role", content_key or "content")
        tools_raw = record.get("tools")
    elif layout == "sharegpt":
        conv = _list_field(record, "conversations")
        messages = _sharegpt_messages(conv, role_key or fm.get("from"), content_key or fm.get("value"))
        messages = _prepend_system(record, messages)
        tools_raw = record.get("tools")
    elif layout == "alpaca":
        messages = _alpaca_messages(record)
        tools_raw = None
    elif layout == "question":
        messages = _question_messages(record)
        tools_raw = None
    elif layout == "bfcl":
        messages = _bfcl_messages(record, role_key or "role", content_key or "content")
        tools_raw = _bfcl_function_docs(record)
    else:  # pragma: no cover - FORMAT_ALIASES only maps to the layouts above
        raise AssertionError(layout)
    if layout == "bfcl":
        # final_turn prompt of a BFCL record: its first question with the function docs; later
        # questions need the model's own earlier answers (all_turns: build_conversation).
        messages = messages[: next(i for i, m in enumerate(messages) if m.get("_slot"))] if messages else messages
    prompt = _normalize_kept(_apply_prompt_rule(messages, prompt_rule))
    return prompt, normalize_tools(tools_raw)


def build_conversation(
    record: Any,
    *,
    fmt: str = "auto",
    field_map: Mapping[str, str] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Record -> (the whole canonical conversation, canonical tools or None). Raises RowReject.

    For a multi-turn regeneration: every message is kept and validated, including the dataset's
    assistant turns (the turns a regeneration replaces). Where the dataset has no assistant turn
    (BFCL: questions only) the conversation holds an assistant slot, `{"role": "assistant",
    "content": "", GENERATE_KEY: True}`, after each question: a turn to generate, never to render
    (the tokenize stage rejects a prompt that still holds one).
    """
    if not isinstance(record, dict):
        raise RowReject("not_an_object", f"record is a JSON {_json_type(record)}, expected an object")
    layout = FORMAT_ALIASES.get(fmt)
    if layout is None:
        raise ValueError(f"unknown format {fmt!r}; known: {sorted(FORMAT_ALIASES)}")
    fm = dict(field_map or {})
    rec = _apply_field_map(record, fm) if fm else record
    if layout == "auto":
        layout = detect_layout(rec)
    if layout != "bfcl":
        # the prompt path with no cut: the same readers and validation over the whole conversation
        messages, tools = build_prompt(record, fmt=fmt, field_map=field_map, prompt_rule=_WHOLE)
        return messages, tools
    messages = _bfcl_messages(rec, fm.get("role") or "role", fm.get("content") or "content")
    if not messages:
        raise RowReject("empty_conversation", "the conversation has no messages")
    return _normalize_kept(messages), normalize_tools(_bfcl_function_docs(rec))


def detect_layout(record: dict[str, Any]) -> str:
    """Pick the record layout from its fields (format: auto)."""
    if "messages" in record:
        return "openai"
    if "conversations" in record:
        return "sharegpt"
    if isinstance(record.get("question"), list):
        return "bfcl"
    if "instruction" in record and ("input" in record or "output" in record):
        return "alpaca"
    for key in QUESTION_KEYS:
        if key in record:
            return "question"
    keys = ", ".join(sorted(map(str, record))[:12]) or "none"
    raise RowReject("unknown_format", f"no messages/conversations/question/instruction field (fields: {keys})")


# ---------------------------------------------------------------------------------------------
# record layouts -> raw message list [{"role": canonical role, ...}]


def _apply_field_map(record: dict[str, Any], fm: Mapping[str, str]) -> dict[str, Any]:
    out = dict(record)
    for canonical, source_name in fm.items():
        if canonical in ("role", "content", "from", "value"):
            continue  # message-level names are applied while reading messages
        if source_name in record:
            out[canonical] = record[source_name]
    return out


def _list_field(record: dict[str, Any], key: str) -> list[Any]:
    value = record.get(key, _MISSING)
    if value is _MISSING or value is None:
        raise RowReject("missing_field", f"field '{key}' is missing or null")
    value = _decode_json_string(value, "bad_field", f"field '{key}' is a string that is not a JSON list")
    if not isinstance(value, list):
        raise RowReject("bad_field", f"field '{key}' must be a list, got {_json_type(value)}")
    return value


def _prepend_system(record: dict[str, Any], messages: list[Any]) -> list[Any]:
    system = record.get("system")
    if system is None or system == "":
        return messages
    if not isinstance(system, str):
        raise RowReject("bad_content", f"field 'system' must be a string, got {_json_type(system)}")
    return [{"role": "system", "content": system, "_where": "system"}, *messages]


def _role_of(value: Any, where: str) -> str:
    if value is None:
        raise RowReject("missing_field", f"{where} has no role")
    if not isinstance(value, str) or value.strip().lower() not in ROLE_ALIASES:
        raise RowReject("unknown_role", f"{where} has unknown role {str(value)[:40]!r}")
    return ROLE_ALIASES[value.strip().lower()]


def _openai_messages(raw: list[Any], role_key: str, content_key: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RowReject("bad_field", f"{where} is a JSON {_json_type(m)}, expected an object")
        role = _role_of(m.get(role_key), where)
        if role == "function_call":
            raise RowReject("unknown_role", f"{where} has role 'function_call', which only ShareGPT uses")
        msg = dict(m)
        msg.pop(role_key, None)
        if content_key != "content":
            msg["content"] = msg.pop(content_key, _MISSING)
        msg["role"] = role
        msg["_where"] = where
        out.append(msg)
    return out


def _sharegpt_messages(raw: list[Any], role_key: str | None, content_key: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, turn in enumerate(raw):
        where = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise RowReject("bad_field", f"{where} is a JSON {_json_type(turn)}, expected an object")
        rk = role_key or ("from" if "from" in turn else "role")
        ck = content_key or ("value" if "value" in turn else "content")
        role = _role_of(turn.get(rk), where)
        value = turn.get(ck, _MISSING)
        if role == "function_call":
            # Parsed later, and only if the turn is kept by the prompt rule.
            out.append({"role": "assistant", "content": "", "_function_call": value, "_where": where})
        else:
            out.append({"role": role, "content": value, "_where": where})
    return out


def _alpaca_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    instruction = record.get("instruction", _MISSING)
    if instruction is _MISSING or instruction is None:
        raise RowReject("missing_field", "field 'instruction' is missing or null")
    if not isinstance(instruction, str):
        raise RowReject("bad_content", f"field 'instruction' must be a string, got {_json_type(instruction)}")
    extra = record.get("input")
    if extra is not None and not isinstance(extra, str):
        raise RowReject("bad_content", f"field 'input' must be a string, got {_json_type(extra)}")
    # LLaMA-Factory's convention: instruction and input joined by one newline.
    user = instruction + ("\n" + extra if extra and extra.strip() else "")
    messages: list[dict[str, Any]] = []
    history = record.get("history")
    if history:
        if not isinstance(history, list):
            raise RowReject(
                "bad_field", f"field 'history' must be a list of [query, response], got {_json_type(history)}"
            )
        for i, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise RowReject("bad_field", f"history[{i}] must be a [query, response] pair")
            messages.append({"role": "user", "content": pair[0], "_where": f"history[{i}][0]"})
            messages.append({"role": "assistant", "content": pair[1], "_where": f"history[{i}][1]"})
    messages.append({"role": "user", "content": user, "_where": "instruction"})
    output = record.get("output")
    if isinstance(output, str):
        messages.append({"role": "assistant", "content": output, "_where": "output"})
    return _prepend_system(record, messages)


def _question_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    for key in QUESTION_KEYS:
        if key in record:
            value = record[key]
            if value is None:
                raise RowReject("missing_field", f"field '{key}' is null")
            if not isinstance(value, str):
                raise RowReject("bad_content", f"field '{key}' must be a string, got {_json_type(value)}")
            return _prepend_system(record, [{"role": "user", "content": value, "_where": key}])
    raise RowReject("missing_field", f"no question field (one of {', '.join(QUESTION_KEYS)})")


def _bfcl_function_docs(record: dict[str, Any]) -> Any:
    """The record's `function` docs. BFCL's multi-turn files name `involved_classes` instead and keep
    the docs in separate files (multi_turn_func_doc/): without them the questions would be asked with
    no tools, so such a record is rejected, never turned into a tool-less prompt."""
    docs = record.get("function")
    if docs is None and record.get("involved_classes"):
        classes = ", ".join(map(str, record["involved_classes"]))[:120]
        raise RowReject(
            "missing_field",
            f"BFCL record uses involved_classes ({classes}) but has no 'function' docs; "
            "point the source's 'function_docs' at BFCL's multi_turn_func_doc/ folder (docs/bfcl.md)",
        )
    return docs


def _bfcl_messages(record: dict[str, Any], role_key: str, content_key: str) -> list[dict[str, Any]]:
    """BFCL `question`: a list of turns, each a list of messages (a system message and/or the user
    question). Each turn is followed by the model's answer, which the dataset does not have: an
    assistant slot marks it (see GENERATE_KEY). A flat list of messages is one turn; an empty turn
    (BFCL miss_func records hold one where a function is added) asks nothing and gets no slot."""
    question = _list_field(record, "question")
    turns: list[list[tuple[str, Any]]] = []
    flat: list[tuple[str, Any]] = []
    for i, turn in enumerate(question):
        if isinstance(turn, list):
            turns.append([(f"question[{i}][{j}]", m) for j, m in enumerate(turn)])
        elif isinstance(turn, dict):
            flat.append((f"question[{i}]", turn))
        else:
            raise RowReject("bad_field", f"question[{i}] must be a list of messages, got {_json_type(turn)}")
    if flat:
        turns.insert(0, flat)
    out: list[dict[str, Any]] = []
    for k, turn in enumerate(t for t in turns if t):
        messages = _openai_messages([m for _, m in turn], role_key, content_key)
        for (where, _), m in zip(turn, messages):
            m["_where"] = where
        out.extend(messages)
        out.append({"role": "assistant", "_slot": True, "_where": f"answer to turn {k}"})
    return out


# ---------------------------------------------------------------------------------------------
# prompt rule and deep normalization of the kept messages


def _apply_prompt_rule(messages: list[dict[str, Any]], rule: str) -> list[dict[str, Any]]:
    if not messages:
        raise RowReject("empty_conversation", "the conversation has no messages")
    if rule == _WHOLE:
        return messages
    if rule == "last_user_or_tool":
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] in ("user", "tool"):
                return messages[: i + 1]
    elif rule == "first_user":
        for i, m in enumerate(messages):
            if m["role"] == "user":
                return [x for x in messages[:i] if x["role"] == "system"] + [m]
    else:
        raise ValueError(f"unknown prompt_rule {rule!r}; known: {', '.join(PROMPT_RULES)}")
    roles = ",".join(m["role"] for m in messages[:8])
    raise RowReject("nothing_to_regenerate", f"no user or tool message to answer (roles: {roles})")


class _Calls:
    """The tool calls of a conversation so far: how many, and the ids not yet answered, in call order."""

    def __init__(self) -> None:
        self.pending: deque[str] = deque()
        self.count = 0

    def answered_by(self, call_id: Any, where: str) -> str:
        """The call a tool result answers: its own tool_call_id, else the oldest unanswered call."""
        if call_id is not None and not isinstance(call_id, str):
            raise RowReject("bad_field", f"{where}.tool_call_id must be a string")
        if call_id:
            if call_id in self.pending:
                self.pending.remove(call_id)
            return call_id
        if self.pending:
            return self.pending.popleft()
        raise RowReject("orphan_tool_result", f"{where} (tool) answers no earlier tool call")


def _normalize_kept(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    calls = _Calls()
    for m in messages:
        where = m["_where"]
        role = m["role"]
        if m.get("_slot"):
            out.append({"role": "assistant", "content": "", GENERATE_KEY: True})
            continue
        content = m.get("content", _MISSING)
        reasoning: str | None = None
        part_calls: list[Any] = []
        if isinstance(content, list):
            content, reasoning, part_calls = _content_from_parts(content, where)
        msg = (
            _assistant_message(m, content, reasoning, part_calls, calls)
            if role == "assistant"
            else _text_message(m, role, content, calls)
        )
        if msg is None:
            continue  # an empty system prompt says nothing; drop it rather than the row
        name = m.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise RowReject("bad_field", f"{where}.name must be a string")
            if name:
                msg["name"] = name
        out.append(msg)
    if not out:
        raise RowReject("empty_conversation", "the prompt is empty after dropping empty system messages")
    return out


def _assistant_message(
    m: dict[str, Any], content: Any, reasoning: str | None, part_calls: list[Any], calls: _Calls
) -> dict[str, Any]:
    where = m["_where"]
    raw_calls: list[Any] = list(part_calls)
    if "_function_call" in m:
        raw_calls.extend(_parse_function_call(m["_function_call"], where))
    tc = m.get("tool_calls")
    if tc is not None:
        if not isinstance(tc, list):
            raise RowReject("bad_tool_call", f"{where}.tool_calls must be a list, got {_json_type(tc)}")
        raw_calls.extend(tc)
    normalized = []
    for j, raw_call in enumerate(raw_calls):
        call = _normalize_tool_call(raw_call, f"{where}.tool_calls[{j}]", calls.count)
        calls.count += 1
        calls.pending.append(call["id"])
        normalized.append(call)
    rc = m.get("reasoning_content")
    if rc is not None:
        if not isinstance(rc, str):
            raise RowReject("bad_content", f"{where}.reasoning_content must be a string, got {_json_type(rc)}")
        reasoning = rc if reasoning is None else reasoning + rc
    if content is _MISSING or content is None:
        if not normalized and reasoning is None:
            raise RowReject("missing_field", f"{where} (assistant) has no content and no tool_calls")
        content = ""
    _check_text(content, where)
    if not content.strip() and not normalized and not reasoning:
        raise RowReject("empty_turn", f"{where} (assistant) is empty")
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if normalized:
        msg["tool_calls"] = normalized
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def _text_message(m: dict[str, Any], role: str, content: Any, calls: _Calls) -> dict[str, Any] | None:
    """A system, user or tool message; None for an empty system prompt."""
    where = m["_where"]
    if content is _MISSING:
        raise RowReject("missing_field", f"{where} ({role}) has no content")
    if content is None:
        raise RowReject("bad_content", f"{where} ({role}) content is null")
    _check_text(content, where)
    if role == "system" and not content.strip():
        return None
    if role == "user" and not content.strip():
        raise RowReject("empty_turn", f"{where} (user) is empty")
    msg: dict[str, Any] = {"role": role, "content": content}
    if role == "tool":
        msg["tool_call_id"] = calls.answered_by(m.get("tool_call_id"), where)
    return msg


def _check_text(content: Any, where: str) -> None:
    if not isinstance(content, str):
        raise RowReject("bad_content", f"{where} content is a JSON {_json_type(content)}, expected text")


def _content_from_parts(parts: list[Any], where: str) -> tuple[str, str | None, list[Any]]:
    """OpenAI text parts ({type: text, text}) and hermes parts ({type: text|reasoning|tool_call, value})."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[Any] = []
    for k, part in enumerate(parts):
        pw = f"{where}.content[{k}]"
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise RowReject("bad_content", f"{pw} is a JSON {_json_type(part)}, expected a typed part")
        kind = part.get("type")
        value = part.get("text", part.get("value"))
        if kind in ("text", "reasoning", "thinking"):
            if not isinstance(value, str):
                raise RowReject("bad_content", f"{pw} ({kind}) has no text value")
            (texts if kind == "text" else reasoning).append(value)
        elif kind == "tool_call":
            calls.extend(_parse_function_call(part.get("value", part.get("tool_call")), pw))
        else:
            raise RowReject(
                "bad_content",
                f"{pw} has part type {str(kind)[:30]!r}; only text, reasoning and tool_call are supported",
            )
    return "".join(texts), ("".join(reasoning) if reasoning else None), calls


def _parse_function_call(value: Any, where: str) -> list[Any]:
    """ShareGPT function_call / hermes tool_call value: JSON {name, arguments} or a list of them."""
    value = _decode_json_string(value, "bad_tool_call", f"{where} tool call is not valid JSON")
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and value:
        return value
    raise RowReject(
        "bad_tool_call", f"{where} tool call must be an object with name and arguments, got {_json_type(value)}"
    )


def _normalize_tool_call(raw: Any, where: str, index: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise RowReject("bad_tool_call", f"{where} is a JSON {_json_type(raw)}, expected an object")
    fn: dict[str, Any] = raw["function"] if isinstance(raw.get("function"), dict) else raw  # OpenAI or flat shape
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RowReject("bad_tool_call", f"{where} has no function name")
    args = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise RowReject("bad_tool_arguments", f"{where} ({name}) arguments are not valid JSON") from None
    if not isinstance(args, dict):
        raise RowReject(
            "bad_tool_arguments", f"{where} ({name}) arguments must be a JSON object, got {_json_type(args)}"
        )
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"functions.{name}:{index}"
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
