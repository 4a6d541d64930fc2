"""The model profiles' token ids agree with the real tokenizers, and each profile renders as it says."""

from __future__ import annotations

import pytest

from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.tokenize import PromptRenderer, TokenizerLoadError

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _token_id(tokenizer, token: str) -> int:
    ids = tokenizer.encode(token, add_special_tokens=False)
    assert len(ids) == 1, f"{token!r} is not a single token: {ids}"
    assert tokenizer.convert_tokens_to_ids(token) == ids[0]
    return ids[0]


@pytest.mark.parametrize(
    "renderer_fixture,think,end_of_turn,tool_tokens,extra_stop",
    [
        (
            "kimi_renderer",
            ("<think>", "</think>"),
            "<|im_end|>",
            {
                "section_begin": "<|tool_calls_section_begin|>",
                "section_end": "<|tool_calls_section_end|>",
                "call_begin": "<|tool_call_begin|>",
                "argument_begin": "<|tool_call_argument_begin|>",
                "call_end": "<|tool_call_end|>",
            },
            [],
        ),
        (
            "qwen_renderer",
            ("<think>", "</think>"),
            "<|im_end|>",
            {"call_begin": "<tool_call>", "call_end": "</tool_call>"},
            ["<|endoftext|>"],
        ),
    ],
)
def test_profile_ids_match_the_tokenizer(request, renderer_fixture, think, end_of_turn, tool_tokens, extra_stop):
    renderer: PromptRenderer = request.getfixturevalue(renderer_fixture)
    tok, profile = renderer.tokenizer, renderer.profile
    assert (profile.think_start_id, profile.think_end_id) == (_token_id(tok, think[0]), _token_id(tok, think[1]))
    assert profile.end_of_turn_id == _token_id(tok, end_of_turn)
    assert set(profile.stop_token_ids) == {profile.end_of_turn_id, *(_token_id(tok, t) for t in extra_stop)}
    for field, token in tool_tokens.items():
        assert getattr(profile.tool_call_ids, field) == _token_id(tok, token), field
    assert profile.vocab_size == len(tok)


def test_kimi_profile_generation_prompt_ends_with_think(kimi_renderer: PromptRenderer) -> None:
    profile = kimi_renderer.profile
    assert profile.generation_prompt_ends_with_think_start
    ids = kimi_renderer.render([{"role": "user", "content": "hi"}], [WEATHER_TOOL]).input_ids
    assert ids[-1] == profile.think_start_id


def test_qwen3_renders_without_think_in_the_generation_prompt(qwen_renderer: PromptRenderer) -> None:
    profile = qwen_renderer.profile
    assert not profile.generation_prompt_ends_with_think_start
    result = qwen_renderer.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}])
    assert result.reason is None, result.detail
    assert result.text.endswith("<|im_start|>assistant\n")
    assert profile.think_start_id not in result.input_ids
    assert result.input_ids == qwen_renderer.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        enable_thinking=True,
    )


def test_qwen3_tools_go_through_the_hf_template(qwen_renderer: PromptRenderer) -> None:
    result = qwen_renderer.render([{"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL])
    assert result.reason is None, result.detail
    assert "<tools>" in result.text and '"name": "get_weather"' in result.text
    assert "namespace functions" not in result.text
    assert result.text.endswith("<|im_start|>assistant\n")


def test_profile_with_hub_tokenizer_offline_is_a_clear_error(kimi_profile: ModelProfile, tmp_path, monkeypatch):
    # The shipped profile names a Hub id; in this offline test session it must fail clearly, not hang.
    hub_profile = kimi_profile.with_tokenizer("eagle3-test-owner/definitely-not-cached")
    with pytest.raises(TokenizerLoadError, match="eagle3-test-owner/definitely-not-cached"):
        PromptRenderer(hub_profile, cache_dir=tmp_path)


def test_template_not_matching_the_profile_is_quarantined(qwen_profile: ModelProfile, qwen_renderer) -> None:
    # A profile that promises a <think>-terminated generation prompt, with a template that does not
    # prefill it (like Kimi-K2-Thinking's under the K2.5 profile), must not pass silently.
    import dataclasses

    wrong = PromptRenderer(
        dataclasses.replace(qwen_profile, generation_prompt_ends_with_think_start=True), qwen_renderer.tokenizer
    )
    result = wrong.render([{"role": "user", "content": "hi"}])
    assert result.reason == "generation_prompt_mismatch" and "151667" in result.detail
    assert wrong.render([{"role": "user", "content": "hi"}], add_generation_prompt=False).ok
