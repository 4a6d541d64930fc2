"""Native (pure Python) renderers for known chat templates: same text as the Jinja template, faster.

Rendering through transformers' `apply_chat_template` (input normalisation, the sandboxed Jinja
runtime, macros) costs about as much as encoding a short prompt. For a template we know byte for
byte we can build the same string directly, at a fraction of that cost. Templates covered:
Kimi-K2.5 (chat_template.jinja) and Qwen3 (the 0.6B-8B tokenizer_config.json template).

Safety rules - a native renderer may only ever give the SAME text as the Jinja path, or decline:
- It is used only when the tokenizer's chat template hashes to the exact template it reproduces
  (`KIMI_K25_TEMPLATE_SHA256`, `QWEN3_TEMPLATE_SHA256`) and the tokenizer's special-token map
  cannot shadow a template variable.
- It declines (returns None; the caller renders through Jinja) for any input it does not model
  exactly: unknown template kwargs, non-string fields where the template would print a Python
  repr, media content parts, malformed tool calls, ... It never guesses.
- At construction it renders a probe set of tricky conversations both ways and disables itself
  if any text differs (e.g. a transformers version that preprocesses messages differently).
- tests/tokenize/test_tok_native.py compares it with the Jinja path on every golden case, every
  shared-dataset prompt and a large randomised set (both templates).

What it reproduces of transformers 5.x `apply_chat_template` besides the template itself:
message keys whose value is None are dropped, and `reasoning_content` is filled from the first
non-None of `reasoning_content` / `thinking` / `reasoning` (transformers' reasoning aliases).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# sha256 of Kimi-K2.5's chat_template.jinja (../shared/tokenizers/kimi-k2.5/SOURCE.txt lists it).
KIMI_K25_TEMPLATE_SHA256 = "82dc16c314f46cefe61b1bf553bc99ee8d48a0f7c057302a3e2762d2416f20d0"

# Names the Kimi template reads; a special-token map entry with one of these names would change
# what the template sees, so the native path is then not used.
_KIMI_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "tools_ts_str", "thinking", "add_generation_prompt"})
# Template kwargs the native Kimi renderer models; any other kwarg -> decline.
_KIMI_KWARGS = frozenset({"thinking", "tools_ts_str"})
_KIMI_MEDIA_TYPES = frozenset({"image", "image_url", "video", "video_url"})

_IM_END = "<|im_end|>"
_GEN_THINK = "<|im_assistant|>assistant<|im_middle|><think>"
_GEN_NO_THINK = "<|im_assistant|>assistant<|im_middle|><think></think>"

# (messages, tools, kwargs, add_generation_prompt) -> text, or None to decline
NativeRender = Callable[[list[Any], list[Any] | None, Mapping[str, Any], bool], str | None]


class _Decline(Exception):
    """Internal: the input has something the native renderer does not model."""


def template_sha256(chat_template: Any) -> str | None:
    return hashlib.sha256(chat_template.encode("utf-8")).hexdigest() if isinstance(chat_template, str) else None


def _declining(text_fn: Callable[..., str]) -> NativeRender:
    """A NativeRender from a text builder: any exception (a _Decline, or e.g. arguments json.dumps
    cannot serialise) means "not modelled here", and the caller renders through Jinja."""

    def render(
        messages: list[Any], tools: list[Any] | None, kwargs: Mapping[str, Any], add_generation_prompt: bool
    ) -> str | None:
        try:
            return text_fn(messages, tools, kwargs, add_generation_prompt)
        except Exception:
            return None

    render.__name__ = text_fn.__name__.removesuffix("_text")
    return render


def _check_call(
    messages: Any,
    tools: Any,
    kwargs: Mapping[str, Any],
    add_generation_prompt: Any,
    allowed_kwargs: frozenset[str],
    bool_kwarg: str,
) -> bool | None:
    """Decline anything but known kwargs, a bool (or absent) `bool_kwarg`, a bool generation flag,
    a list of messages and a list of dict tools; returns the value of `bool_kwarg`."""
    for key in kwargs:
        if key not in allowed_kwargs:
            raise _Decline
    flag = kwargs.get(bool_kwarg)
    if flag is not None and flag.__class__ is not bool:
        raise _Decline
    if add_generation_prompt.__class__ is not bool or messages.__class__ is not list:
        raise _Decline
    if tools is not None and (tools.__class__ is not list or any(t.__class__ is not dict for t in tools)):
        raise _Decline
    return flag


def _message_basics(message: Any) -> tuple[str, list[Any] | None, str | None]:
    """(role, tool calls, reasoning) of one message after transformers' normalisation: None-valued
    keys dropped, reasoning from `reasoning_content`, else `thinking`, else `reasoning`."""
    if message.__class__ is not dict:
        raise _Decline
    role = message.get("role")
    if role.__class__ is not str:
        raise _Decline
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and tool_calls.__class__ is not list:
        raise _Decline
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("thinking")
        if reasoning is None:
            reasoning = message.get("reasoning")
    if reasoning is not None and reasoning.__class__ is not str:
        raise _Decline
    return role, tool_calls, reasoning


def _content_text(content: Any) -> str:
    """render_content(msg): a string as is, None/missing as nothing, a list of text parts joined."""
    if content.__class__ is str:
        return content
    if content is None:
        return ""
    if content.__class__ is not list:
        raise _Decline
    out = []
    for part in content:
        # Only {"type": <non-media str>, "text": <str>} parts; media parts, missing keys, nested
        # None values and non-dict parts render in ways we do not model -> Jinja.
        if part.__class__ is not dict:
            raise _Decline
        kind = part.get("type")
        text = part.get("text")
        if kind.__class__ is not str or kind in _KIMI_MEDIA_TYPES or text.__class__ is not str:
            raise _Decline
        out.append(text)
    return "".join(out)


def _tool_calls_text(tool_calls: list[Any]) -> str:
    out = ["<|tool_calls_section_begin|>"]
    for call in tool_calls:
        if call.__class__ is not dict:
            raise _Decline
        call_id = call.get("id")
        function = call.get("function")
        if call_id.__class__ is not str or function.__class__ is not dict or "arguments" not in function:
            raise _Decline
        arguments = function["arguments"]
        if arguments.__class__ is not str:
            # `| tojson` is transformers' json.dumps(x, ensure_ascii=False) with default separators
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append(f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>")
    out.append("<|tool_calls_section_end|>")
    return "".join(out)


def _kimi_k25_text(
    messages: list[Any], tools: list[Any] | None, kwargs: Mapping[str, Any], add_generation_prompt: bool
) -> str:
    thinking = _check_call(messages, tools, kwargs, add_generation_prompt, _KIMI_KWARGS, "thinking")
    thinking_off = thinking is False  # `thinking is defined and thinking is false`
    tools_ts_str = kwargs.get("tools_ts_str")
    if tools_ts_str is not None and tools_ts_str.__class__ is not str:
        raise _Decline

    # Per message: (role, role name, content, tool calls or None, reasoning or None, message).
    rows = []
    for message in messages:
        role, tool_calls, reasoning = _message_basics(message)
        name = message.get("name")
        if name is None or name == "":
            role_name = role
        elif name.__class__ is str:
            role_name = name
        else:
            raise _Decline
        rows.append((role, role_name, message.get("content"), tool_calls, reasoning, message))

    # last assistant message without tool calls: it and everything before it is history
    last_plain_assistant = -1
    for idx in range(len(rows) - 1, -1, -1):
        if rows[idx][0] == "assistant" and not rows[idx][3]:
            last_plain_assistant = idx
            break

    out = []
    if tools:
        if tools_ts_str:
            out.append(f"<|im_system|>tool_declare<|im_middle|>{tools_ts_str}<|im_end|>")
        else:
            out.append("<|im_system|>tool_declare<|im_middle|>")
            out.append(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
            out.append(_IM_END)
    for idx, (role, role_name, content, tool_calls, reasoning, message) in enumerate(rows):
        if role == "user":
            out.append(f"<|im_user|>{role_name}<|im_middle|>")
        elif role == "assistant":
            out.append(f"<|im_assistant|>{role_name}<|im_middle|>")
        else:
            out.append(f"<|im_system|>{role_name}<|im_middle|>")
        if role == "assistant":
            if idx <= last_plain_assistant or thinking_off:
                out.append("<think></think>")
            else:
                out.append(f"<think>{reasoning or ''}</think>")
            out.append(_content_text(content))
            if tool_calls:
                out.append(_tool_calls_text(tool_calls))
        elif role == "tool":
            tool_call_id = message.get("tool_call_id")
            if tool_call_id is None:
                tool_call_id = ""  # missing (or None, dropped by transformers): Jinja prints nothing
            elif tool_call_id.__class__ is not str:
                raise _Decline
            out.append(f"## Return of {tool_call_id}\n")
            out.append(_content_text(content))
        else:
            out.append(_content_text(content))
        out.append(_IM_END)
    if add_generation_prompt:
        out.append(_GEN_NO_THINK if thinking_off else _GEN_THINK)
    return "".join(out)


# Conversations that exercise every branch of the native Kimi renderer (and the transformers
# preprocessing it mirrors); rendered both ways when a renderer is built.
def _kimi_probes() -> list[tuple[list[dict[str, Any]], list[Any] | None, dict[str, Any], bool]]:
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d <b> é",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
    call = {
        "id": "functions.f:0",
        "type": "function",
        "function": {"name": "f", "arguments": {"x": "é <&>", "n": [1, 2.5, None, True]}},
    }
    str_call = {"id": "functions.f:1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    convo: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1", "name": "alice"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": None},
        {"role": "assistant", "content": "", "reasoning": "r2", "tool_calls": [call, str_call]},
        {"role": "tool", "content": "res", "tool_call_id": "functions.f:0"},
        {"role": "tool", "content": [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}]},
        {"role": "assistant", "content": None, "thinking": "r3", "tool_calls": [call], "name": ""},
        {"role": "tool", "content": "r", "tool_call_id": None, "reasoning_content": None},
        {"role": "developer", "content": "dev"},
    ]
    probes: list[tuple[list[dict[str, Any]], list[Any] | None, dict[str, Any], bool]] = []
    kwargs: dict[str, Any]
    for kwargs in ({}, {"thinking": True}, {"thinking": False}):
        for gen in (True, False):
            probes.append((convo, None, kwargs, gen))
    probes += [
        (convo[:3], None, {}, True),
        (convo[:2], [tool], {"tools_ts_str": "# Tools\n"}, True),
        (convo[:2], [tool], {}, True),  # compact-JSON tool declaration
        (convo[:2], [tool], {"tools_ts_str": ""}, True),
        (convo[:2], None, {"tools_ts_str": "unused"}, True),
        ([{"role": "assistant", "content": "x", "tool_calls": []}, {"role": "user", "content": "y"}], None, {}, True),
    ]
    for convo_mt in multi_turn_probe_conversations("functions.f:"):
        for kwargs in ({}, {"thinking": False}):
            probes.append((convo_mt, [tool], kwargs, True))
        probes.append((convo_mt, None, {}, False))
    return probes


def multi_turn_probe_conversations(call_id_prefix: str) -> list[list[dict[str, Any]]]:
    """Conversations with the model's own earlier turns, as a multi-turn regeneration renders them.

    Assistant turns carry `reasoning_content` before and after the last user message, agentic
    tool-call chains (assistant tool_calls -> tool results -> assistant ...) with reasoning, several
    calls per turn, empty content, JSON-string and dict arguments. Both templates drop or keep the
    reasoning of history turns by their own rule (Kimi: kept only after the last assistant message
    without tool calls; Qwen3: kept only after the last real user query), which is exactly what
    these must agree on with the Jinja template.
    """

    def call(i: int, name: str, args: Any) -> dict[str, Any]:
        return {"id": f"{call_id_prefix}{i}", "type": "function", "function": {"name": name, "arguments": args}}

    chain: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "mt-r1"},
        {"role": "user", "content": "q2"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "mt-r2\n",
            "tool_calls": [call(0, "f", '{"x": "é"}'), call(1, "g", {"y": [1, None]})],
        },
        {"role": "tool", "content": "res0", "tool_call_id": f"{call_id_prefix}0"},
        {"role": "tool", "content": "", "tool_call_id": f"{call_id_prefix}1"},
        {"role": "assistant", "content": "mid", "reasoning_content": "\nmt-r3", "tool_calls": [call(2, "f", "{}")]},
        {"role": "tool", "content": "res2", "tool_call_id": f"{call_id_prefix}2"},
        {"role": "assistant", "content": "\n\nfinal", "reasoning_content": "mt-r4"},
    ]
    return [
        chain[:4],  # a history turn with reasoning before the last user message
        chain[:6],  # a chain in progress, one result back
        chain[:9],  # a chain in progress: every assistant turn after the last plain one keeps reasoning
        chain,  # the chain closed by a plain answer: all reasoning is history
        chain + [{"role": "user", "content": "q3"}],
        chain[:5],  # ends on an assistant tool-call turn (no result yet)
        [chain[1], {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": [call(0, "f", "")]}],
    ]


# -- Qwen3 ----------------------------------------------------------------------------------------

# sha256 of the chat template in ../shared/tokenizers/qwen3/tokenizer_config.json (Qwen3 0.6B-8B).
QWEN3_TEMPLATE_SHA256 = "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8"
_QWEN3_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "enable_thinking", "add_generation_prompt"})
_QWEN3_KWARGS = frozenset({"enable_thinking"})
_QWEN3_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_QWEN3_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)


_Qwen3Row = tuple[str, str, bool, Any, Any]  # role, content text, raw content is a str, tool calls, reasoning


def _qwen3_text(
    messages: list[Any], tools: list[Any] | None, kwargs: Mapping[str, Any], add_generation_prompt: bool
) -> str:
    enable_thinking = _check_call(messages, tools, kwargs, add_generation_prompt, _QWEN3_KWARGS, "enable_thinking")
    if not messages:
        raise _Decline
    rows = _qwen3_rows(messages)
    out = _qwen3_system(rows[0], tools)
    last = len(rows) - 1
    last_query_index = _qwen3_last_query(rows)
    for index, (role, content, _, tool_calls, reasoning) in enumerate(rows):
        if role == "user" or (role == "system" and index != 0):
            out.append("<|im_start|>" + role + "\n" + content + "<|im_end|>\n")
        elif role == "assistant":
            shows_thinking = index > last_query_index
            out += _qwen3_assistant(
                content, tool_calls, reasoning, shows_thinking=shows_thinking, is_last=index == last
            )
        elif role == "tool":
            if index == 0 or rows[index - 1][0] != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + content + "\n</tool_response>")
            if index == last or rows[index + 1][0] != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


def _qwen3_rows(messages: list[Any]) -> list[_Qwen3Row]:
    rows = []
    for message in messages:
        role, tool_calls, reasoning = _message_basics(message)
        content = message.get("content")
        is_str = content.__class__ is str
        if not is_str and content is not None and content.__class__ is not list:
            raise _Decline  # a dict/number content: `is string` is false, but keep to known shapes
        rows.append((role, content if is_str else "", is_str, tool_calls, reasoning))
    return rows


def _qwen3_system(first: _Qwen3Row, tools: list[Any] | None) -> list[str]:
    """The system turn: the tool declarations (with the first message's text if it is the system's), or the
    system message alone."""
    first_role, first_content, first_is_str = first[0], first[1], first[2]
    if first_role == "system" and not first_is_str:
        raise _Decline  # `messages[0].content + ...` on a non-string: a template error or a repr
    out = []
    if tools:
        out.append("<|im_start|>system\n")
        if first_role == "system":
            out.append(first_content + "\n\n")
        out.append(_QWEN3_TOOLS_HEADER)
        for tool in tools:
            out.append("\n")
            out.append(json.dumps(tool, ensure_ascii=False))
        out.append(_QWEN3_TOOLS_FOOTER)
    elif first_role == "system":
        out.append("<|im_start|>system\n" + first_content + "<|im_end|>\n")
    return out


def _qwen3_last_query(rows: list[_Qwen3Row]) -> int:
    """The index of the last user message that is not a wrapped tool response (the last row if none)."""
    for index in range(len(rows) - 1, -1, -1):
        role, content, is_str = rows[index][0], rows[index][1], rows[index][2]
        if (
            role == "user"
            and is_str
            and not (content.startswith("<tool_response>") and content.endswith("</tool_response>"))
        ):
            return index
    return len(rows) - 1


def _qwen3_assistant(
    content: str, tool_calls: Any, reasoning: Any, *, shows_thinking: bool, is_last: bool
) -> list[str]:
    """An assistant turn: its reasoning in a think block when after the last query, then its tool calls."""
    if reasoning is not None:
        reasoning_content = reasoning
    else:
        reasoning_content = ""
        if "</think>" in content:
            reasoning_content = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
    if shows_thinking and (is_last or reasoning_content):
        out = [
            "<|im_start|>assistant\n<think>\n" + reasoning_content.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
        ]
    else:
        out = ["<|im_start|>assistant\n" + content]
    if tool_calls:
        out += _qwen3_tool_calls(tool_calls, content)
    out.append("<|im_end|>\n")
    return out


def _qwen3_tool_calls(tool_calls: Any, content: str) -> list[str]:
    out = []
    for call_index, tool_call in enumerate(tool_calls):
        if tool_call.__class__ is not dict:
            raise _Decline
        if (call_index == 0 and content) or call_index != 0:
            out.append("\n")
        function = tool_call.get("function")
        if function:
            if function.__class__ is not dict:
                raise _Decline
            tool_call = function
        name = tool_call.get("name")
        if name.__class__ is not str or "arguments" not in tool_call:
            raise _Decline
        arguments = tool_call["arguments"]
        if arguments.__class__ is not str:
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append('<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments + "}\n</tool_call>")
    return out


def _qwen3_probes() -> list[tuple[list[dict[str, Any]], list[Any] | None, dict[str, Any], bool]]:
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d <b> é",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": {"x": "é <&>", "n": [1, None]}}}
    bare_call = {"name": "g", "arguments": '{"y": 2}'}
    convo: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "", "reasoning": "r2", "tool_calls": [call, bare_call]},
        {"role": "tool", "content": "res1"},
        {"role": "tool", "content": "res2"},
        {"role": "user", "content": "<tool_response>x</tool_response>"},
        {"role": "assistant", "content": "mid", "reasoning_content": None, "tool_calls": [call]},
        {"role": "tool", "content": None},
        {"role": "system", "content": "late system"},
        {"role": "developer", "content": "ignored"},
        {"role": "assistant", "content": "\nfinal", "thinking": "r3"},
    ]
    probes: list[tuple[list[dict[str, Any]], list[Any] | None, dict[str, Any], bool]] = []
    kwargs: dict[str, Any]
    for kwargs in ({}, {"enable_thinking": True}, {"enable_thinking": False}):
        for gen in (True, False):
            probes.append((convo, None, kwargs, gen))
            probes.append((convo, [tool], kwargs, gen))
    probes += [
        (convo[1:3], [tool], {}, True),
        (convo[1:5], None, {}, False),
        (
            [{"role": "user", "content": [{"type": "text", "text": "parts"}]}, {"role": "assistant", "content": "a"}],
            None,
            {},
            True,
        ),
    ]
    for convo_mt in multi_turn_probe_conversations("call_"):
        for kwargs in ({}, {"enable_thinking": False}):
            probes.append((convo_mt, [tool], kwargs, True))
        probes.append((convo_mt, None, {}, False))
    return probes


@dataclass(frozen=True)
class _Native:
    name: str
    render: NativeRender
    template_variables: frozenset[str]
    probes: Callable[[], list[tuple[list[dict[str, Any]], list[Any] | None, dict[str, Any], bool]]]


_NATIVE_BY_TEMPLATE = {
    KIMI_K25_TEMPLATE_SHA256: _Native("Kimi-K2.5", _declining(_kimi_k25_text), _KIMI_TEMPLATE_VARIABLES, _kimi_probes),
    QWEN3_TEMPLATE_SHA256: _Native("Qwen3", _declining(_qwen3_text), _QWEN3_TEMPLATE_VARIABLES, _qwen3_probes),
}


def native_renderer_for(tokenizer: Any, apply_template: Callable[..., list[str]]) -> NativeRender | None:
    """The native renderer for this tokenizer's chat template, or None (use Jinja).

    `apply_template(conversations, tools, kwargs, add_generation_prompt) -> texts` is the Jinja
    path; the native renderer must reproduce it on the probe set or it is not used.
    """
    native = _NATIVE_BY_TEMPLATE.get(template_sha256(getattr(tokenizer, "chat_template", None)) or "")
    if native is None:
        return None
    special = getattr(tokenizer, "special_tokens_map", {}) or {}
    if native.template_variables & set(special):
        return None
    try:
        for messages, tools, kwargs, gen in native.probes():
            text = native.render(messages, tools, kwargs, gen)
            reference = apply_template([messages], tools, dict(kwargs), gen)[0]
            if text != reference:
                logger.warning("native %s renderer disabled: differs from the Jinja template on a probe", native.name)
                return None
    except Exception as e:  # a probe the Jinja path rejects is also a difference
        logger.warning("native %s renderer disabled: probe failed (%s: %s)", native.name, type(e).__name__, e)
        return None
    return native.render
