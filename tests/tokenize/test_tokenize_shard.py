"""tokenize_shard: one shard's prompts, slice by slice, into its tokenized table and rejects (no Dagster)."""

from __future__ import annotations

import json

import polars as pl

from eagle3_dagster import schemas
from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.quality import prompt_features
from eagle3_dagster.tokenize import INVALID_JSON, PromptRenderer
from eagle3_dagster.tokenize.shard import tokenize_shard


def _prompts(n: int, *, bad: set[int] = frozenset()) -> pl.DataFrame:
    msgs = [json.dumps([{"role": "user", "content": f"question {i}?"}]) for i in range(n)]
    return pl.DataFrame(
        {
            "prompt_id": [f"p{i:03d}" for i in range(n)],
            "source": ["unit"] * n,
            "source_file": ["unit.jsonl"] * n,
            "source_row": list(range(1, n + 1)),
            "shard": [3] * n,
            "messages": ["{not json" if i in bad else m for i, m in enumerate(msgs)],
            "tools": [None] * n,
            "n_messages": [1] * n,
            "conversation": [None] * n,
            "regenerate": [None] * n,
        },
        schema=pl.Schema(schemas.PROMPTS),
    )


def test_a_shard_is_tokenized_slice_by_slice_and_its_counts_reconcile(
    tmp_path, kimi_renderer: PromptRenderer, kimi_profile: ModelProfile
):
    prompts = _prompts(7, bad={4})
    slices = [prompts.slice(0, 3), prompts.slice(3, 3), prompts.slice(6, 1)]
    done = tokenize_shard(
        slices,
        kimi_renderer,
        tmp_path,
        max_new_tokens=16,
        control_text={},
        features=lambda t: prompt_features(t, kimi_profile),
    )
    assert (done.prompts_in, done.tokenized, done.rejects.height) == (7, 6, 1)
    stored = pl.read_parquet(tmp_path / "part-0000.parquet")
    assert stored["prompt_id"].to_list() == [f"p{i:03d}" for i in range(7) if i != 4]  # the input's order
    assert all(ids[-1] == kimi_profile.think_start_id for ids in stored["input_ids"].to_list())
    rejects = pl.read_parquet(tmp_path / "rejects.parquet")
    assert rejects["prompt_id"].to_list() == ["p004"] and rejects["reason"].to_list() == [INVALID_JSON]
    assert done.features.height == 6 and done.features["ends_with_think_start"].all()


def test_a_shard_without_prompts_leaves_empty_tables_and_an_empty_feature_frame(
    tmp_path, kimi_renderer: PromptRenderer, kimi_profile: ModelProfile
):
    done = tokenize_shard(
        [],
        kimi_renderer,
        tmp_path,
        max_new_tokens=16,
        control_text={},
        features=lambda t: prompt_features(t, kimi_profile),
    )
    assert (done.prompts_in, done.tokenized, done.rejects.height, done.features.height) == (0, 0, 0, 0)
    assert "prompt_len" in done.features.columns
    assert pl.read_parquet(tmp_path / "part-0000.parquet").columns == schemas.TOKENIZED_PROMPTS.names
    assert pl.read_parquet(tmp_path / "rejects.parquet").columns == schemas.TOKENIZE_REJECTS.names
