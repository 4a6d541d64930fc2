"""The demo summary's `generated` column: stored samples of the shard's current cache keys, counted a batch
at a time (the whole table, output ids included, does not fit in memory at 100,000 samples of 1,500
tokens). It must give the same figure as the full read."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from eagle3_dagster.app.demo import current_generations
from eagle3_dagster.generate import read_generations
from eagle3_dagster.generate import store as store_mod
from eagle3_dagster.generate.store import ShardStore, count_current_samples
from eagle3_dagster.storage import as_data_path


def _row(sid: str, ids: list[int] | None) -> dict:
    return dict(
        sample_id=sid,
        prompt_id=sid,
        source="unit",
        shard=0,
        rid=f"r-{sid}",
        output_ids=ids,
        text="t",
        finish_reason="stop",
        finish_matched=None,
        prompt_tokens=3,
        completion_tokens=0 if ids is None else len(ids),
        cached_tokens=0,
        e2e_latency=0.01,
        meta_info="{}",
        endpoint="http://e",
        model_revision="m",
        template_hash="h",
        sampling_hash="s",
        integrity_violations=[],
        generated_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )


def _reference(out, current: list[str]) -> int:
    gens = read_generations(out)
    return gens.filter(gens["sample_id"].is_in(current) & gens["output_ids"].is_not_null()).height


@pytest.mark.parametrize("batch_rows", [1, 3, 2048])
def test_count_matches_the_full_read(tmp_path, monkeypatch, batch_rows):
    monkeypatch.setattr(store_mod, "COUNT_BATCH_ROWS", batch_rows)
    out = tmp_path / "shard=0000"
    st = ShardStore(out)
    st.open()
    try:
        # s00..s09 with ids; s10, s11 stored without ids; an older revision's samples o0..o4
        st.write_chunk([_row(f"s{i:02d}", [i, 1, 2]) for i in range(10)] + [_row("s10", None), _row("s11", None)])
        st.write_chunk([_row(f"o{i}", [9] * 50) for i in range(5)])
        # a later duplicate of s10 (two racing writers): the first row wins in every reader, so s10 has none
        st.write_chunk([_row("s10", [5, 5]), _row("s03", None)])
    finally:
        st.close()
    current = [f"s{i:02d}" for i in range(12)] + ["missing"]
    got = count_current_samples(out, current)
    assert got == _reference(out, current) == 10  # s00..s09; s10/s11 have no ids, o* are not current
    assert count_current_samples(out, ["o1", "o4", "s10"]) == _reference(out, ["o1", "o4", "s10"]) == 2
    assert count_current_samples(out, []) == 0
    assert count_current_samples(tmp_path / "empty", current) == 0


def test_summary_counts_only_active_samples(tmp_path):
    """current_generations: 0 without active.parquet (the step did not complete), else the active ids stored."""
    out = tmp_path / "shard=0000"
    st = ShardStore(out)
    st.open()
    try:
        st.write_chunk([_row(f"s{i}", [1, 2, 3]) for i in range(6)])
    finally:
        st.close()
    folder = as_data_path(out)
    assert current_generations(folder) == 0
    pl.DataFrame({"sample_id": ["s0", "s2", "s5", "gone"]}).write_parquet(out / "active.parquet")
    assert current_generations(folder) == 3
