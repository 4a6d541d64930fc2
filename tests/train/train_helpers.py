"""Small hand-built inputs of the train stage for in-process tests (imported by name: tests/train is on
sys.path): prompts of one user message each, generation rows that answer every tokenized prompt with
`thinking</think>The answer.<end of turn>`, and one shard built from them."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from eagle3_dagster.train.shard import SampleSources, ShardOutput, build_training_shard


def one_message_prompts(rows: Sequence[tuple[str, str, str]]) -> pl.DataFrame:
    """A prompts table from (prompt_id, source, user message) triples, all in shard 0."""
    return pl.DataFrame(
        {
            "prompt_id": [r[0] for r in rows],
            "source": [r[1] for r in rows],
            "shard": [0] * len(rows),
            "messages": [json.dumps([{"role": "user", "content": r[2]}]) for r in rows],
            "tools": [None] * len(rows),
        }
    )


def answered(tokenized: pl.DataFrame, tok: Any, profile: Any, **columns: list[Any]) -> pl.DataFrame:
    """A generations frame answering each tokenized prompt (sample_id `s-<prompt_id>`), plus `columns`."""
    out = tok.encode("thinking", add_special_tokens=False) + [profile.think_end_id]
    out += tok.encode("The answer.", add_special_tokens=False) + [profile.end_of_turn_id]
    ids = tokenized["prompt_id"].to_list()
    n = len(ids)
    return pl.DataFrame(
        {
            "sample_id": [f"s-{p}" for p in ids],
            "prompt_id": ids,
            "source": tokenized["source"].to_list(),
            "output_ids": [out] * n,
            "model_revision": ["m"] * n,
            "template_hash": tokenized["template_hash"].to_list(),
            "sampling_hash": ["h"] * n,
            "endpoint": ["http://sim"] * n,
            "finish_reason": ["stop"] * n,
            "generated_at": [dt.datetime(2026, 12, 1, tzinfo=dt.UTC)] * n,
            **columns,
        },
        schema_overrides={"output_ids": pl.List(pl.Int32)},
    )


def build_shard(gens: pl.DataFrame, sources: SampleSources, shard: Path) -> pa.Table:
    """Shard 0's training table built from `gens` (every sample trained), as read back from its Parquet."""
    built = build_training_shard(
        [gens],
        gens["sample_id"],
        sources,
        ShardOutput(shard / "part-0000.parquet", shard / "quarantine.parquet"),
        max_total_len=4096,
    )
    assert built.counts["samples"] == gens.height, built.counts
    return pq.read_table(shard / "part-0000.parquet")
