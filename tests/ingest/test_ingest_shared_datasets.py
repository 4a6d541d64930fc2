"""Every real dataset in ../shared/datasets ingests completely, with the counts its SOURCE.txt states.

"Duplicate" in the ingest counts means the same prompt id: same prompt AFTER the prompt rule, and
same tools. The SOURCE.txt counts are computed on raw conversations, so each test states which of
them carries over and checks the rest against an independent raw-level oracle.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_dagster.ingest import SourceCounts, SourceSpec, ingest_source

DATASET_FILES = {
    "sharegpt_v3_test": "sharegpt_test.json",
    "sharegpt_fastchat_dummy": "dummy_conversation.json",
    "numina_cot_sharegpt": "numina_cot_sharegpt_data_1k.jsonl",
    "glaive_toolcall_sharegpt_en": "glaive_toolcall_en_demo.json",
    "ultrachat_200k_sample": "ultrachat_200k_sample20.json",
    "no_robots_test_parquet": "test_sft-00000-of-00001.parquet",
    "hermes_reasoning_tool_use": "reason_tool_use_demo_50.jsonl",
    "bfcl_live_simple": "BFCL_v4_live_simple.json",
    "alpaca_gpt4_en_demo": "alpaca_en_demo.json",
    "gsm8k_test": "test.jsonl",
    "magpie_example": "example_instructions_5res.json",
}


def source_fact(datasets_dir: Path, folder: str, key: str) -> int:
    """An integer fact from the dataset's SOURCE.txt, e.g. 'records in copy' or 'duplicate_conversations'."""
    text = (datasets_dir / folder / "SOURCE.txt").read_text()
    m = re.search(rf"^\s*{re.escape(key)}:\s*(\d+)\s*$", text, re.M)
    assert m, f"{folder}/SOURCE.txt has no {key!r}"
    return int(m.group(1))


