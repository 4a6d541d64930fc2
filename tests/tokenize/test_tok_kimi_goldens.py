"""Kimi-K2.5 renders must equal the official remote-code tokenizer's, text and ids, byte for byte.

Every case renders from messages + tools through OUR tools_ts_str (never the golden one).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.tokenize import PromptRenderer, RenderRequest, compute_tools_ts_str

_GOLDEN = PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5" / "golden"
CHAT = json.loads((_GOLDEN / "chat_renders.json").read_text(encoding="utf-8"))
TOOLS_TS = json.loads((_GOLDEN / "tools_ts_cases.json").read_text(encoding="utf-8"))
ALL_CASES = CHAT["cases"] + TOOLS_TS["cases"]
TOOL_CASES = [c for c in ALL_CASES if c.get("tools")]
THINK_START, THINK_END = 163606, 163607


def _ids(case: dict[str, Any]) -> str:
    return case["name"]


@pytest.mark.parametrize("case", ALL_CASES, ids=_ids)
def test_golden_render_text_and_ids(kimi_renderer: PromptRenderer, case: dict[str, Any]) -> None:
    result = kimi_renderer.render(
        case["messages"],
        case["tools"],
        add_generation_prompt=case["add_generation_prompt"],
        template_kwargs=case["template_kwargs"],
    )
    assert result.reason is None, result.detail
    assert result.text == case["text"]
    assert result.input_ids == case["input_ids"]


@pytest.mark.parametrize("case", TOOL_CASES, ids=_ids)
def test_our_tools_ts_str_equals_official(case: dict[str, Any]) -> None:
    _sorted_tools, tools_ts_str, fallback_reason = compute_tools_ts_str(case["tools"])
    # golden None means the official tokenizer fell back to compact JSON
    assert tools_ts_str == case.get("tools_ts_str")
    assert (fallback_reason is not None) == (case.get("tools_ts_str") is None)


@pytest.mark.parametrize("sample", CHAT["encode_samples"], ids=lambda s: s["text"][:30])
def test_encode_samples(kimi_renderer: PromptRenderer, sample: dict[str, Any]) -> None:
    assert kimi_renderer.encode_texts([sample["text"]]) == [sample["ids"]]


def test_batched_render_equals_apply_chat_template_tokenize(kimi_renderer: PromptRenderer, kimi_tok) -> None:
    """Render-then-one-batched-encode must give what apply_chat_template(tokenize=True) gives."""
    requests = [
        RenderRequest(c["messages"], c["tools"], c["add_generation_prompt"], c["template_kwargs"]) for c in ALL_CASES
    ]
    batched = kimi_renderer.render_batch(requests)
    for case, result in zip(ALL_CASES, batched):
        kwargs = dict(case["template_kwargs"])
        if case.get("tools_ts_str"):
            kwargs["tools_ts_str"] = case["tools_ts_str"]
        tools = compute_tools_ts_str(case["tools"])[0] if case["tools"] else case["tools"]
        reference = kimi_tok.apply_chat_template(
            case["messages"],
            tools=tools,
            add_generation_prompt=case["add_generation_prompt"],
            tokenize=True,
            return_dict=False,
            **kwargs,
        )
        assert result.input_ids == list(reference), case["name"]


def test_thinking_generation_prompt_ends_with_think(kimi_renderer: PromptRenderer) -> None:
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    assert kimi_renderer.render(msgs).input_ids[-1] == THINK_START
    off = kimi_renderer.render(msgs, template_kwargs={"thinking": False}).input_ids
    assert off[-2:] == [THINK_START, THINK_END]


def test_tools_are_deep_sorted_for_json_fallback(kimi_renderer: PromptRenderer) -> None:
    # Only a non-function tool: the official tokenizer shows compact JSON of the deep-sorted list.
    tools = [{"type": "_plugin", "name": "web", "config": {"z": 1, "a": [{"y": 2, "b": 3}]}}]
    text = kimi_renderer.render([{"role": "user", "content": "hi"}], tools).text
    assert '<|im_middle|>[{"config":{"a":[{"b":3,"y":2}],"z":1},"name":"web","type":"_plugin"}]<|im_end|>' in text


def test_schema_error_in_one_tool_falls_back_to_json_for_all(kimi_renderer: PromptRenderer) -> None:
    good = {"type": "function", "function": {"name": "ok", "parameters": {"type": "object", "properties": {}}}}
    bad = {
        "type": "function",
        "function": {"name": "bad", "parameters": {"type": "object", "properties": {"x": {"oneOf": [{"const": 1}]}}}},
    }
    _, ts_good, _ = compute_tools_ts_str([good])
    assert ts_good is not None and "type ok = (_: {}) => any;" in ts_good
    _, ts_both, reason = compute_tools_ts_str([good, bad])
    assert ts_both is None and "no recognised type" in reason
    text = kimi_renderer.render([{"role": "user", "content": "hi"}], [good, bad]).text
    assert "namespace functions" not in text and '"name":"ok"' in text and '"name":"bad"' in text


def test_empty_tools_list_has_no_tool_turn(kimi_renderer: PromptRenderer) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert kimi_renderer.render(msgs, []).input_ids == kimi_renderer.render(msgs, None).input_ids
    assert "tool_declare" not in kimi_renderer.render(msgs, []).text
