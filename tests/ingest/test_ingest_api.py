"""The minimal ingest API the Dagster assets call: specs, one source, combine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3_dagster import schemas
from eagle3_dagster.ingest import (
    IngestFileError,
    SourceSpec,
    SourceSpecError,
    combine_sources,
    ingest_source,
    load_source_specs,
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

TOOL_CONVERSATION = {
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need the tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 degrees."},
    ],
    "tools": [WEATHER_TOOL],
}
PLAIN = {
    "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Tell me a joke"},
        {"role": "assistant", "content": "No."},
    ]
}


def _canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _expected_id(messages: list, tools: list | None) -> str:
    return hashlib.sha256(_canonical({"messages": messages, "tools": tools}).encode()).hexdigest()[:32]


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_openai_jsonl_with_tools_is_canonical_deduped_and_reconciled(tmp_path: Path) -> None:
    data = _write_jsonl(
        tmp_path / "chat.jsonl",
        [
            json.dumps(TOOL_CONVERSATION),
            json.dumps(PLAIN),
            json.dumps(PLAIN),
            "{not json",
        ],
    )
    out = tmp_path / "out"
    counts = ingest_source(SourceSpec(name="demo", path=str(data)), out, n_shards=4)

    assert (counts.read, counts.accepted, counts.rejected, counts.duplicates) == (4, 2, 1, 1)
    assert counts.read == counts.accepted + counts.rejected + counts.duplicates
    assert counts.rejects_by_reason == {"not_json": 1}

    accepted = pq.read_table(out / "accepted.parquet")
    assert accepted.schema.equals(schemas.PROMPTS)
    rows = accepted.to_pylist()
    tool_row = rows[0]
    msgs = json.loads(tool_row["messages"])
    # The final assistant turn is dropped; history up to the tool result is kept.
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    call = msgs[2]["tool_calls"][0]
    assert call == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    assert msgs[2]["reasoning_content"] == "Need the tool."
    assert msgs[3]["tool_call_id"] == "call_1"
    assert json.loads(tool_row["tools"]) == [WEATHER_TOOL]
    assert tool_row["messages"] == _canonical(msgs)
    assert tool_row["prompt_id"] == _expected_id(msgs, [WEATHER_TOOL])
    assert tool_row["shard"] == int(tool_row["prompt_id"][:16], 16) % 4
    assert (tool_row["source"], tool_row["source_file"], tool_row["source_row"]) == ("demo", str(data), 1)
    assert tool_row["n_messages"] == 4

    plain = rows[1]
    assert plain["tools"] is None and plain["source_row"] == 2
    assert [m["content"] for m in json.loads(plain["messages"])] == ["Hi", "Hello", "Tell me a joke"]

    rejects = pq.read_table(out / "rejects.parquet")
    assert rejects.schema.equals(schemas.PROMPT_REJECTS)
    (rej,) = rejects.to_pylist()
    assert (rej["source"], rej["source_file"], rej["source_row"], rej["reason"]) == ("demo", str(data), 4, "not_json")
    assert rej["excerpt"] == "{not json"
    assert json.loads((out / "counts.json").read_text())["accepted"] == 2


def test_prompt_id_and_shard_are_stable_across_runs(tmp_path: Path) -> None:
    data = _write_jsonl(tmp_path / "a.jsonl", [json.dumps(TOOL_CONVERSATION), json.dumps(PLAIN)])
    spec = SourceSpec(name="a", path=str(data))
    ingest_source(spec, tmp_path / "run1", n_shards=8)
    ingest_source(spec, tmp_path / "run2", n_shards=8)
    first = [(r["prompt_id"], r["shard"]) for r in _rows(tmp_path / "run1" / "accepted.parquet")]
    second = [(r["prompt_id"], r["shard"]) for r in _rows(tmp_path / "run2" / "accepted.parquet")]
    assert first == second and len(set(first)) == 2


def test_combine_dedupes_across_sources_first_wins_and_reconciles(tmp_path: Path) -> None:
    other = {"messages": [{"role": "user", "content": "Only in b"}]}
    a = _write_jsonl(tmp_path / "a.jsonl", [json.dumps(PLAIN), json.dumps(TOOL_CONVERSATION), "[1]"])
    b = _write_jsonl(tmp_path / "b.jsonl", [json.dumps(TOOL_CONVERSATION), json.dumps(other), "", "nope"])
    ca = ingest_source(SourceSpec(name="a", path=str(a)), tmp_path / "a", n_shards=4)
    cb = ingest_source(SourceSpec(name="b", path=str(b)), tmp_path / "b", n_shards=4)

    combined = combine_sources([tmp_path / "a", tmp_path / "b"], tmp_path / "prompts", n_shards=2)

    assert combined.input_accepted == ca.accepted + cb.accepted == 4
    assert combined.prompts + combined.cross_source_duplicates == combined.input_accepted
    assert combined.cross_source_duplicates == 1
    assert combined.rejects == ca.rejected + cb.rejected == 2
    assert combined.read == ca.read + cb.read
    assert (
        combined.read
        == combined.prompts + combined.cross_source_duplicates + combined.rejects + combined.source_duplicates
    )
    rows = _rows(tmp_path / "prompts" / "prompts.parquet")
    assert [r["source"] for r in rows] == ["a", "a", "b"]  # the tool chat is kept from a (first wins)
    assert len({r["prompt_id"] for r in rows}) == 3
    assert all(r["shard"] == int(r["prompt_id"][:16], 16) % 2 for r in rows)
    rejects = _rows(tmp_path / "prompts" / "prompt_rejects.parquet")
    assert sorted((r["source"], r["reason"]) for r in rejects) == [("a", "not_an_object"), ("b", "not_json")]
    # The blank line in b is not a record, but it still counts for line numbers.
    assert [r["source_row"] for r in rejects if r["source"] == "b"] == [4]


def test_combine_names_a_source_folder_that_was_never_ingested(tmp_path: Path) -> None:
    with pytest.raises(IngestFileError, match="accepted.parquet"):
        combine_sources([tmp_path / "missing"], tmp_path / "out", n_shards=2)


def test_combine_refuses_outputs_from_mixed_runs(tmp_path: Path) -> None:
    a = _write_jsonl(tmp_path / "a.jsonl", [json.dumps(PLAIN)])
    b = _write_jsonl(tmp_path / "b.jsonl", [json.dumps(PLAIN), json.dumps(TOOL_CONVERSATION)])
    ingest_source(SourceSpec(name="a", path=str(a)), tmp_path / "a", n_shards=2)
    ingest_source(SourceSpec(name="b", path=str(b)), tmp_path / "b", n_shards=2)
    (tmp_path / "a" / "counts.json").replace(tmp_path / "b" / "counts.json")
    with pytest.raises(IngestFileError, match=r"b: counts.json does not match"):
        combine_sources([tmp_path / "b"], tmp_path / "out", n_shards=2)
    assert not (tmp_path / "out" / "prompts.parquet").exists()


def test_missing_file_raises_naming_it_and_keeps_previous_outputs(tmp_path: Path) -> None:
    data = _write_jsonl(tmp_path / "a.jsonl", [json.dumps(PLAIN)])
    out = tmp_path / "out"
    ingest_source(SourceSpec(name="a", path=str(data)), out, n_shards=2)
    before = (out / "accepted.parquet").read_bytes()
    with pytest.raises(IngestFileError, match="nope.jsonl"):
        ingest_source(SourceSpec(name="a", path=str(tmp_path / "nope.jsonl")), out, n_shards=2)
    with pytest.raises(IngestFileError, match=r"no file matches"):
        ingest_source(SourceSpec(name="a", path=str(tmp_path / "*.parquet")), out, n_shards=2)
    assert (out / "accepted.parquet").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["accepted.parquet", "counts.json", "rejects.parquet"]


def test_load_source_specs_resolves_paths_relative_to_the_yaml(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    _write_jsonl(data_dir / "part1.jsonl", [json.dumps(PLAIN)])
    _write_jsonl(data_dir / "part2.jsonl", [json.dumps(TOOL_CONVERSATION)])
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "chats.yaml").write_text(
        "path: ../data/part*.jsonl\nformat: openai\nlicense: CC-BY-4.0\nlimit: 5\nprompt_rule: first_user\n"
    )
    (sources / "second.yml").write_text("name: second\npath: ../data/part1.jsonl\n")

    specs = load_source_specs(sources)

    assert [s.name for s in specs] == ["chats", "second"]
    chats = specs[0]
    assert (chats.format, chats.licence, chats.limit, chats.prompt_rule) == ("openai", "CC-BY-4.0", 5, "first_user")
    assert [p.name for p in chats.files()] == ["part1.jsonl", "part2.jsonl"]
    counts = ingest_source(chats, tmp_path / "out", n_shards=2)
    assert (counts.read, counts.accepted) == (2, 2)
    first_user = [json.loads(r["messages"]) for r in _rows(tmp_path / "out" / "accepted.parquet")]
    assert first_user[1] == [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
    ]


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("format: openai\n", r"missing field 'path'"),
        ("path: x.jsonl\nformat: csv\n", r"format 'csv'"),
        ("path: x.jsonl\nlimit: 0\n", r"limit must be a positive integer"),
        ("path: x.jsonl\nsample_fraction: 1.5\n", r"sample_fraction"),
        ("path: x.jsonl\nprompt_rule: everything\n", r"prompt_rule 'everything'"),
        ("path: x.jsonl\ncolour: red\n", r"unknown field\(s\) colour"),
        ("path: x.jsonl\nname: ../escape\n", r"name must be"),
        ("path: x.jsonl\nfield_map: {speaker: role}\n", r"field_map has unknown canonical field\(s\) speaker"),
        ("- just\n- a list\n", r"must be a mapping"),
        ("path: [unclosed\n", r"not valid YAML"),
    ],
)
def test_bad_source_yaml_names_the_file_and_field(tmp_path: Path, yaml_text: str, message: str) -> None:
    (tmp_path / "broken.yaml").write_text(yaml_text)
    with pytest.raises(SourceSpecError, match=message) as info:
        load_source_specs(tmp_path)
    assert "broken.yaml" in str(info.value)


def test_duplicate_source_names_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: same\npath: x.jsonl\n")
    (tmp_path / "b.yaml").write_text("name: same\npath: y.jsonl\n")
    with pytest.raises(SourceSpecError, match="b.yaml.*already used by.*a.yaml"):
        load_source_specs(tmp_path)


@pytest.mark.integration
def test_ingest_domain_code_does_not_import_dagster() -> None:
    import subprocess
    import sys

    code = "import sys, eagle3_dagster.ingest, eagle3_dagster.ingest.cli; print('dagster' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
