"""The bad-input corpus (tests/data/bad/): every bad row is quarantined with its reason code,
with file and row, and the good rows around it are still ingested. Regenerate the corpus with
tests/data/bad/make_corpus.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_dagster import schemas
from eagle3_dagster.ingest import REJECT_REASONS, IngestFileError, SourceSpec, ingest_source
from eagle3_dagster.ingest.readers import EXCERPT_CUT_MARK

BAD_DIR = Path(__file__).resolve().parent.parent / "data" / "bad"

# file -> expected reason of its one bad row (row 2 of 3, with the 2 good rows accepted)
ONE_BAD_ROW: dict[str, str] = {
    "not_json_truncated.jsonl": "not_json",
    "not_json_trailing_garbage.jsonl": "not_json",
    "not_json_python_dict.jsonl": "not_json",
    "not_json_deep_nesting.jsonl": "not_json",
    "not_json_huge_integer.jsonl": "not_json",
    "not_an_object_array.jsonl": "not_an_object",
    "not_an_object_string.jsonl": "not_an_object",
    "not_an_object_null.jsonl": "not_an_object",
    "invalid_utf8_latin1.jsonl": "invalid_utf8",
    "invalid_unicode_lone_surrogate.jsonl": "invalid_unicode",
    "too_large_line.jsonl": "too_large",
    "unknown_format_no_known_field.jsonl": "unknown_format",
    "missing_field_messages.jsonl": "missing_field",
    "missing_field_role.jsonl": "missing_field",
    "missing_field_user_content.jsonl": "missing_field",
    "missing_field_assistant_content.jsonl": "missing_field",
    "unknown_role_narrator.jsonl": "unknown_role",
    "unknown_role_number.jsonl": "unknown_role",
    "empty_conversation.jsonl": "empty_conversation",
    "nothing_to_regenerate_assistant_only.jsonl": "nothing_to_regenerate",
    "empty_turn_user_whitespace.jsonl": "empty_turn",
    "empty_turn_assistant_in_history.jsonl": "empty_turn",
    "bad_content_object.jsonl": "bad_content",
    "bad_content_number.jsonl": "bad_content",
    "bad_content_image_part.jsonl": "bad_content",
    "bad_content_null_user.jsonl": "bad_content",
    "bad_content_reasoning_not_string.jsonl": "bad_content",
    "bad_field_messages_string.jsonl": "bad_field",
    "bad_field_message_not_object.jsonl": "bad_field",
    "bad_field_name_not_string.jsonl": "bad_field",
    "bad_tools_not_json.jsonl": "bad_tools",
    "bad_tools_object.jsonl": "bad_tools",
    "bad_tools_missing_name.jsonl": "bad_tools",
    "bad_tools_parameters_string.jsonl": "bad_tools",
    "bad_tools_item_not_object.jsonl": "bad_tools",
    "bad_tool_arguments_not_json.jsonl": "bad_tool_arguments",
    "bad_tool_arguments_list.jsonl": "bad_tool_arguments",
    "bad_tool_call_no_name.jsonl": "bad_tool_call",
    "bad_tool_call_not_list.jsonl": "bad_tool_call",
    "orphan_tool_result.jsonl": "orphan_tool_result",
    "bad_number_nan.jsonl": "bad_number",
    "hermes_unknown_part_type.jsonl": "bad_content",
    "hermes_tool_call_part_not_json.jsonl": "bad_tool_call",
    "bfcl_question_not_turns.jsonl": "bad_field",
    "question_null.jsonl": "missing_field",
    "jsonl_named_json_with_bad_line.json": "not_json",
    "array_not_an_object_element.json": "not_an_object",
    "array_invalid_utf8.json": "invalid_utf8",
    "array_too_large_element.json": "too_large",
    "array_malformed_element.json": "not_json",  # reading resumes after the bad element
    "array_deep_nesting_element.json": "not_json",
    "array_bare_word_element.json": "not_json",
    "sharegpt_unknown_from.json": "unknown_role",
    "sharegpt_function_call_not_json.json": "bad_tool_call",
    "sharegpt_tools_not_json.json": "bad_tools",
    "sharegpt_observation_first.json": "orphan_tool_result",
    "sharegpt_value_list.json": "bad_content",
    "alpaca_instruction_not_string.json": "bad_content",
    "alpaca_missing_instruction.json": "missing_field",
    "parquet_messages_null.parquet": "missing_field",
    "parquet_unknown_role.parquet": "unknown_role",
    "parquet_empty_messages.parquet": "empty_conversation",
    "parquet_nothing_to_regenerate.parquet": "nothing_to_regenerate",
    "parquet_bad_tools.parquet": "bad_tools",
    "parquet_messages_json_string_invalid.parquet": "bad_field",
    "parquet_content_null.parquet": "bad_content",
    "parquet_too_large.parquet": "too_large",
}

# Broken JSON containers: (expected rejects [(row, reason)], accepted). When the array cannot be
# followed (missing comma, file ends inside a record), reading stops at the break (readers.py).
BROKEN_CONTAINER: dict[str, tuple[list[tuple[int, str]], int]] = {
    "array_truncated.json": ([(3, "not_json")], 2),
    "array_missing_comma.json": ([(2, "not_json")], 1),
    "array_trailing_garbage.json": ([(3, "not_json")], 2),
    "json_document_scalar.json": ([(1, "not_an_object")], 0),
}

SPEC_OPTIONS: dict[str, dict[str, Any]] = {
    "too_large_line.jsonl": {"max_bytes": 1000},
    "parquet_too_large.parquet": {"max_bytes": 1000},
    "array_too_large_element.json": {"max_bytes": 1000},
    "missing_field_messages.jsonl": {"format": "openai"},  # under auto it is unknown_format
    "alpaca_missing_instruction.json": {"format": "alpaca"},
}


def _ingest(name: str, out: Path) -> tuple[Any, list[dict], list[dict]]:
    spec = SourceSpec(name="bad", path=str(BAD_DIR / name), **SPEC_OPTIONS.get(name, {}))
    counts = ingest_source(spec, out, n_shards=2)
    assert counts.read == counts.accepted + counts.rejected + counts.duplicates
    assert counts.rejected == sum(counts.rejects_by_reason.values())
    rejects = pq.read_table(out / "rejects.parquet")
    assert rejects.schema.equals(schemas.PROMPT_REJECTS)
    return counts, pq.read_table(out / "accepted.parquet").to_pylist(), rejects.to_pylist()


def test_corpus_is_complete_and_covers_forty_kinds() -> None:
    on_disk = {p.name for p in BAD_DIR.iterdir() if p.suffix in (".json", ".jsonl", ".parquet")}
    expected = set(ONE_BAD_ROW) | set(BROKEN_CONTAINER) | {"parquet_corrupt.parquet"}
    assert on_disk == expected
    assert len(expected) >= 40
    assert {p.suffix for p in map(Path, expected)} == {".json", ".jsonl", ".parquet"}
    assert set(ONE_BAD_ROW.values()) | {r for rows, _ in BROKEN_CONTAINER.values() for _, r in rows} <= set(
        REJECT_REASONS
    )


@pytest.mark.parametrize("name", sorted(ONE_BAD_ROW))
def test_bad_row_is_quarantined_and_the_rest_ingests(name: str, tmp_path: Path) -> None:
    counts, accepted, rejects = _ingest(name, tmp_path)
    assert (counts.read, counts.accepted, counts.rejected) == (3, 2, 1)
    (rej,) = rejects
    assert (rej["reason"], rej["source_row"], rej["source"]) == (ONE_BAD_ROW[name], 2, "bad")
    assert rej["source_file"] == str(BAD_DIR / name)
    assert rej["detail"] and len(rej["excerpt"].encode("utf-8")) <= 200
    assert [r["source_row"] for r in accepted] == [1, 3]
    # the excerpt shows the raw row (for Parquet, the row as JSON), so a human can find it
    if not name.endswith(".parquet") and ONE_BAD_ROW[name] != "too_large":
        assert rej["excerpt"].strip()


@pytest.mark.parametrize("name", sorted(BROKEN_CONTAINER))
def test_broken_json_container_keeps_rows_before_the_break(name: str, tmp_path: Path) -> None:
    expected_rejects, expected_accepted = BROKEN_CONTAINER[name]
    counts, accepted, rejects = _ingest(name, tmp_path)
    assert [(r["source_row"], r["reason"]) for r in rejects] == expected_rejects
    assert counts.accepted == len(accepted) == expected_accepted
    assert [json.loads(r["messages"])[0]["content"] for r in accepted] == ["good one", "good two"][:expected_accepted]


def test_reject_details_name_the_field(tmp_path: Path) -> None:
    _, _, rejects = _ingest("bad_tool_arguments_not_json.jsonl", tmp_path / "a")
    assert "messages[1].tool_calls[0]" in rejects[0]["detail"] and "(f)" in rejects[0]["detail"]
    _, _, rejects = _ingest("sharegpt_unknown_from.json", tmp_path / "b")
    assert "conversations[0]" in rejects[0]["detail"] and "robot" in rejects[0]["detail"]


@pytest.mark.parametrize(("max_bytes", "reason"), [(200_000, "too_large"), (2_000_000, "not_json")])
def test_a_one_megabyte_line_is_rejected_with_a_cut_excerpt_of_at_most_200_bytes(
    max_bytes: int, reason: str, tmp_path: Path
) -> None:
    """Whether the line is over max_bytes or read whole and not JSON, rejects.parquet keeps a short
    excerpt, cut on a character boundary (2-byte "é" after a 1-byte "x") and marked as cut."""
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    huge = "x" + "é" * 500_000  # 1,000,001 bytes, not JSON
    data = tmp_path / "huge.jsonl"
    data.write_text(f"{good}\n{huge}\n", encoding="utf-8")
    counts = ingest_source(SourceSpec(name="huge", path=str(data), max_bytes=max_bytes), tmp_path / "o", n_shards=1)
    assert (counts.read, counts.accepted, counts.rejected, counts.rejects_by_reason) == (2, 1, 1, {reason: 1})
    (rej,) = pq.read_table(tmp_path / "o" / "rejects.parquet").to_pylist()
    excerpt = rej["excerpt"]
    assert 190 <= len(excerpt.encode("utf-8")) <= 200
    assert excerpt.endswith(EXCERPT_CUT_MARK)
    assert huge.startswith(excerpt.removesuffix(EXCERPT_CUT_MARK))  # a head of the line, no broken character


def test_a_short_reject_keeps_its_whole_line_unmarked(tmp_path: Path) -> None:
    data = tmp_path / "short.jsonl"
    data.write_text("{not json, café\n", encoding="utf-8")
    ingest_source(SourceSpec(name="short", path=str(data)), tmp_path / "o", n_shards=1)
    (rej,) = pq.read_table(tmp_path / "o" / "rejects.parquet").to_pylist()
    assert rej["excerpt"] == "{not json, café"


def test_invalid_bytes_survive_into_the_excerpt_as_escapes(tmp_path: Path) -> None:
    _, _, rejects = _ingest("invalid_utf8_latin1.jsonl", tmp_path)
    assert "caf\\xe9" in rejects[0]["excerpt"]


def test_corrupt_parquet_is_a_file_level_error_naming_the_file(tmp_path: Path) -> None:
    spec = SourceSpec(name="bad", path=str(BAD_DIR / "parquet_corrupt.parquet"))
    with pytest.raises(IngestFileError, match=r"parquet_corrupt\.parquet: not a readable Parquet file"):
        ingest_source(spec, tmp_path / "out", n_shards=2)
    assert not (tmp_path / "out" / "accepted.parquet").exists()


def test_a_directory_or_unreadable_file_is_a_file_level_error(tmp_path: Path) -> None:
    folder = tmp_path / "looks_like.jsonl"
    folder.mkdir()
    with pytest.raises(IngestFileError, match="is a directory"):
        ingest_source(SourceSpec(name="d", path=str(folder)), tmp_path / "out", n_shards=2)
    locked = tmp_path / "locked.jsonl"
    locked.write_text('{"question": "q"}\n')
    locked.chmod(0)
    try:
        try:
            with locked.open("rb"):
                pytest.skip("running as root: file permissions are not enforced")
        except PermissionError:
            pass
        with pytest.raises(IngestFileError, match="locked.jsonl: cannot"):
            ingest_source(SourceSpec(name="d", path=str(locked)), tmp_path / "out", n_shards=2)
    finally:
        locked.chmod(0o644)
