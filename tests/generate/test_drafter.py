"""The drafter identity and the per-row speculative-decoding figures (generate/drafter.py), without a server."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from eagle3_dagster.generate.drafter import (
    EXTRA_KEYS,
    DrafterIdentity,
    SpecNamesWatch,
    drafter_of,
    router_drafter,
    spec_row_fields,
    unread_spec_keys,
    warn_mixed_fleet,
    warn_unattributed,
)

INFO = {
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "lmsys/kimi-eagle3",
    "speculative_draft_model_revision": None,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}
D = drafter_of(INFO)


def good_meta() -> dict[str, Any]:
    # 1 prefill token + 4 verify steps accepting 0, 1, 3, 3 drafts (+1 bonus each): 1 + 1 + 2 + 4 + 4 = 12
    return {
        "completion_tokens": 12,
        "spec_accept_rate": 7 / 12,
        "spec_accept_length": 12 / 4,
        "spec_num_correct_drafts": 7,
        "spec_num_proposed_drafts": 12,
        "spec_verify_ct": 4,
        "spec_correct_drafts_histogram": [1, 1, 0, 2],
    }


def test_identity_from_server_info_and_a_stable_short_id():
    assert DrafterIdentity("EAGLE3", "lmsys/kimi-eagle3", None, 3, 1, 4) == D
    assert D is not None and D.drafter_id == drafter_of(dict(INFO)).drafter_id  # type: ignore[union-attr]
    assert D.drafter_id.startswith("eagle3-") and len(D.drafter_id) == len("eagle3-") + 10
    other = drafter_of({**INFO, "speculative_num_draft_tokens": 8})
    assert other is not None and other.drafter_id != D.drafter_id
    assert drafter_of({"speculative_algorithm": None, "speculative_num_steps": None}) is None
    assert drafter_of({}) is None


def test_consistent_figures_are_stored_exactly_and_not_flagged():
    viol: list[str] = []
    row = spec_row_fields(good_meta(), D, viol)
    assert viol == []
    assert row["spec_accept_rate"] == 7 / 12 and row["spec_accept_length"] == 3.0
    assert (row["spec_verify_ct"], row["spec_num_correct_drafts"], row["spec_num_proposed_drafts"]) == (4, 7, 12)
    assert row["spec_correct_drafts_histogram"] == [1, 1, 0, 2]
    assert row["drafter_id"] == D.drafter_id and row["spec_draft_model_path"] == "lmsys/kimi-eagle3"  # type: ignore[union-attr]
    assert (row["spec_num_steps"], row["spec_eagle_topk"], row["spec_num_draft_tokens"]) == (3, 1, 4)


def test_a_server_that_does_not_speculate_gives_null_columns():
    viol: list[str] = []
    row = spec_row_fields({"completion_tokens": 5}, None, viol)
    assert viol == [] and all(v is None for v in row.values())


@pytest.mark.parametrize(
    ("change", "which"),
    [
        ({"spec_accept_length": 2.5}, "accept_length"),
        ({"spec_accept_rate": 0.9}, "accept_rate"),
        ({"spec_num_proposed_drafts": 16, "spec_accept_rate": 7 / 16}, "proposed"),
        ({"spec_correct_drafts_histogram": [1, 1, 0, 1]}, "histogram_total"),
        ({"spec_correct_drafts_histogram": [0, 3, 0, 1]}, "histogram_weighted"),
        ({"spec_verify_ct": -4}, "negative"),
        ({"spec_correct_drafts_histogram": [1, -1, 0, 2]}, "negative"),
        ({"spec_verify_ct": "4"}, "type_spec_verify_ct"),
        ({"spec_verify_ct": 2**70}, "exceeds_int64_spec_verify_ct"),
        ({"spec_correct_drafts_histogram": [1, 1, 0, 2**64]}, "exceeds_int64_spec_correct_drafts_histogram"),
        ({"spec_accept_length": 10**400}, "type_spec_accept_length"),
    ],
)
def test_inconsistent_figures_are_flagged_and_still_stored(change: dict[str, Any], which: str):
    viol: list[str] = []
    row = spec_row_fields({**good_meta(), **change}, D, viol)
    assert f"spec_metrics_inconsistent:{which}" in viol
    key, value = next(iter(change.items()))
    if not which.startswith(("type_", "exceeds_int64_")):
        assert row[key] == value  # as received, never repaired
    else:
        assert row[key] is None  # a value its column cannot hold without a cast: null, and named


def _consistent(completion: int, hist: list[int], draft_tokens: int = 4) -> dict[str, Any]:
    """Figures that agree with each other (SGLang's relations), from a histogram and the answer's length."""
    vct, correct = sum(hist), sum(k * n for k, n in enumerate(hist))
    proposed = vct * (draft_tokens - 1)
    return {
        "completion_tokens": completion,
        "spec_verify_ct": vct,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_accept_rate": correct / proposed,
        "spec_accept_length": completion / vct,
        "spec_correct_drafts_histogram": hist,
    }


@pytest.mark.parametrize(
    ("meta", "which"),
    [
        (_consistent(3, [4]), "length_below_1"),  # four verify steps, three tokens: accept length 0.75
        (_consistent(12, [0, 1, 0, 2, 1]), "histogram_length"),  # 4 drafts accepted in a step of 3 proposed
        (_consistent(12, [1, 1, 0, 2, 0]), "histogram_length"),  # SGLang's list never ends in 0
    ],
)
def test_figures_that_agree_but_sglang_cannot_produce_are_flagged(meta: dict[str, Any], which: str):
    viol: list[str] = []
    spec_row_fields(meta, D, viol)
    assert viol == [f"spec_metrics_inconsistent:{which}"]
    ok: list[str] = []
    spec_row_fields(_consistent(12, [1, 1, 0, 2]), D, ok)  # as long as the draft tokens: honest
    spec_row_fields(_consistent(40, [3, 1]), D, ok)  # shorter (no step accepted more than one): honest
    assert ok == []


def test_some_fields_without_the_others_is_flagged_partial():
    meta = good_meta()
    del meta["spec_accept_rate"], meta["spec_num_proposed_drafts"]
    viol: list[str] = []
    row = spec_row_fields(meta, D, viol)
    assert "spec_metrics_inconsistent:partial" in viol and row["spec_verify_ct"] == 4
    # one draft token proposes nothing: SGLang then sends the histogram alone, which is not partial
    one = drafter_of({**INFO, "speculative_num_draft_tokens": 1})
    viol = []
    spec_row_fields({"completion_tokens": 3, "spec_correct_drafts_histogram": [2]}, one, viol)
    assert viol == []


def test_figures_from_a_server_that_names_no_drafter_are_flagged():
    viol: list[str] = []
    spec_row_fields(good_meta(), None, viol)
    assert viol == ["spec_metrics_inconsistent:no_drafter"]


def test_mixed_fleet_and_mixed_router_are_named(caplog: pytest.LogCaptureFixture):
    other = drafter_of({**INFO, "speculative_draft_model_path": "me/other-eagle3"})
    with caplog.at_level(logging.WARNING):
        assert not warn_mixed_fleet({"http://a": D, "http://b": D})
        assert warn_mixed_fleet({"http://a": D, "http://b": other, "http://c": None})
    line = caplog.records[-1].getMessage()
    assert "http://a" in line and "http://b" in line and "me/other-eagle3" in line and "no speculative" in line
    assert D is not None and D.drafter_id in line
    assert router_drafter({"w1": D, "w2": D}) == D
    assert router_drafter({"w1": D, "w2": other}) is None
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_unattributed("http://r", {"w1": D, "w2": other})
    assert "w1" in caplog.text and "w2" in caplog.text and "http://r" in caplog.text


def test_a_shard_with_chunks_from_before_the_spec_columns_still_reads_and_compacts(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle3_dagster import schemas
    from eagle3_dagster.generate.store import chunk_files, iter_generations, read_generations, write_compacted
    from eagle3_dagster.storage import as_data_path

    old = pa.schema([f for f in schemas.GENERATIONS if not f.name.startswith(("spec_", "drafter_id"))])
    row = {**{f.name: None for f in schemas.GENERATIONS}, "prompt_id": "p", "output_ids": [1, 2]}
    row["integrity_violations"] = []
    pq.write_table(
        pa.Table.from_pylist([{k: {**row, "sample_id": "a"}[k] for k in old.names}], schema=old),
        tmp_path / "part-0001-a.parquet",
    )
    new = {**row, "sample_id": "b", "spec_accept_rate": 0.5, "drafter_id": "eagle3-x"}
    pq.write_table(pa.Table.from_pylist([new], schema=schemas.GENERATIONS), tmp_path / "part-0002-b.parquet")
    want = [{"sample_id": "a", "spec_accept_rate": None}, {"sample_id": "b", "spec_accept_rate": 0.5}]
    assert read_generations(tmp_path).select("sample_id", "spec_accept_rate").to_dicts() == want
    cols = ["sample_id", "spec_accept_rate"]
    assert [r for b in iter_generations(tmp_path, columns=cols) for r in b.to_dicts()] == want
    assert write_compacted(chunk_files(tmp_path), as_data_path(tmp_path / "compacted.parquet")) == 2
    assert pq.read_table(tmp_path / "compacted.parquet").column("spec_accept_rate").to_pylist() == [None, 0.5]


# good_meta() as each release sends it (their managers/tokenizer_manager.py; the simulator's SPEC_NAMES)
RELEASE_RENAMES = {
    "0.5.10": {
        "spec_num_correct_drafts": ["spec_accept_token_num"],
        "spec_num_proposed_drafts": ["spec_draft_token_num"],
        "spec_correct_drafts_histogram": ["spec_accept_histogram"],
    },
    "0.5.11": {
        "spec_num_correct_drafts": ["spec_accepted_drafts"],
        "spec_num_proposed_drafts": ["spec_proposed_drafts"],
        "spec_correct_drafts_histogram": ["spec_accept_histogram"],
    },
    "0.5.12": {
        "spec_num_correct_drafts": ["spec_num_correct_drafts", "spec_accepted_drafts"],
        "spec_num_proposed_drafts": ["spec_num_proposed_drafts", "spec_proposed_drafts"],
        "spec_correct_drafts_histogram": ["spec_correct_drafts_histogram", "spec_accept_histogram"],
    },
    "0.5.23": {},
}


def _as_release(meta: dict[str, Any], release: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in meta.items():
        out.update(dict.fromkeys(RELEASE_RENAMES[release].get(k, [k]), v))
    return out


@pytest.mark.parametrize("release", list(RELEASE_RENAMES))
def test_every_releases_names_fill_the_same_columns(release: str):
    viol: list[str] = []
    row = spec_row_fields(_as_release(good_meta(), release), D, viol)
    assert viol == []
    assert {k: row[k] for k in good_meta() if k != "completion_tokens"} == {
        k: v for k, v in good_meta().items() if k != "completion_tokens"
    }
    assert all(row[k] is None for k in EXTRA_KEYS)


def test_two_names_of_one_figure_with_two_values_are_flagged():
    meta = _as_release(good_meta(), "0.5.12")
    meta["spec_accepted_drafts"] = 6  # the alias says otherwise
    viol: list[str] = []
    row = spec_row_fields(meta, D, viol)
    assert viol == ["spec_metrics_inconsistent:alias_spec_num_correct_drafts"]
    assert row["spec_num_correct_drafts"] == 7  # the newest name's value, as received


def test_the_cap_figures_are_stored_when_sent_and_typed():
    cap = {"spec_cap_length": 3.25, "spec_block_accept_length": 2.75, "spec_cap_lens_histogram": [0, 0, 1, 1, 2]}
    viol: list[str] = []
    row = spec_row_fields({**good_meta(), **cap}, D, viol)
    assert viol == [] and {k: row[k] for k in cap} == cap
    viol = []
    row = spec_row_fields({**good_meta(), "spec_cap_length": "3.25", "spec_cap_lens_histogram": [1, -1]}, D, viol)
    assert "spec_metrics_inconsistent:type_spec_cap_length" in viol and row["spec_cap_length"] is None
    assert "spec_metrics_inconsistent:negative" in viol


def test_answers_of_a_speculating_server_without_known_names_are_told_apart():
    renamed = {"completion_tokens": 12, "spec_correct_tokens": 7, "spec_verify_steps": 4}
    assert unread_spec_keys(renamed, D) == ["spec_correct_tokens", "spec_verify_steps"]
    assert unread_spec_keys({"completion_tokens": 12}, D) == []  # figures due (12 tokens), none sent
    assert unread_spec_keys({"completion_tokens": 1}, D) is None  # one token: no verify step, none due
    assert unread_spec_keys(_as_release(good_meta(), "0.5.10"), D) is None  # read
    assert unread_spec_keys(renamed, None) is None  # no drafter: nothing was due


def test_one_warning_per_server_with_unread_names(caplog: pytest.LogCaptureFixture):
    watch = SpecNamesWatch()
    assert D is not None
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            watch.note("http://a", "0.6.0", D, ["spec_correct_tokens"])
        watch.note("http://b", None, D, [])
    assert watch.rows == {"http://a": 3, "http://b": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "http://a (SGLang 0.6.0)" in lines[0] and "spec_correct_tokens" in lines[0]
    assert "version not reported" in lines[1] and "no spec_* key at all" in lines[1]
