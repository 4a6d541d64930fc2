"""BFCL records as what they are: user questions, each followed by the model's turn, with the
record's function docs as tools (issue 16).

The shared BFCL file (../shared/datasets/bfcl_live_simple) holds one question per record. The
multi-turn records here are built from its real records the way BFCL's multi-turn files are laid
out (`question`: a list of turns, each a list of messages; one `function` list for the record):
consecutive real records become the turns of one record, their function docs its tools.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_dagster.ingest import GENERATE_KEY, SourceSpec, build_conversation, build_prompt, ingest_source
from eagle3_dagster.ingest.normalize import normalize_tools
from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.tokenize import PromptRenderer

BFCL = Path("bfcl_live_simple") / "BFCL_v4_live_simple.json"
SLOT = {"role": "assistant", "content": "", GENERATE_KEY: True}


def _records(datasets_dir: Path) -> list[dict[str, Any]]:
    lines = (datasets_dir / BFCL).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _multi_turn(records: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """Consecutive real records -> multi-turn records of `size` turns (BFCL's multi-turn layout)."""
    out = []
    for start in range(0, len(records) - size + 1, size):
        group = records[start : start + size]
        out.append(
            {
                "id": "multi_" + "+".join(r["id"] for r in group),
                "question": [r["question"][0] for r in group],
                "function": [f for r in group for f in r["function"]],
            }
        )
    return out


def test_single_turn_records_prompt_and_conversation(datasets_dir: Path, tmp_path: Path) -> None:
    """The real file: prompt = the question with the function docs; the conversation = the same
    question followed by one assistant slot; counts reconcile."""
    records = _records(datasets_dir)
    counts = ingest_source(SourceSpec(name="bfcl", path=str(datasets_dir / BFCL), format="bfcl"), tmp_path, n_shards=1)
    assert counts.reconciles() and counts.read == len(records) == 258
    assert counts.read == counts.accepted + counts.rejected + counts.duplicates and counts.rejected == 0
    rows = pq.read_table(tmp_path / "accepted.parquet").to_pylist()
    assert len(rows) == counts.accepted
    for row in rows:
        rec = records[row["source_row"] - 1]
        question = [{"role": m["role"], "content": m["content"]} for m in rec["question"][0]]
        assert json.loads(row["messages"]) == question
        assert json.loads(row["tools"]) == normalize_tools(rec["function"])
        conversation, tools = build_conversation(rec, fmt="bfcl")
        assert conversation == [*question, SLOT]
        assert tools == normalize_tools(rec["function"])


@pytest.mark.parametrize("size", [2, 3, 7])
def test_multi_turn_records_are_user_turns_each_followed_by_a_model_turn(
    datasets_dir: Path, tmp_path: Path, size: int
) -> None:
    records = _records(datasets_dir)
    multi = _multi_turn(records, size)
    # messiness: an exact duplicate, a record whose 2nd turn is empty (BFCL miss_func layout), a bad turn
    holey = {**multi[1], "id": "holey", "question": [multi[1]["question"][0], [], *multi[1]["question"][1:]]}
    bad = {**multi[2], "id": "bad", "question": [[{"role": "user", "content": 7}], *multi[2]["question"][1:]]}
    # BFCL's own multi-turn files name involved_classes and keep the function docs elsewhere
    no_docs = {
        "id": "multi_turn_base_1",
        "question": [[{"role": "user", "content": "List the files here."}], [{"role": "user", "content": "Now cd."}]],
        "initial_config": {"GorillaFileSystem": {}},
        "path": ["GorillaFileSystem.ls", "GorillaFileSystem.cd"],
        "involved_classes": ["GorillaFileSystem"],
    }
    lines = [*multi, multi[0], holey, bad, no_docs]
    path = tmp_path / "bfcl_multi.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")

    counts = ingest_source(SourceSpec(name="bfcl_multi", path=str(path), format="bfcl"), tmp_path / "out", n_shards=1)
    assert counts.reconciles()
    assert (counts.read, counts.accepted, counts.rejected, counts.duplicates) == (
        len(lines),
        len(multi),  # `holey` has the same first question and tools as multi[1]: a duplicate prompt
        2,
        2,
    )
    assert counts.rejects_by_reason == {"bad_content": 1, "missing_field": 1}
    rejects = pq.read_table(tmp_path / "out" / "rejects.parquet").to_pylist()
    assert any("involved_classes (GorillaFileSystem)" in str(r.get("detail")) for r in rejects), rejects
    rows = pq.read_table(tmp_path / "out" / "accepted.parquet").to_pylist()
    by_line = {r["source_row"]: r for r in rows}
    for line, rec in enumerate(multi, start=1):
        turns = [[{"role": m["role"], "content": m["content"]} for m in turn] for turn in rec["question"]]
        # final_turn prompt: the FIRST question with all of the record's function docs
        row = by_line[line]
        assert json.loads(row["messages"]) == turns[0]
        assert json.loads(row["tools"]) == normalize_tools(rec["function"])
        # all_turns conversation: each question followed by an assistant slot, never consecutive users
        conversation, tools = build_conversation(rec, fmt="bfcl")
        assert conversation == [m for turn in turns for m in (*turn, SLOT)]
        assert [m["role"] for m in conversation if m["role"] != "system"] == ["user", "assistant"] * size
        assert tools == json.loads(row["tools"])
    holey_conversation, _ = build_conversation(holey, fmt="bfcl")
    assert sum(m == SLOT for m in holey_conversation) == size  # the empty turn asks nothing: no slot
    assert build_prompt(holey, fmt="bfcl") == build_prompt(multi[1], fmt="bfcl")


def test_a_slot_cannot_be_rendered_but_the_regenerated_conversation_can(
    datasets_dir: Path, kimi_profile: ModelProfile, kimi_tokenizer: Any
) -> None:
    """A prompt that still holds a slot is a loud render_error (never an empty assistant turn);
    with the model's turns in place of the slots the conversation renders natively."""
    renderer = PromptRenderer(kimi_profile, kimi_tokenizer)
    rec = _multi_turn(_records(datasets_dir), 3)[0]
    conversation, tools = build_conversation(rec, fmt="bfcl")
    second_prompt = conversation[: [i for i, m in enumerate(conversation) if m == SLOT][1]]
    failed = renderer.render(second_prompt, tools)
    assert failed.reason == "render_error" and "generate: true" in (failed.detail or "")
    name = tools[0]["function"]["name"]
    own_turn = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "call it",
        "tool_calls": [
            {"id": f"functions.{name}:0", "type": "function", "function": {"name": name, "arguments": "{}"}}
        ],
    }
    filled = [own_turn if m == SLOT else m for m in second_prompt]
    before = renderer.native_rows
    ok = renderer.render(filled, tools)
    assert ok.ok and renderer.native_rows == before + 1
    assert ok.text is not None and ok.text.count("<|im_user|>") == 2 and f"functions.{name}:0" in ok.text
