"""Quarantined answers a rerun can fix (empty, server-capped, integrity violations) are taken out of the
shard's store before a run, kept whole in superseded-*.parquet, and then count as not stored; a quarantined
well-formed answer (a content judgment) stays stored and is not sent again."""

from __future__ import annotations

import datetime as dt

import polars as pl

from eagle3_dagster.generate import read_generations
from eagle3_dagster.generate.requeue import (
    CAPPED,
    EMPTY,
    INTEGRITY,
    SAME_ANSWER,
    requeue_quarantined,
    retry_reason,
)
from eagle3_dagster.generate.store import SUPERSEDED_PREFIX, ShardStore, stored_sample_ids
from eagle3_dagster.storage import read_parquet


def _row(sid: str, ids: list[int] | None, viol: list[str]) -> dict:
    return dict(
        sample_id=sid,
        prompt_id=f"p-{sid}",
        source="unit",
        shard=0,
        rid=f"r-{sid}",
        output_ids=ids,
        text="t",
        finish_reason="stop",
        finish_matched=None,
        prompt_tokens=3,
        completion_tokens=len(ids or ()),
        cached_tokens=0,
        e2e_latency=0.01,
        meta_info="{}",
        endpoint="http://e",
        model_revision="m",
        template_hash="h",
        sampling_hash="s",
        integrity_violations=viol,
        generated_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )


def test_retry_reasons():
    assert retry_reason([], []) == EMPTY and retry_reason(None, []) == EMPTY
    assert retry_reason([1, 2], ["length_capped_by_server_2_lt_max_new_tokens_24"]) == CAPPED
    assert retry_reason([1, 2], ["nan_happened"]) == INTEGRITY
    assert retry_reason([1, 2], []) is None  # a well-formed answer the gate judged: the same request, the same kind


def test_retryable_quarantined_rows_leave_the_store_and_are_kept(tmp_path):
    out = tmp_path / "shard=0000"
    st = ShardStore(out)
    st.open()
    try:
        st.write_chunk([_row("a", [1, 2, 3], []), _row("b", [], []), _row("c", [4, 5], ["nan_happened"])])
        st.write_chunk([_row("d", [6], ["length_capped_by_server_1_lt_max_new_tokens_24"]), _row("e", [7, 8], [])])
        quarantine = pl.DataFrame(
            {"row_id": ["b", "c", "d", "e"], "reasons": [["r"], ["no NaN finish"], ["finish reason is stop"], ["x"]]}
        )
        quarantine.write_parquet(out / "quarantine.parquet")
        requeued = requeue_quarantined(st)
    finally:
        st.close()
    assert requeued == {"b": EMPTY, "c": INTEGRITY, "d": CAPPED}  # "e" is a content judgment: not retried
    assert sorted(stored_sample_ids(out).to_list()) == ["a", "e"]
    assert read_generations(out).get_column("output_ids").to_list() == [[1, 2, 3], [7, 8]]
    archive = [p for p in out.iterdir() if p.name.startswith(SUPERSEDED_PREFIX)]
    assert len(archive) == 1
    old = read_parquet(archive[0]).sort("sample_id")
    assert old.get_column("sample_id").to_list() == ["b", "c", "d"]
    assert old.get_column("output_ids").to_list() == [[], [4, 5], [6]]  # kept as received


def test_nothing_quarantined_leaves_the_store_alone(tmp_path):
    out = tmp_path / "shard=0000"
    st = ShardStore(out)
    st.open()
    try:
        st.write_chunk([_row("a", [], ["nan_happened"])])
        assert requeue_quarantined(st) == {}  # not quarantined (no gate has run): never retried
    finally:
        st.close()
    assert stored_sample_ids(out).to_list() == ["a"]


def test_one_answer_stored_for_several_prompts_is_sent_again(tmp_path):
    """The gate quarantined a group of rows whose output ids are one answer for several prompts (a response cache
    keyed on the wrong field): a fixed server answers each prompt its own way, so they are taken out and sent
    again (`quarantined_same_answer`); a quarantined well-formed answer of its own prompt is not."""
    out = tmp_path / "shard=0000"
    st = ShardStore(out)
    st.open()
    try:
        same = [9, 8, 7, 163586]
        st.write_chunk([_row(s, same, []) for s in "abcd"] + [_row("e", [5, 163586], []), _row("f", [6], [])])
        quarantine = pl.DataFrame({"row_id": list("abcde"), "reasons": [["one answer for many prompts"]] * 5})
        quarantine.write_parquet(out / "quarantine.parquet")
        requeued = requeue_quarantined(st)
    finally:
        st.close()
    assert requeued == dict.fromkeys("abcd", SAME_ANSWER)
    assert sorted(stored_sample_ids(out).to_list()) == ["e", "f"]
