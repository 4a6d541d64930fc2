"""KeyedRows (storage/spill.py): training_samples looks up each batch's prompt rows from it instead of
holding the shard's tokenized prompts and messages; it must return exactly what filtering the whole table gives."""

from __future__ import annotations

import random

import polars as pl

from eagle3_dagster.storage import KeyedRows

SCHEMA = {"prompt_id": pl.String, "input_ids": pl.List(pl.Int32), "note": pl.String}


def _table(n: int) -> pl.DataFrame:
    rows = [{"prompt_id": f"p{i % (n - 3)}", "input_ids": list(range(i % 7 + 1)), "note": f"row {i}"} for i in range(n)]
    return pl.DataFrame(rows, schema=SCHEMA)  # the last 3 rows repeat the first 3 keys: duplicates kept, in order


def test_rows_equal_filtering_the_whole_table_in_any_lookup_order(tmp_path) -> None:
    table = _table(103)
    batches = [table.slice(i, 10) for i in range(0, table.height, 10)]  # batches that straddle the blocks
    rng = random.Random(7)
    keys = [f"p{i}" for i in range(100)] + ["missing"]
    with KeyedRows(iter(batches), "prompt_id", SCHEMA, spill_dir=tmp_path, block_rows=8, cache_blocks=1) as kr:
        assert kr.blocks == 13 and kr.rows_total == 103
        for _ in range(20):
            want = pl.Series(rng.sample(keys, 9) + [None], dtype=pl.String)
            got = kr.rows(want)
            assert got.equals(table.filter(pl.col("prompt_id").is_in(want.drop_nulls().implode())))
        dup = kr.rows(pl.Series(["p1", "p1"]))
        assert dup["note"].to_list() == ["row 1", "row 101"]  # both rows, in table order
        none = kr.rows(pl.Series(["missing"]))
        assert none.height == 0 and none.schema == pl.Schema(SCHEMA)
        spill = kr.dir
        assert any(spill.iterdir())
    assert not spill.exists()  # the spill files are removed on close


def test_an_empty_table_gives_empty_rows(tmp_path) -> None:
    with KeyedRows(iter([]), "prompt_id", SCHEMA, spill_dir=tmp_path) as kr:
        assert kr.blocks == 0 and kr.rows(pl.Series(["p0"])).schema == pl.Schema(SCHEMA)
