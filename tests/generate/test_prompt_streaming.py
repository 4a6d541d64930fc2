"""The generations asset streams the tokenized shard: prompt_view / prompts_by_id / the two planning
passes read a folder (local or object storage) in batches and give exactly what the whole frame gave."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from gen_helpers import make_prompts

from eagle3_dagster import storage
from eagle3_dagster.generate.inputs import SampleKeys, iter_pending, plan_shard, prompt_view, prompts_by_id
from eagle3_dagster.storage import DataPath, data_root, write_frame_atomic

U = np.uint64
KEYS = SampleKeys("m", "s", None)


@pytest.fixture()
def prompts() -> pl.DataFrame:
    return pl.concat([make_prompts(3000, seed=8), make_prompts(7, seed=8)])  # > one batch, with duplicates


def _expected_view(df: pl.DataFrame, tail: int) -> pl.DataFrame:
    return df.select(
        pl.col("prompt_id"),
        pl.col("template_hash"),
        pl.col("source"),
        pl.col("input_ids").list.len().cast(pl.Int32).alias("prompt_len"),
        pl.col("input_ids").list.tail(tail),
    )


def _sources(df: pl.DataFrame, tmp_path: Path) -> dict[str, object]:
    local = tmp_path / "tokenized_prompts" / "shard=0000"
    write_frame_atomic(df, local / "part-0000.parquet")
    mem = data_root(f"memory://{tmp_path.name}") / "tokenized_prompts" / "shard=0000"
    write_frame_atomic(df, mem / "part-0000.parquet")
    return {"frame": df, "path": local, "datapath": storage.as_data_path(local), "object": mem}


@pytest.mark.parametrize("kind", ["frame", "path", "datapath", "object"])
def test_streamed_views_equal_the_whole_frame(prompts, tmp_path, kind, monkeypatch):
    src = _sources(prompts, tmp_path)[kind]
    if kind == "object":
        # never downloaded whole: no read of the full object, no eager read of the table
        monkeypatch.setattr(DataPath, "read_bytes", lambda self: pytest.fail(f"{self} read whole"))
        monkeypatch.setattr(storage, "read_parquet", lambda *a, **k: pytest.fail("read_parquet on object storage"))
    view = prompt_view(src, tail=8)
    assert view.equals(_expected_view(prompts, 8))
    ids = [prompts["prompt_id"][5], prompts["prompt_id"][2999], "nope"]
    got = prompts_by_id(src, ids)
    assert got.equals(prompts.filter(pl.col("prompt_id").is_in(ids[:2])))
    assert prompts_by_id(src, []).height == 0
    none = (np.empty(0, U), np.empty(0, U))
    plan = plan_shard(src, KEYS, stored=none)
    rows = list(iter_pending(src, plan, KEYS))
    assert (plan.rows, plan.requested, len(rows)) == (3007, 3000, 3000)
    assert [r.input_ids for r in rows] == prompts.head(3000)["input_ids"].to_list()


def test_echo_feature_from_the_view_equals_the_full_prompts(prompts, kimi_profile):
    from eagle3_dagster.defs.generate import ECHO_WINDOW
    from eagle3_dagster.quality import generation_features
    from eagle3_dagster.schemas import GENERATIONS

    head = prompts.head(50)
    # half the outputs echo the prompt's tail (the bug the feature catches), half do not
    outs = [
        (ids[-ECHO_WINDOW:] if i % 2 else []) + [163607, 5, 163586] for i, ids in enumerate(head["input_ids"].to_list())
    ]
    gens = pl.from_arrow(
        pl.DataFrame(
            {
                "sample_id": [f"s{i}" for i in range(50)],
                "prompt_id": head["prompt_id"],
                "output_ids": outs,
                "finish_reason": ["stop"] * 50,
                "completion_tokens": [len(o) for o in outs],
            }
        )
        .to_arrow()
        .cast(
            pl.DataFrame(
                schema={
                    c: pl.from_arrow(GENERATIONS.empty_table()).schema[c]
                    for c in ("sample_id", "prompt_id", "output_ids", "finish_reason", "completion_tokens")
                }
            )
            .to_arrow()
            .schema
        )
    )
    full = generation_features(gens, prompts, kimi_profile, echo_window=ECHO_WINDOW)
    light = generation_features(gens, prompt_view(prompts, tail=ECHO_WINDOW), kimi_profile, echo_window=ECHO_WINDOW)
    assert full.equals(light)
    assert full["echoes_prompt_tail"].sum() == 25


def test_sample_preview_from_the_view_equals_the_full_prompts(prompts, kimi_profile, kimi_tokenizer):
    from eagle3_dagster.defs.generate import ECHO_WINDOW
    from eagle3_dagster.report.previews import PREVIEW_PROMPT_TAIL, sample_preview_markdown

    head = prompts.head(3)
    gens = pl.DataFrame(
        {
            "sample_id": ["a", "b", "c"],
            "prompt_id": head["prompt_id"],
            "output_ids": [[5, 163607, 6, 163586]] * 3,
            "source": ["unit"] * 3,
            "finish_reason": ["stop"] * 3,
            "completion_tokens": [4] * 3,
        }
    )
    view = prompt_view(prompts, tail=max(ECHO_WINDOW, PREVIEW_PROMPT_TAIL))
    full = sample_preview_markdown(gens, prompts, kimi_tokenizer, kimi_profile, n=3)
    light = sample_preview_markdown(gens, view, kimi_tokenizer, kimi_profile, n=3)
    assert full == light and "prompt tail (" in full
