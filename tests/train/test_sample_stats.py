"""The training summaries' per-sample lengths (summary.sample_stats) are the generations gate's
(quality.generation_features) on the same output ids: one definition, also for awkward outputs."""

from __future__ import annotations

import random

import polars as pl
import pytest

from eagle3_dagster.quality.features import generation_features
from eagle3_dagster.train.summary import sample_stats


@pytest.mark.parametrize("which", ["kimi", "qwen"])
def test_sample_stats_lengths_are_the_generation_gates(which, kimi_profile, qwen_profile):
    profile = kimi_profile if which == "kimi" else qwen_profile
    t = profile.tool_call_ids
    markers = [profile.think_start_id, profile.think_end_id, t.section_begin, t.section_end, t.call_begin]
    markers = [m for m in [*markers, t.call_end, *profile.stop_token_ids] if m is not None]
    rng = random.Random(7)
    rows = []
    for i in range(2000):  # outputs dense in markers: none, several, leading, trailing, empty
        out = [
            rng.choice(markers) if rng.random() < 0.15 else rng.randrange(100, 5000) for _ in range(rng.randint(0, 30))
        ]
        plen = rng.randint(0, 12)
        rows.append(
            {
                "sample_id": f"s{i}",
                "prompt_id": f"p{i % 50}",
                "source": rng.choice(["a", "b", None]),
                "finish_reason": rng.choice(["stop", "length"]),
                "model_revision": "r1",
                "sampling_hash": "h1",
                "input_ids": list(range(7, 7 + plen)) + out,
                "prompt_len": plen,
                "output_len": len(out),
            }
        )
    samples = pl.DataFrame(
        rows, schema_overrides={"input_ids": pl.List(pl.Int32), "prompt_len": pl.Int32, "output_len": pl.Int32}
    )
    stats = sample_stats(samples, profile)
    gens = samples.select(
        "sample_id",
        "prompt_id",
        "source",
        "finish_reason",
        pl.col("input_ids").list.slice(pl.col("prompt_len")).alias("output_ids"),
        pl.col("output_len").alias("completion_tokens"),
    )
    gate = generation_features(gens, None, profile)
    assert stats.select("output_len", "reasoning_len", "answer_len").equals(
        gate.select("output_len", "reasoning_len", "answer_len")
    )
    assert stats["think_end"].to_list() == (gate["think_end_count"] > 0).to_list()
    assert stats["has_tool_call"].to_list() == gate["has_tool_call"].fill_null(False).to_list()
    assert stats["prompt_len"].to_list() == samples["prompt_len"].to_list()
    # the inputs reach every branch: no think-end (null lengths), answers cut by a tool call, tool calls
    assert stats["answer_len"].null_count() > 100 and stats["answer_len"].drop_nulls().n_unique() > 5
    assert stats["has_tool_call"].sum() > 100 and (~stats["has_tool_call"]).sum() > 100
