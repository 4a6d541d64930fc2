"""Which rows a run sends: first occurrence of each sample_id, minus the stored ones (exact, 128-bit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from gen_helpers import make_prompts

from eagle3_dagster.generate.config import sample_key
from eagle3_dagster.generate.inputs import InputChangedError, SampleKeys, classify, iter_pending, plan_shard
from eagle3_dagster.generate.probes import ProbeKeys

U = np.uint64


def test_classify_first_occurrence_and_stored_exactly():
    # Keys 0..4 as (hi, lo); key 1 and key 3 share hi but differ in lo (a 64-bit collision is not a duplicate).
    hi = np.array([5, 7, 5, 7, 9, 5, 9], dtype=U)
    lo = np.array([1, 2, 1, 3, 4, 1, 4], dtype=U)
    stored_hi, stored_lo = np.array([7, 1], dtype=U), np.array([3, 1], dtype=U)
    first, in_store = classify(hi, lo, stored_hi, stored_lo)
    assert first.tolist() == [True, True, False, True, True, False, False]
    assert in_store.tolist() == [False, False, False, True, False, False, False]
    empty = np.empty(0, U)
    f2, s2 = classify(empty, empty, stored_hi, stored_lo)
    assert f2.tolist() == [] and s2.tolist() == []


def test_sample_keys_carry_the_fitted_hash_of_the_length_and_the_probe_tag_of_the_source():
    keys = SampleKeys(
        "m@1", "full", 7, row_hash=lambda n: "fit" if n > 100 else "full", probes=ProbeKeys(frozenset({"probe"}), "d")
    )
    assert keys.of("p", None, 10, "train") == (sample_key("p", "m@1", "", "full", 7, None), "full")
    assert keys.of("p", "t", 200, "train") == (sample_key("p", "m@1", "t", "fit", 7, None), "fit")
    assert keys.of("p", "t", 10, "probe")[0] == sample_key("p", "m@1", "t", "full", 7, "d")
    assert SampleKeys("m@1", "full", None).of("p", None, 500, "probe")[1] == "full"  # no row_hash: one hash


def test_plan_from_parquet_path_equals_dataframe(tmp_path: Path):
    df = pl.concat([make_prompts(20, seed=3), make_prompts(5, seed=3)])  # 5 duplicates
    src = tmp_path / "part-0.parquet"
    df.write_parquet(src)
    none = (np.empty(0, U), np.empty(0, U))
    keys = SampleKeys("m", "s", None)
    p_df = plan_shard(df, keys, stored=none)
    p_path = plan_shard(tmp_path, keys, stored=none)
    assert (p_df.rows, p_df.requested, p_df.pending) == (p_path.rows, p_path.requested, p_path.pending) == (25, 20, 20)
    rows_df = [r.sample_id for r in iter_pending(df, p_df, keys)]
    rows_path = [(r.sample_id, r.input_ids) for r in iter_pending(tmp_path, p_path, keys)]
    assert rows_df == [s for s, _ in rows_path] and len(set(rows_df)) == 20
    assert [ids for _, ids in rows_path] == df.head(20).get_column("input_ids").to_list()


def test_input_that_changes_between_passes_fails_loudly(tmp_path: Path):
    src = tmp_path / "p.parquet"
    make_prompts(10, seed=4).write_parquet(src)
    keys = SampleKeys("m", "s", None)
    plan = plan_shard(src, keys, stored=(np.empty(0, U), np.empty(0, U)))
    make_prompts(10, seed=5).write_parquet(src)
    with pytest.raises(InputChangedError):
        list(iter_pending(src, plan, keys))
