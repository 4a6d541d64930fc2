"""tokenize_prompts: PROMPTS rows -> TOKENIZED_PROMPTS + TOKENIZE_REJECTS, counts reconcile."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

from eagle3_dagster import schemas
from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.tokenize import PromptRenderer, tokenize_prompts

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _prompt_rows(rows: list[tuple[str, Any, Any]]) -> pl.DataFrame:
    """rows: (prompt_id, messages JSON text, tools JSON text or None)."""
    data = {
        "prompt_id": [r[0] for r in rows],
        "source": ["unit"] * len(rows),
        "source_file": ["unit.jsonl"] * len(rows),
        "source_row": list(range(1, len(rows) + 1)),
        "shard": [i % 2 for i in range(len(rows))],
        "messages": [r[1] for r in rows],
        "tools": [r[2] for r in rows],
        "n_messages": [1] * len(rows),
        "conversation": [None] * len(rows),  # final_turn prompts (regenerate: all_turns fills these)
        "regenerate": [None] * len(rows),
    }
    return pl.from_arrow(pa.Table.from_pydict(data, schema=schemas.PROMPTS))


def _user(text: str) -> str:
    return json.dumps([{"role": "user", "content": text}])


def test_good_and_bad_rows_reconcile(kimi_renderer: PromptRenderer) -> None:
    prompts = _prompt_rows(
        [
            ("p-ok", _user("What is 2+2?"), None),
            ("p-tools", _user("Weather in Paris?"), json.dumps([WEATHER_TOOL])),
            ("p-badjson", "[{not json", None),
            ("p-norole", json.dumps([{"content": "hi"}]), None),
            ("p-empty", "[]", None),
            ("p-badtools", _user("x"), '{"oops"'),
        ]
    )
    tokenized, rejects = tokenize_prompts(prompts, kimi_renderer, max_new_tokens=1024)
    assert tokenized.height + rejects.height == prompts.height
    assert tokenized.schema == pl.from_arrow(schemas.TOKENIZED_PROMPTS.empty_table()).schema
    assert rejects.schema == pl.from_arrow(schemas.TOKENIZE_REJECTS.empty_table()).schema
    assert tokenized["prompt_id"].to_list() == ["p-ok", "p-tools"]
    reasons = dict(zip(rejects["prompt_id"], rejects["reason"]))
    assert reasons == {
        "p-badjson": "invalid_json",
        "p-norole": "render_error",
        "p-empty": "render_error",
        "p-badtools": "invalid_json",
    }
    details = dict(zip(rejects["prompt_id"], rejects["detail"]))
    assert "messages[0].role" in details["p-norole"] and details["p-badtools"].startswith("tools:")

    expected = kimi_renderer.render([{"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL]).input_ids
    row = tokenized.filter(pl.col("prompt_id") == "p-tools").row(0, named=True)
    assert row["input_ids"] == expected and row["prompt_len"] == len(expected)
    assert row["shard"] == 1 and row["source"] == "unit" and row["profile"] == "kimi-k2.5"
    assert set(tokenized["tokenizer_fingerprint"]) == {kimi_renderer.tokenizer_fingerprint}
    assert set(tokenized["template_hash"]) == {kimi_renderer.template_hash}


def test_over_length_prompts_are_quarantined_not_truncated(kimi_profile: ModelProfile, kimi_tok) -> None:
    short, long_ = _user("hi"), _user("word " * 400)
    short_len = len(PromptRenderer(kimi_profile, kimi_tok).render(json.loads(short)).input_ids)
    # max_prompt_tokens between the two prompt lengths
    tight = PromptRenderer(dataclasses.replace(kimi_profile, max_prompt_tokens=short_len + 50), kimi_tok)
    tokenized, rejects = tokenize_prompts(
        _prompt_rows([("s", short, None), ("l", long_, None)]), tight, max_new_tokens=16
    )
    assert tokenized["prompt_id"].to_list() == ["s"]
    assert rejects.row(0, named=True)["reason"] == "prompt_too_long"
    assert "prompt_len" in rejects["detail"][0]
    # prompt_len + max_new_tokens beyond the context window is quarantined too
    small_ctx = PromptRenderer(dataclasses.replace(kimi_profile, context_length=short_len + 100), kimi_tok)
    tokenized, rejects = tokenize_prompts(_prompt_rows([("s", short, None)]), small_ctx, max_new_tokens=101)
    assert tokenized.height == 0 and rejects["reason"].to_list() == ["prompt_too_long"]
    tokenized, rejects = tokenize_prompts(_prompt_rows([("s", short, None)]), small_ctx, max_new_tokens=100)
    assert tokenized["prompt_len"].to_list() == [short_len] and rejects.height == 0


def test_ids_outside_the_model_vocabulary_are_quarantined(kimi_profile: ModelProfile, kimi_tok) -> None:
    # A profile whose model vocabulary is smaller than the tokenizer's: control tokens fall outside.
    narrow = PromptRenderer(dataclasses.replace(kimi_profile, vocab_size=163584), kimi_tok)
    tokenized, rejects = tokenize_prompts(_prompt_rows([("p", _user("hi"), None)]), narrow, max_new_tokens=16)
    assert tokenized.height == 0
    assert rejects["reason"].to_list() == ["id_out_of_vocab"]


def test_batches_smaller_than_the_input_give_the_same_result(kimi_renderer: PromptRenderer) -> None:
    prompts = _prompt_rows([(f"p{i}", _user(f"question {i}"), None) for i in range(7)] + [("bad", "x", None)])
    whole, whole_rejects = tokenize_prompts(prompts, kimi_renderer, max_new_tokens=16)
    chunked, chunked_rejects = tokenize_prompts(prompts, kimi_renderer, max_new_tokens=16, batch_rows=3)
    assert whole.equals(chunked) and whole_rejects.equals(chunked_rejects)
    assert whole.height == 7 and whole_rejects.height == 1


def test_missing_required_column_is_a_clear_error(kimi_renderer: PromptRenderer) -> None:
    with pytest.raises(ValueError, match="messages"):
        tokenize_prompts(
            pl.DataFrame({"prompt_id": ["a"], "source": ["s"], "shard": [0]}), kimi_renderer, max_new_tokens=16
        )


def test_lineage_fingerprint_and_template_hash(
    kimi_renderer: PromptRenderer, kimi_profile: ModelProfile, kimi_tok, qwen_profile: ModelProfile, qwen_renderer
) -> None:
    # same tokenizer (loaded independently) -> same fingerprint
    again = PromptRenderer(qwen_profile)
    assert again.tokenizer_fingerprint == qwen_renderer.tokenizer_fingerprint
    assert again.template_hash == qwen_renderer.template_hash
    assert qwen_renderer.tokenizer_fingerprint != kimi_renderer.tokenizer_fingerprint
    # a changed chat template -> different template hash, same tokenizer fingerprint
    again.tokenizer.chat_template = again.tokenizer.chat_template.replace("<|im_start|>assistant", "<|im_start|>bot")
    changed = PromptRenderer(qwen_profile, again.tokenizer)
    assert changed.template_hash != qwen_renderer.template_hash
    assert changed.tokenizer_fingerprint == qwen_renderer.tokenizer_fingerprint
    # changed template kwargs -> different template hash
    no_think = PromptRenderer(dataclasses.replace(kimi_profile, template_kwargs={"thinking": False}), kimi_tok)
    assert no_think.template_hash != kimi_renderer.template_hash


def test_one_failing_row_does_not_affect_its_batch(kimi_renderer: PromptRenderer, qwen_renderer) -> None:
    from eagle3_dagster.tokenize import RenderRequest

    good = [{"role": "user", "content": "hi"}]
    # a tool call without `function` makes the Kimi template fail on this row only
    bad = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]},
        {"role": "user", "content": "again"},
    ]
    tools_json = json.dumps([WEATHER_TOOL])
    for renderer in (kimi_renderer, qwen_renderer):
        requests = [
            RenderRequest(good),
            RenderRequest(bad),
            RenderRequest(good, [WEATHER_TOOL], tools_key=tools_json),
            RenderRequest([{"role": "user", "content": "other"}], [WEATHER_TOOL], tools_key=tools_json),
        ]
        results = renderer.render_batch(requests)
        singles = [renderer.render(r.messages, r.tools) for r in requests]
        assert [r.input_ids for r in results] == [s.input_ids for s in singles]
        assert results[1].reason == singles[1].reason == "render_error"
        assert results[0].ok and results[2].ok and results[3].ok


@pytest.mark.parametrize("renderer_name", ["kimi_renderer", "qwen_renderer"])
def test_odd_rows_never_crash_and_reconcile(request, renderer_name: str) -> None:
    renderer: PromptRenderer = request.getfixturevalue(renderer_name)
    odd = [
        ("dict-not-list", json.dumps({"role": "user", "content": "hi"}), None, "render_error"),
        ("null-messages", "null", None, "render_error"),
        ("null-content", json.dumps([{"role": "user", "content": None}]), None, None),
        ("parts-content", json.dumps([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]), None, None),
        ("tools-dict", _user("hi"), json.dumps({"a": 1}), "render_error"),
        ("tools-strings", _user("hi"), json.dumps(["x"]), "render_error"),
        ("plugin-only-tools", _user("hi"), json.dumps([{"type": "_plugin", "name": "web"}]), None),
        ("unicode", _user("\u0000\ud7ff\U0001f30d 你好 \u200b"), None, None),
    ]
    prompts = _prompt_rows([(pid, msgs, tools) for pid, msgs, tools, _ in odd])
    tokenized, rejects = tokenize_prompts(prompts, renderer, max_new_tokens=16)
    assert tokenized.height + rejects.height == len(odd)
    reasons = dict(zip(rejects["prompt_id"], rejects["reason"]))
    assert reasons == {pid: reason for pid, _, _, reason in odd if reason}
    assert all(detail for detail in rejects["detail"])


@pytest.mark.parametrize("renderer_name", ["kimi_renderer", "qwen_renderer"])
def test_batched_pipeline_equals_per_row_apply_chat_template_on_real_tools(
    request, renderer_name: str, datasets_dir
) -> None:
    """Grouped, batched rendering must not change a single id versus the naive per-row call."""
    from eagle3_dagster.tokenize import compute_tools_ts_str

    renderer: PromptRenderer = request.getfixturevalue(renderer_name)
    records = json.loads((datasets_dir / "glaive_toolcall_sharegpt_en" / "glaive_toolcall_en_demo.json").read_text())
    rows = []
    for i, record in enumerate(records[:80]):
        first_user = next(t["value"] for t in record["conversations"] if t["from"] == "human")
        tools = [{"type": "function", "function": f} for f in json.loads(record["tools"] or "[]")] or None
        rows.append((f"g{i}", _user(first_user), json.dumps(tools, sort_keys=True) if tools else None))
    tokenized, rejects = tokenize_prompts(_prompt_rows(rows), renderer, max_new_tokens=16, batch_rows=32)
    assert rejects.height == 0 and tokenized.height == len(rows)
    tok, profile = renderer.tokenizer, renderer.profile
    for (pid, messages_json, tools_json), ids in zip(rows, tokenized["input_ids"].to_list()):
        tools = json.loads(tools_json) if tools_json else None
        kwargs = dict(profile.template_kwargs)
        if profile.template_family == "kimi_ts" and tools:
            tools, tools_ts_str, _ = compute_tools_ts_str(tools)
            kwargs["tools_ts_str"] = tools_ts_str
        expected = tok.apply_chat_template(
            json.loads(messages_json),
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **kwargs,
        )
        assert ids == list(expected), pid
