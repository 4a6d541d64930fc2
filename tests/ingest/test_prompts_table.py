"""The prompts table is written sorted by shard in row groups a shard reader can pick, and `shard_prompts`
reads a shard's rows (all of them, in acceptance order) from those row groups only."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from eagle3_dagster import schemas
from eagle3_dagster.ingest import SourceSpec, combine_sources, ingest_source, prompts_table
from eagle3_dagster.ingest.prompts_table import (
    GROUP_ROWS,
    MIN_GROUP_ROWS,
    ShardSortedWriter,
    row_group_bounds,
    shard_prompts,
    shard_row_groups,
)
from eagle3_dagster.storage import as_data_path

N_SHARDS = 4


def _source(tmp_path: Path, name: str, n: int) -> Path:
    path = tmp_path / f"{name}.jsonl"
    lines = (json.dumps({"messages": [{"role": "user", "content": f"{name} question {i}?"}]}) for i in range(n))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ingest_source(SourceSpec(name=name, path=str(path)), tmp_path / name, n_shards=N_SHARDS)
    return tmp_path / name


@pytest.fixture(scope="module")
def combined(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("prompts")
    counts = combine_sources([_source(tmp, "a", 1500), _source(tmp, "b", 1500)], tmp / "prompts", n_shards=N_SHARDS)
    assert counts.prompts == 3000
    return tmp / "prompts" / "prompts.parquet"


def test_each_row_group_holds_one_shard_and_a_shard_reads_only_its_own(combined: Path):
    pf = pq.ParquetFile(combined)
    whole = pl.read_parquet(combined)
    group_shards = [
        set(pf.read_row_group(i, columns=["shard"]).column("shard").to_pylist()) for i in range(pf.num_row_groups)
    ]
    assert all(len(s) == 1 for s in group_shards), group_shards  # ~750 rows a shard: one shard a row group
    read_bytes = 0
    for k in range(N_SHARDS):
        groups = shard_row_groups(pf, k)
        assert groups == [i for i, s in enumerate(group_shards) if s == {k}]
        read_bytes += sum(pf.metadata.row_group(i).total_byte_size for i in groups)
        rows = pl.concat(list(shard_prompts(combined, k)))
        mine = whole.filter(pl.col("shard") == k)
        assert rows.equals(mine)  # every row of the shard, every column, in the table's order
        # in the order they were accepted: source a before b, and by row within a source
        assert rows.select("source", "source_row").rows() == sorted(rows.select("source", "source_row").rows())
    # every shard read once: the table read once, not once a shard
    assert read_bytes == sum(pf.metadata.row_group(i).total_byte_size for i in range(pf.num_row_groups))


def test_a_shard_reads_the_columns_asked_for_in_slices(combined: Path):
    slices = list(shard_prompts(combined, 1, columns=["prompt_id", "messages"], batch_rows=100))
    assert all(s.columns == ["prompt_id", "messages"] for s in slices)
    assert all(s.height >= 100 for s in slices[:-1]) and slices[-1].height > 0
    shard1 = pl.read_parquet(combined).filter(pl.col("shard") == 1)
    assert pl.concat(slices)["prompt_id"].to_list() == shard1["prompt_id"].to_list()


def test_a_table_written_in_acceptance_order_is_read_the_same(tmp_path: Path, combined: Path):
    """A prompts table written before this layout (every shard in every row group) reads the same rows."""
    rows = pl.read_parquet(combined).sample(fraction=1.0, shuffle=True, seed=7)
    old = tmp_path / "prompts.parquet"
    pq.write_table(rows.to_arrow(), old, row_group_size=500)
    pf = pq.ParquetFile(old)
    assert shard_row_groups(pf, 2) == list(range(pf.num_row_groups))  # nothing to skip, nothing lost
    assert pl.concat(list(shard_prompts(old, 2))).equals(rows.filter(pl.col("shard") == 2))
    assert list(shard_prompts(old, N_SHARDS)) == []  # no such shard: no rows


def test_small_shards_share_a_row_group_and_a_big_one_is_cut():
    bounds = list(row_group_bounds([10, 20, MIN_GROUP_ROWS, 5, 2 * GROUP_ROWS + 3]))
    assert bounds[0] == (0, 30 + MIN_GROUP_ROWS)  # two small shards and the third, which fills the group
    assert bounds[1] == (30 + MIN_GROUP_ROWS, GROUP_ROWS)  # a small one, then the big one up to the cap
    assert bounds[-1][0] + bounds[-1][1] == 35 + MIN_GROUP_ROWS + 2 * GROUP_ROWS + 3
    assert all(rows <= GROUP_ROWS for _, rows in bounds)
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(bounds))  # contiguous, nothing skipped


def test_many_flushes_keep_each_shard_in_acceptance_order(tmp_path: Path, monkeypatch):
    """Rows held past the byte budget are written in several sorted runs; a shard still reads its rows in the
    order they were added."""
    monkeypatch.setattr(prompts_table, "GROUP_ROWS", 64)
    rng = random.Random(3)
    shards = [rng.randrange(7) for _ in range(1000)]
    writer = ShardSortedWriter(as_data_path(tmp_path / "p.parquet"), schemas.PROMPTS, held_bytes=1)
    for i, shard in enumerate(shards):
        writer.add(
            dict.fromkeys(schemas.PROMPTS.names)
            | {"prompt_id": f"p{i:04d}", "shard": shard, "source_row": i, "messages": "[]"}
        )
    writer.close()
    writer.commit()
    assert writer.rows == 1000 and writer.row_groups > 7
    for k in range(7):
        got = pl.concat(list(shard_prompts(tmp_path / "p.parquet", k)))["source_row"].to_list()
        assert got == [i for i, s in enumerate(shards) if s == k]