def raw_records(path: Path) -> list[dict[str, Any]]:
    """Independent plain reader for the oracle (small files only)."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _tools(raw: Any) -> Any:
    parsed = json.loads(raw) if isinstance(raw, str) else raw
    return parsed or None


def _upto_last(turns: list[dict], role_field: str, prompt_roles: set[str]) -> list[dict]:
    last = max(i for i, t in enumerate(turns) if t[role_field] in prompt_roles)
    return turns[: last + 1]


# Raw-level prompt keys under the default rule (last user or tool turn), one per layout.
ORACLE_KEYS: dict[str, Callable[[dict], Hashable]] = {
    "sharegpt_v3_test": lambda r: _key(_upto_last(r["conversations"], "from", {"human"})),
    "sharegpt_fastchat_dummy": lambda r: _key(_upto_last(r["conversations"], "from", {"human"})),
    "numina_cot_sharegpt": lambda r: _key(_upto_last(r["conversations"], "from", {"human"})),
    "glaive_toolcall_sharegpt_en": lambda r: _key(
        [_upto_last(r["conversations"], "from", {"human", "observation"}), _tools(r["tools"])]
    ),
    "ultrachat_200k_sample": lambda r: _key(_upto_last(r["messages"], "role", {"user"})),
    "no_robots_test_parquet": lambda r: _key(_upto_last(r["messages"], "role", {"user"})),
    "hermes_reasoning_tool_use": lambda r: _key(
        [_upto_last(r["messages"], "role", {"user", "tool"}), _tools(r["tools"])]
    ),
    "bfcl_live_simple": lambda r: _key([r["question"], r["function"]]),
    "alpaca_gpt4_en_demo": lambda r: _key([r["instruction"], r["input"]]),
    "gsm8k_test": lambda r: r["question"],
    "magpie_example": lambda r: r["instruction"],
}


def _duplicates(records: list[dict], key: Callable[[dict], Hashable]) -> int:
    return sum(n - 1 for n in Counter(key(r) for r in records).values())


def _ingest(datasets_dir: Path, folder: str, out: Path, **kw: Any) -> tuple[SourceCounts, list[dict], Path]:
    path = datasets_dir / folder / DATASET_FILES[folder]
    counts = ingest_source(SourceSpec(name=folder, path=str(path), **kw), out, n_shards=4)
    assert counts.reconciles()
    assert counts.read == counts.accepted + counts.rejected + counts.duplicates
    return counts, pq.read_table(out / "accepted.parquet").to_pylist(), path


def _messages(row: dict) -> list[dict]:
    return json.loads(row["messages"])


@pytest.mark.parametrize("folder", sorted(DATASET_FILES))
def test_every_record_of_every_shared_dataset_ingests(datasets_dir: Path, tmp_path: Path, folder: str) -> None:
    counts, rows, path = _ingest(datasets_dir, folder, tmp_path)
    records_in_file = source_fact(datasets_dir, folder, "records in copy")
    assert counts.read == records_in_file
    assert counts.rejected == 0, counts.rejects_by_reason
    assert counts.duplicates == _duplicates(raw_records(path), ORACLE_KEYS[folder])
    assert len(rows) == counts.accepted == len({r["prompt_id"] for r in rows})
    for r in rows:
        msgs = _messages(r)
        assert r["n_messages"] == len(msgs) >= 1
        assert msgs[-1]["role"] in ("user", "tool")  # the final assistant turns were dropped
        assert all(isinstance(m["content"], str) for m in msgs)
        assert r["shard"] == int(r["prompt_id"][:16], 16) % 4


def test_alpaca_duplicates_match_the_readme(datasets_dir: Path, tmp_path: Path) -> None:
    counts, rows, path = _ingest(datasets_dir, "alpaca_gpt4_en_demo", tmp_path)
    assert counts.duplicates == source_fact(datasets_dir, "alpaca_gpt4_en_demo", "duplicate_conversations") == 14
    records = raw_records(path)
    for r in rows:
        rec = records[r["source_row"] - 1]
        expected = rec["instruction"] + ("\n" + rec["input"] if rec["input"].strip() else "")
        assert _messages(r) == [{"role": "user", "content": expected}]


def test_fastchat_repeated_first_prompts_are_duplicates_under_first_user(datasets_dir: Path, tmp_path: Path) -> None:
    folder = "sharegpt_fastchat_dummy"
    # Under the default rule the prompt keeps the multi-turn history, so fewer rows collide
    # than the 448 repeated first prompts; with first_user, exactly those 448 collide.
    default, _, _ = _ingest(datasets_dir, folder, tmp_path / "default")
    first, rows, _ = _ingest(datasets_dir, folder, tmp_path / "first", prompt_rule="first_user")
    assert first.duplicates == source_fact(datasets_dir, folder, "duplicate_first_user_prompts") == 448
    assert 0 < default.duplicates < first.duplicates
    assert all(len(_messages(r)) == 1 for r in rows)


def test_glaive_tool_calls_get_synthesized_paired_ids(datasets_dir: Path, tmp_path: Path) -> None:
    folder = "glaive_toolcall_sharegpt_en"
    counts, rows, path = _ingest(datasets_dir, folder, tmp_path)
    records = raw_records(path)
    # SOURCE.txt's 38 duplicate conversations ignore tools; 3 of them differ only in the tool list
    # and the prompt id includes tools, so whole-record duplicates (35) is the floor here.
    assert _duplicates(records, lambda r: _key(r["conversations"])) == source_fact(
        datasets_dir, folder, "duplicate_conversations"
    )
    assert counts.duplicates >= _duplicates(records, lambda r: _key(r))
    n_calls = 0
    for r in rows:
        rec = records[r["source_row"] - 1]
        assert (r["tools"] is None) == (rec["tools"] == "[]")
        msgs = _messages(r)
        seen_ids: list[str] = []
        for m in msgs:
            for call in m.get("tool_calls", []):
                name = call["function"]["name"]
                assert re.fullmatch(rf"functions\.{re.escape(name)}:\d+", call["id"])
                assert isinstance(call["function"]["arguments"], dict)
                seen_ids.append(call["id"])
                n_calls += 1
            if m["role"] == "tool":
                assert m["tool_call_id"] in seen_ids
    assert n_calls > 100
    # The first-user rule: glaive's repeated first prompts with the same tools collide.
    first, _, _ = _ingest(datasets_dir, folder, tmp_path / "first", prompt_rule="first_user")
    assert first.duplicates == _duplicates(
        records, lambda r: _key([r["conversations"][0]["value"], _tools(r["tools"])])
    )


def test_hermes_typed_parts_become_text_reasoning_and_tool_calls(datasets_dir: Path, tmp_path: Path) -> None:
    folder = "hermes_reasoning_tool_use"
    _counts, rows, path = _ingest(datasets_dir, folder, tmp_path)
    first, _, _ = _ingest(datasets_dir, folder, tmp_path / "first", prompt_rule="first_user")
    assert first.duplicates == source_fact(datasets_dir, folder, "duplicate_first_user_prompts") == 3
    records = raw_records(path)
    with_tool_results = 0
    for r in rows:
        rec = records[r["source_row"] - 1]
        msgs = _messages(r)
        raw_kept = _upto_last(rec["messages"], "role", {"user", "tool"})
        assert [m["role"] for m in msgs] == [m["role"] for m in raw_kept]
        for m, raw in zip(msgs, raw_kept):
            texts = "".join(p["value"] for p in raw["content"] if p["type"] == "text")
            assert m["content"] == texts
            reasoning = "".join(p["value"] for p in raw["content"] if p["type"] == "reasoning")
            assert m.get("reasoning_content", "") == reasoning
            calls = [json.loads(p["value"]) for p in raw["content"] if p["type"] == "tool_call"]
            assert [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])] == [
                (c["name"], c["arguments"]) for c in calls
            ]
        with_tool_results += any(m["role"] == "tool" for m in msgs)
        assert '"dict"' not in (r["tools"] or "")
        assert (r["tools"] is None) == (json.loads(rec["tools"]) == [])
    assert with_tool_results > 0


def test_bfcl_questions_and_functions(datasets_dir: Path, tmp_path: Path) -> None:
    folder = "bfcl_live_simple"
    counts, rows, path = _ingest(datasets_dir, folder, tmp_path)
    records = raw_records(path)
    # The 4 repeated questions each come with a different function list, so they are distinct prompts.
    assert (
        _duplicates(records, lambda r: _key(r["question"]))
        == source_fact(datasets_dir, folder, "duplicate_conversations")
        == 4
    )
    assert counts.duplicates == 0
    assert sum(_messages(r)[0]["role"] == "system" for r in rows) == 11
    assert sum(any(ord(ch) > 127 for ch in r["messages"]) for r in rows) == 15  # kept as text, not \u escapes
    for r in rows:
        tools = json.loads(r["tools"])
        rec = records[r["source_row"] - 1]
        assert [t["function"]["name"] for t in tools] == [f["name"] for f in rec["function"]]
        assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in tools)
        assert '"dict"' not in r["tools"]


def test_no_robots_parquet_list_of_structs(datasets_dir: Path, tmp_path: Path) -> None:
    folder = "no_robots_test_parquet"
    _counts, rows, path = _ingest(datasets_dir, folder, tmp_path)
    records = raw_records(path)
    assert sum(_messages(r)[0]["role"] == "system" for r in rows) == 54
    for r in rows:
        rec = records[r["source_row"] - 1]
        assert _messages(r) == [{"role": m["role"], "content": m["content"]} for m in rec["messages"][:-1]]


def test_multi_turn_sets_keep_history_and_drop_only_the_last_reply(datasets_dir: Path, tmp_path: Path) -> None:
    for folder, field in (("sharegpt_v3_test", "conversations"), ("ultrachat_200k_sample", "messages")):
        _, rows, path = _ingest(datasets_dir, folder, tmp_path / folder)
        records = raw_records(path)
        for r in rows:
            turns = records[r["source_row"] - 1][field]
            assert r["n_messages"] == len(turns) - 1  # every conversation ends on one assistant turn
            assert [m["content"] for m in _messages(r)] == [t.get("value", t.get("content")) for t in turns[:-1]]


def test_single_question_sets_use_only_the_question(datasets_dir: Path, tmp_path: Path) -> None:
    for folder, field in (("gsm8k_test", "question"), ("magpie_example", "instruction")):
        _, rows, path = _ingest(datasets_dir, folder, tmp_path / folder)
        records = raw_records(path)
        assert len(rows) == len(records)
        for r in rows:
            assert _messages(r) == [{"role": "user", "content": records[r["source_row"] - 1][field]}]
    _, rows, path = _ingest(datasets_dir, "numina_cot_sharegpt", tmp_path / "numina")
    assert all(_messages(r)[0]["content"].endswith("\\boxed{}.") for r in rows)
