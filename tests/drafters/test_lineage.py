"""Which snapshot trained a drafter: `--trained-on`, or the record its training run left beside the checkpoint
(drafters/lineage.py, docs/drafter-compare.md), and the line a team reads."""

from __future__ import annotations

import json

import pytest

from eagle3_dagster.drafters.lineage import (
    LINEAGE_FILE,
    LineageError,
    candidate_lineage,
    headline,
    production_lineage,
    read_record,
)

RECORD = {
    "format": "eagle3-dagster/lineage/1",
    "snapshot": "20260612T020000Z-9f3e",
    "content_identity": "ab" * 32,
    "export": "exports/specforge_prompts.jsonl",
    "trainer": "SpecForge 0.2.0",
}


def test_the_record_beside_the_checkpoint_is_read_and_trained_on_wins(tmp_path) -> None:
    ckpt = tmp_path / "kimi-k2.5-eagle3-v7"
    ckpt.mkdir()
    (ckpt / LINEAGE_FILE).write_text(json.dumps(RECORD))
    found = candidate_lineage(None, str(ckpt))
    assert found is not None and found.snapshot == "20260612T020000Z-9f3e"
    assert found.basis == str(ckpt / LINEAGE_FILE) and found.record is not None
    assert found.record["trainer"] == "SpecForge 0.2.0"
    given = candidate_lineage("20260101T000000Z-x", str(ckpt))
    assert given is not None and (given.snapshot, given.basis) == ("20260101T000000Z-x", "--trained-on")
    # a Hugging Face id or a folder this machine cannot see: no record, no error
    assert candidate_lineage(None, "org/kimi-eagle3") is None and read_record(str(tmp_path / "gone")) is None
    assert candidate_lineage(None, None) is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({**RECORD, "format": "v0"}), "field 'format' must be 'eagle3-dagster/lineage/1'"),
        (json.dumps({**RECORD, "snapshot": " "}), "field 'snapshot' must be the snapshot version"),
        (json.dumps({**RECORD, "trainer": 2}), "field 'trainer' must be a string"),
        (json.dumps([RECORD]), "must be a JSON object"),
    ],
)
def test_a_wrong_record_is_named_never_skipped(tmp_path, text: str, problem: str) -> None:
    (tmp_path / LINEAGE_FILE).write_text(text)
    with pytest.raises(LineageError, match=problem) as e:
        candidate_lineage(None, str(tmp_path))
    assert str(tmp_path / LINEAGE_FILE) in str(e.value)


def test_production_lineage_is_its_record_else_the_comparison_that_promoted_it(tmp_path) -> None:
    history = [
        {"compared_at": "2026-06-13T10:00:00+00:00", "candidate": {"drafter_id": "eagle3-b"}},
        {"compared_at": "2026-06-01T10:00:00+00:00", "candidate": {"drafter_id": "eagle3-a", "trained_on": {"snapshot": "S-5"}}},
    ]  # fmt: skip
    found = production_lineage("eagle3-a", "org/a", history)
    assert found is not None and (found.snapshot, found.basis) == ("S-5", "the comparison of 2026-06-01T10:00:00+00:00")
    assert production_lineage("eagle3-b", "org/b", history) is None
    (tmp_path / LINEAGE_FILE).write_text(json.dumps(RECORD))
    own = production_lineage("eagle3-b", str(tmp_path), history)
    assert own is not None and own.snapshot == RECORD["snapshot"]


def test_the_line_a_team_reads() -> None:
    cand = candidate_lineage("N-12", None)
    assert headline(cand, {"snapshot": "M-11"}, "+0.214 [+0.161, +0.268]") == (
        "drafter trained on snapshot N-12 vs production (trained on snapshot M-11): +0.214 [+0.161, +0.268]"
    )
    assert headline(None, None, "+0.1 [0.0, 0.2]") == (
        "drafter trained on an unknown snapshot vs production (trained on an unknown snapshot): +0.1 [0.0, 0.2]"
    )
