"""The source option `regenerate: final_turn | all_turns` (+ max_turns, on_tool_mismatch) at ingest."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3_dagster.ingest.canonical import prompt_id_of
from eagle3_dagster.ingest.errors import SourceSpecError
from eagle3_dagster.ingest.pipeline import ingest_source
from eagle3_dagster.ingest.spec import load_source_spec, load_source_specs
from eagle3_dagster.ingest.turns import turn_positions

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi, what is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And times 3?"},
    {"role": "assistant", "content": "12."},
]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("regenerate: every_turn\n", "field 'regenerate': 'every_turn' is not one of final_turn, all_turns"),
        ("regenerate: all_turns\nmax_turns: 0\n", "field 'max_turns': must be a positive integer, got 0"),
        ("regenerate: all_turns\nmax_turns: two\n", "field 'max_turns': must be a positive integer, got 'two'"),
        (
            "regenerate: all_turns\non_tool_mismatch: skip\n",
            "field 'on_tool_mismatch': 'skip' is not one of end, continue",
        ),
        ("max_turns: 3\n", "fields 'max_turns' and 'on_tool_mismatch' only apply with 'regenerate: all_turns'"),
    ],
)
def test_bad_regenerate_options_name_the_file_and_field(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "chats.yaml"
    f.write_text("path: chats.jsonl\n" + body)
    with pytest.raises(SourceSpecError) as e:
        load_source_spec(f)
    text = str(e.value)
    assert text.startswith(f"{f}: ") and message in text and "\n" not in text


def test_defaults_are_final_turn(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("path: a.jsonl\n")
    (tmp_path / "b.yaml").write_text("path: b.jsonl\nregenerate: all_turns\nmax_turns: 2\non_tool_mismatch: continue\n")
    a, b = load_source_specs(tmp_path)
    assert (a.regenerate, a.max_turns, a.on_tool_mismatch, a.all_turns) == ("final_turn", None, "end", False)
    assert (b.regenerate, b.max_turns, b.on_tool_mismatch, b.all_turns) == ("all_turns", 2, "continue", True)


def test_turn_positions() -> None:
    assert turn_positions(CHAT) == [2, 4]
    assert turn_positions(CHAT[:4]) == [2, 4]  # a trailing question is a turn to answer
    greeting = [{"role": "assistant", "content": "Hello!"}, *CHAT[1:3]]
    assert turn_positions(greeting) == [2]  # an assistant message before any question is history
    tools = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "a"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert turn_positions(tools) == [1, 3]


def _ingest(tmp_path: Path, extra: str) -> list[dict]:
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": CHAT}) + "\n" + json.dumps({"messages": CHAT[:4]}) + "\n")
    y = tmp_path / "chats.yaml"
    y.write_text("path: chats.jsonl\nformat: openai\n" + extra)
    out = tmp_path / ("out" + str(abs(hash(extra))))
    counts = ingest_source(load_source_spec(y), out, n_shards=4)
    assert counts.reconciles()
    return pq.read_table(out / "accepted.parquet").to_pylist()


def test_all_turns_rows_hold_turn_one_prompt_and_the_whole_conversation(tmp_path: Path) -> None:
    final = _ingest(tmp_path, "")
    # final_turn (the default): the prompt id is the canonical prompt's, as before; no conversation
    assert [r["conversation"] for r in final] == [None] and [r["regenerate"] for r in final] == [None]
    assert final[0]["prompt_id"] == prompt_id_of(json.loads(final[0]["messages"]), None)
    assert json.loads(final[0]["messages"]) == CHAT[:4]
    # the two records are duplicates under final_turn (same prompt after dropping the last reply)
    assert len(final) == 1

    rows = _ingest(tmp_path, "regenerate: all_turns\nmax_turns: 5\n")
    assert len(rows) == 2  # not duplicates: their conversations differ
    full, trailing = rows
    assert json.loads(full["messages"]) == CHAT[:2]  # turn 1's prompt
    assert json.loads(full["conversation"]) == CHAT
    opts = json.loads(full["regenerate"])
    assert opts == {"mode": "all_turns", "max_turns": 5, "on_tool_mismatch": "end", "turns": [2, 4]}
    assert json.loads(trailing["regenerate"])["turns"] == [2, 4]
    assert full["prompt_id"] != final[0]["prompt_id"]

    capped = _ingest(tmp_path, "regenerate: all_turns\nmax_turns: 1\n")
    assert json.loads(capped[0]["regenerate"])["turns"] == [2]
