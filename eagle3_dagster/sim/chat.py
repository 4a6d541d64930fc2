"""`/v1/chat/completions` with an emulated reasoning parser: the endpoint the pipeline must NOT use.

It exists to show the bug side by side with `/generate`. Like SGLang serving Kimi-K2.5 with
`--reasoning-parser kimi_k2` and the default `skip_special_tokens=true` (ai-dynamo PR #9227), the
detokenizer drops `</think>` (the deployed tokenizer treats it as special), so the parser never sees
the end of the reasoning: everything lands in `reasoning_content` and `content` is null. SGLang turns
`skip_special_tokens` off when `tools` are sent; then the split is right. Qwen3's `</think>` is not
special, so its split works. The same prompt ids produce the same `output_ids` as `/generate`.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from aiohttp import web

from . import protocol as P
from .answer import reasoning_tokens
from .engine import Engine, Progress
from .state import Sim

_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?P<id>[^<]+?)\s*<\|tool_call_argument_begin\|>(?P<args>.*?)<\|tool_call_end\|>", re.S
)
_QWEN_CALL = re.compile(r"<tool_call>\s*(?P<json>\{.*?\})\s*</tool_call>", re.S)


def _err(msg: str, status: int = 400) -> web.Response:
    body = {"object": "error", "message": msg, "type": "BadRequestError", "param": None, "code": status}
    return web.Response(text=json.dumps(body, separators=(",", ":")), status=status, content_type="application/json")


def _stripped_ids(sim: Sim) -> set[int]:
    """Ids the deployed detokenizer drops with skip_special_tokens=true."""
    p = sim.profile
    ids = set(sim.tok.all_special_ids)
    if p.template_family == "kimi_ts":
        # In the deployed Kimi tokenizer `<think>`, `</think>` and the tool markers are special.
        ids |= {p.think_start_id, p.think_end_id}
        t = p.tool_call_ids
        ids |= {
            x for x in (t.section_begin, t.section_end, t.call_begin, t.argument_begin, t.call_end) if x is not None
        }
    return ids


def split_reasoning(sim: Any, text: str) -> tuple[str | None, str | None]:
    """Emulated reasoning parser (kimi_k2 / qwen3, prompt prefilled or not)."""
    tok = sim.tok
    start = tok.convert_ids_to_tokens(sim.profile.think_start_id)
    end = tok.convert_ids_to_tokens(sim.profile.think_end_id)
    body = text
    if body.lstrip().startswith(start):
        body = body.lstrip()[len(start) :]
    elif not sim.profile.generation_prompt_ends_with_think_start and sim.profile.template_family != "kimi_ts":
        return None, text  # Qwen3-style detector: no <think>, no reasoning
    if end in body:
        reasoning, content = body.split(end, 1)
        return reasoning.strip("\n") or None, content.lstrip("\n") or None
    if sim.version == P.V0_5_23 and "<|tool_calls_section_begin|>" in body:
        r, c = body.split("<|tool_calls_section_begin|>", 1)
        return r or None, "<|tool_calls_section_begin|>" + c
    return body or None, None  # no end marker seen: all of it is "reasoning"


def parse_tool_calls(content: str) -> tuple[str | None, list[dict[str, Any]] | None]:
    calls: list[dict[str, Any]] = []
    if "<|tool_calls_section_begin|>" in content:
        before, rest = content.split("<|tool_calls_section_begin|>", 1)
        for i, m in enumerate(_KIMI_CALL.finditer(rest)):
            fid = m.group("id")
            name = fid.split(".", 1)[-1].rsplit(":", 1)[0]
            calls.append(
                {"id": fid, "index": i, "type": "function", "function": {"name": name, "arguments": m.group("args")}}
            )
        return (before or None), calls or None
    if "<tool_call>" in content:
        before = content.split("<tool_call>", 1)[0]
        for i, m in enumerate(_QWEN_CALL.finditer(content)):
            try:
                d = json.loads(m.group("json"))
            except ValueError:
                continue
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "index": i,
                    "type": "function",
                    "function": {"name": d.get("name"), "arguments": json.dumps(d.get("arguments", {}))},
                }
            )
        return (before.strip() or None), calls or None
    return content, None


async def chat_completion(sim: Sim, engine: Engine, body: Any) -> web.Response:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return _err("messages must be a non-empty list")
    if body.get("stream"):
        return _err("the simulator's /v1/chat/completions does not stream; use /generate")
    item = _chat_item(sim, body)
    if isinstance(item, web.Response):
        return item
    tools = body.get("tools") or None
    # SGLang keeps special tokens in the text when tools are present
    skip_special = bool(body.get("skip_special_tokens", True)) and not tools
    pr = await engine.run(item, None)
    resp = _completion(sim, pr, tools=bool(tools), skip_special=skip_special)
    return web.Response(
        text=json.dumps(resp, separators=(",", ":"), ensure_ascii=False), content_type="application/json"
    )


def _chat_item(sim: Sim, body: dict[str, Any]) -> P.Item | web.Response:
    """The messages rendered with the chat template and the OpenAI sampling fields as one scheduler item, or
    the 400 answer for a template that fails or a request that does not fit."""
    kwargs = dict(sim.profile.template_kwargs)
    kwargs.update(body.get("chat_template_kwargs") or {})
    try:
        rendered = sim.tok.apply_chat_template(
            body["messages"], tools=body.get("tools") or None, add_generation_prompt=True, tokenize=False, **kwargs
        )
    except Exception as e:  # template errors are the client's fault
        return _err(f"chat template failed: {e}")
    ids = list(sim.tok.encode(rendered, add_special_tokens=False))
    sp: dict[str, Any] = {"max_new_tokens": body.get("max_completion_tokens") or body.get("max_tokens")}
    for k in ("temperature", "top_p", "top_k", "min_p", "stop_token_ids", "ignore_eos", "min_new_tokens"):
        if body.get(k) is not None:
            sp[k] = body[k]
    s = P.to_sampling(sp)
    item = P.Item(f"chatcmpl-{uuid.uuid4().hex}", ids, s, 0)
    try:
        P.context_checks(item, sim.context_length, sim.version, allow_auto_truncate=sim.allow_auto_truncate)
        P.check_ranges(s, sim.version)
    except P.SimError as e:
        return _err(e.message, e.status)
    return item


def _completion(sim: Sim, pr: Progress, *, tools: bool, skip_special: bool) -> dict[str, Any]:
    """The chat.completion body: the output detokenized as the deployed server does, then split by the
    emulated reasoning parser (and the tool-call parser when tools were sent)."""
    out = list(pr.produced)
    fr = pr.finish_reason or {}
    if fr.get("type") == "stop" and isinstance(fr.get("matched"), int) and out and out[-1] == fr["matched"]:
        out = out[:-1]
    drop = _stripped_ids(sim) if skip_special else set()
    text = sim.tok.decode([t for t in out if t not in drop], skip_special_tokens=False)
    reasoning, content = split_reasoning(sim, text)
    tool_calls = None
    if tools and content:
        content, tool_calls = parse_tool_calls(content)
    finish = {"stop": "stop", "length": "length", "abort": "abort"}.get(fr.get("type", ""), "stop")
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": tool_calls}
    ids, n_out = pr.item.input_ids, len(pr.produced)
    return {
        "id": pr.item.rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": sim.args.served_model_name,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else finish,
                "matched_stop": fr.get("matched"),
            }
        ],
        "usage": {
            "prompt_tokens": len(ids),
            "total_tokens": len(ids) + n_out,
            "completion_tokens": n_out,
            "prompt_tokens_details": None,
            "reasoning_tokens": reasoning_tokens(sim, pr.produced) if sim.version == P.V0_5_23 else 0,
        },
        # Not an OpenAI field: lets a demo show the raw ids next to the parsed split.
        "sim_output_ids": list(pr.produced),
        "sim_prompt_ids": ids,
    }
