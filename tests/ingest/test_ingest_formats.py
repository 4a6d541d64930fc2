"""Containers detected by content, the OpenAI layout in every container, identity across formats,
and the per-source options (field_map, limit, sample_fraction, prompt_rule)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_dagster.ingest import SourceSpec, build_prompt, combine_sources, ingest_source, prompt_id_of

# One tool-using conversation, written the way different datasets write it.
TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOLS_BARE_DICT = [
    {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {"type": "dict", "properties": {"city": {"type": "string"}}},
    }
]
OPENAI = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21 degrees."},
    ],
    "tools": TOOLS_OPENAI,
}
SHAREGPT = {
    "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
        {"from": "observation", "value": '{"temp": 21}'},
        {"from": "gpt", "value": "It is 21 degrees in Paris."},
    ],
    "tools": json.dumps(TOOLS_BARE_DICT),
}
HERMES = {
    "messages": [
        {"role": "user", "content": [{"type": "text", "value": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'}],
        },
        {"role": "tool", "content": [{"type": "text", "value": '{"temp": 21}'}]},
    ],
    "tools": json.dumps(TOOLS_OPENAI),
}


def _ids(out: Path) -> list[str]:
    return [r["prompt_id"] for r in pq.read_table(out / "accepted.parquet").to_pylist()]


def _ingest(path: Path, out: Path, **kw: object):
    counts = ingest_source(SourceSpec(name=kw.pop("name", "s"), path=str(path), **kw), out, n_shards=4)  # type: ignore[arg-type]
    assert counts.reconciles()
    return counts


def test_same_conversation_in_three_layouts_and_three_containers_has_one_id(tmp_path: Path) -> None:
    expected_messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"temp": 21}'},
    ]
    expected_id = prompt_id_of(expected_messages, TOOLS_OPENAI)

    (tmp_path / "openai.jsonl").write_text(json.dumps(OPENAI) + "\n")
    (tmp_path / "sharegpt.json").write_text(json.dumps([SHAREGPT], indent=2))
    (tmp_path / "hermes.jsonl").write_text(json.dumps(HERMES) + "\n")
    # Parquet with the conversation and tools as JSON strings (a common export shape).
    pq.write_table(
        pa.table({"messages": [json.dumps(OPENAI["messages"])], "tools": [json.dumps(TOOLS_OPENAI)]}),
        tmp_path / "openai.parquet",
    )
    sources = ["openai.jsonl", "sharegpt.json", "hermes.jsonl", "openai.parquet"]
    for name in sources:
        _ingest(tmp_path / name, tmp_path / f"out_{name}", name=name.replace(".", "_"))
        assert _ids(tmp_path / f"out_{name}") == [expected_id], name

    combined = combine_sources([tmp_path / f"out_{n}" for n in sources], tmp_path / "all", n_shards=4)
    assert (combined.prompts, combined.cross_source_duplicates) == (1, 3)
    (row,) = pq.read_table(tmp_path / "all" / "prompts.parquet").to_pylist()
    assert row["source"] == "openai_jsonl"
    assert json.loads(row["messages"]) == expected_messages


def test_build_prompt_matches_ingest_for_openai_json_array_with_dict_arguments(tmp_path: Path) -> None:
    record = json.loads(json.dumps(OPENAI))
    record["messages"][1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    (tmp_path / "data.txt").write_text(json.dumps([record, OPENAI], indent=4))  # extension says nothing
    counts = _ingest(tmp_path / "data.txt", tmp_path / "out")
    assert (counts.read, counts.accepted, counts.duplicates) == (2, 1, 1)
    messages, tools = build_prompt(OPENAI)
    assert _ids(tmp_path / "out") == [prompt_id_of(messages, tools)]


def test_parquet_list_of_structs_with_tool_calls_columns(tmp_path: Path) -> None:
    msg_type = pa.list_(
        pa.struct(
            [
                ("role", pa.string()),
                ("content", pa.string()),
                ("tool_call_id", pa.string()),
                (
                    "tool_calls",
                    pa.list_(
                        pa.struct(
                            [
                                ("id", pa.string()),
                                ("type", pa.string()),
                                ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
                            ]
                        )
                    ),
                ),
            ]
        )
    )
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?", "tool_call_id": None, "tool_calls": None},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_call_id": None,
                    "tool_calls": OPENAI["messages"][1]["tool_calls"],
                },
                {
                    "role": "tool",
                    "content": '{"temp": 21}',
                    "tool_call_id": "functions.get_weather:0",
                    "tool_calls": None,
                },
            ],
            "tools": json.dumps(TOOLS_OPENAI),
        }
    ]
    pq.write_table(
        pa.Table.from_pylist(rows, schema=pa.schema([("messages", msg_type), ("tools", pa.string())])),
        tmp_path / "x.parquet",
    )
    _ingest(tmp_path / "x.parquet", tmp_path / "out")
    assert _ids(tmp_path / "out") == [prompt_id_of(*build_prompt(OPENAI))]


@pytest.mark.parametrize(
    "container",
    [
        "jsonl",
        "jsonl_bom_crlf",
        "json_array",
        "json_array_one_line",
        "json_array_trailing_comma",
        "gzip_jsonl",
        "gzip_array",
        "json_document",
    ],
)
def test_containers_are_detected_by_content(tmp_path: Path, container: str) -> None:
    records = [{"question": f"q{i}"} for i in range(3)]
    lines = "\n".join(json.dumps(r) for r in records) + "\n"
    path = tmp_path / "data.json"  # the same misleading name for every container
    if container == "jsonl":
        path.write_text(lines)
    elif container == "jsonl_bom_crlf":
        path.write_bytes(b"\xef\xbb\xbf" + lines.replace("\n", "\r\n").encode())
    elif container == "json_array":
        path.write_text(json.dumps(records, indent=2))
    elif container == "json_array_one_line":
        path.write_text(json.dumps(records))
    elif container == "json_array_trailing_comma":
        path.write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + ",\n]\n")
    elif container == "gzip_jsonl":
        path.write_bytes(gzip.compress(lines.encode()))
    elif container == "gzip_array":
        path.write_bytes(gzip.compress(json.dumps(records, indent=1).encode()))
    else:
        records = records[:1]
        path.write_text(json.dumps(records[0], indent=2))
    counts = _ingest(path, tmp_path / "out")
    assert (counts.read, counts.accepted, counts.rejected) == (len(records), len(records), 0)
    rows = pq.read_table(tmp_path / "out" / "accepted.parquet").to_pylist()
    assert [json.loads(r["messages"])[0]["content"] for r in rows] == [r["question"] for r in records]
    assert [r["source_row"] for r in rows] == list(range(1, len(records) + 1))


def test_json_array_larger_than_the_read_chunk_streams_with_record_indexes(tmp_path: Path) -> None:
    # ~3 MB: several 1 MiB chunks, so records straddle chunk boundaries.
    records = [{"instruction": f"item {i} " + "é" * 300, "input": "", "output": "x"} for i in range(5000)]
    (tmp_path / "big.json").write_text(json.dumps(records, indent=2, ensure_ascii=False))
    counts = _ingest(tmp_path / "big.json", tmp_path / "out")
    assert (counts.read, counts.accepted) == (5000, 5000)
    rows = pq.read_table(tmp_path / "out" / "accepted.parquet", columns=["source_row", "messages"]).to_pylist()
    assert all(json.loads(r["messages"])[0]["content"].startswith(f"item {r['source_row'] - 1} ") for r in rows)


def test_empty_and_blank_files_have_no_records(tmp_path: Path) -> None:
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n"), ("array.json", "[ ]")):
        (tmp_path / name).write_text(text)
        counts = _ingest(tmp_path / name, tmp_path / name.replace(".", "_"))
        assert (counts.read, counts.accepted, counts.rejected) == (0, 0, 0)
        assert pq.read_table(tmp_path / name.replace(".", "_") / "accepted.parquet").num_rows == 0


def test_field_map_renames_source_fields(tmp_path: Path) -> None:
    rows = [{"dialog": [{"speaker": "user", "text": "hello"}, {"speaker": "assistant", "text": "hi"}]}]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _ingest(
        tmp_path / "x.jsonl",
        tmp_path / "out",
        format="openai",
        field_map={"messages": "dialog", "role": "speaker", "content": "text"},
    )
    (row,) = pq.read_table(tmp_path / "out" / "accepted.parquet").to_pylist()
    assert json.loads(row["messages"]) == [{"role": "user", "content": "hello"}]
    (tmp_path / "q.jsonl").write_text(json.dumps({"query_text": "what?"}) + "\n")
    _ingest(tmp_path / "q.jsonl", tmp_path / "q", format="question", field_map={"question": "query_text"})
    (row,) = pq.read_table(tmp_path / "q" / "accepted.parquet").to_pylist()
    assert json.loads(row["messages"]) == [{"role": "user", "content": "what?"}]


def test_limit_stops_after_that_many_accepted_prompts(tmp_path: Path) -> None:
    lines = [
        "{bad",
        json.dumps({"question": "a"}),
        json.dumps({"question": "a"}),
        json.dumps({"question": "b"}),
        json.dumps({"question": "c"}),
        json.dumps({"question": "d"}),
    ]
    (tmp_path / "x.jsonl").write_text("\n".join(lines) + "\n")
    counts = _ingest(tmp_path / "x.jsonl", tmp_path / "out", limit=2)
    assert (counts.read, counts.accepted, counts.rejected, counts.duplicates) == (4, 2, 1, 1)


def test_sample_fraction_is_stable_content_hashed_and_counted(tmp_path: Path) -> None:
    records = [{"question": f"question number {i}"} for i in range(2000)]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "rev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(records)))
    a = _ingest(tmp_path / "x.jsonl", tmp_path / "a", sample_fraction=0.25, seed=7)
    _ingest(tmp_path / "rev.jsonl", tmp_path / "b", sample_fraction=0.25, seed=7)
    _ingest(tmp_path / "x.jsonl", tmp_path / "c", sample_fraction=0.25, seed=8)
    assert a.read == a.accepted + a.sampled_out == 2000
    assert 400 < a.accepted < 600
    assert sorted(_ids(tmp_path / "a")) == sorted(_ids(tmp_path / "b"))  # row order does not matter
    assert set(_ids(tmp_path / "a")) != set(_ids(tmp_path / "c"))  # the seed does


def test_prompt_rules(tmp_path: Path) -> None:
    conv = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "a2"},
            {"role": "assistant", "content": "a3"},
        ]
    }
    last, _ = build_prompt(conv)
    assert [m["content"] for m in last] == ["S", "u1", "a1", "u2"]
    first, _ = build_prompt(conv, prompt_rule="first_user")
    assert [m["content"] for m in first] == ["S", "u1"]


def test_tool_results_without_ids_pair_with_calls_in_order() -> None:
    conv = {
        "conversations": [
            {"from": "human", "value": "two cities"},
            {
                "from": "function_call",
                "value": json.dumps([{"name": "w", "arguments": {"c": "A"}}, {"name": "w", "arguments": {"c": "B"}}]),
            },
            {"from": "observation", "value": "A: 1"},
            {"from": "observation", "value": "B: 2"},
            {"from": "gpt", "value": "done"},
            {"from": "human", "value": "and C?"},
            {"from": "function_call", "value": json.dumps({"name": "w", "arguments": {"c": "C"}})},
            {"from": "observation", "value": "C: 3"},
        ]
    }
    messages, tools = build_prompt(conv)
    assert tools is None
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["functions.w:0", "functions.w:1"]
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == [
        "functions.w:0",
        "functions.w:1",
        "functions.w:2",
    ]


def test_dict_type_becomes_object_at_every_depth_but_not_elsewhere() -> None:
    tools_in = [
        {
            "name": "f",
            "parameters": {
                "type": "dict",
                "properties": {
                    "inner": {"type": "dict", "properties": {"type": {"type": "string", "enum": ["dict"]}}},
                    "items": {"type": "array", "items": {"type": "dict"}},
                },
            },
        }
    ]
    _, tools = build_prompt({"messages": [{"role": "user", "content": "q"}], "tools": tools_in})
    assert tools is not None
    params = tools[0]["function"]["parameters"]
    assert params["type"] == "object"
    assert params["properties"]["inner"]["type"] == "object"
    assert params["properties"]["inner"]["properties"]["type"] == {"type": "string", "enum": ["dict"]}
    assert params["properties"]["items"]["items"]["type"] == "object"


def test_sharegpt_system_turn_and_tools_as_a_list() -> None:
    as_list = {
        "conversations": [{"from": "system", "value": "Be terse."}, *SHAREGPT["conversations"]],
        "tools": TOOLS_BARE_DICT,
    }
    as_string = {**as_list, "tools": json.dumps(TOOLS_BARE_DICT)}
    messages, tools = build_prompt(as_list)
    assert messages[0] == {"role": "system", "content": "Be terse."}
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert tools == TOOLS_OPENAI
    assert build_prompt(as_string) == (messages, tools)
    # a top-level system field (LLaMA-Factory's sharegpt option) means the same thing
    top_level = {"system": "Be terse.", "conversations": SHAREGPT["conversations"], "tools": TOOLS_BARE_DICT}
    assert build_prompt(top_level) == (messages, tools)


def test_single_question_layouts_math_problem_and_alpaca_input() -> None:
    assert build_prompt({"problem": "Find x.", "solution": "x = 2", "level": "Level 1"}) == (
        [{"role": "user", "content": "Find x."}],
        None,
    )
    assert build_prompt({"instruction": "Summarize", "input": "Long text.", "output": "Short."}) == (
        [{"role": "user", "content": "Summarize\nLong text."}],
        None,
    )
    assert build_prompt({"instruction": "Write a poem", "output": "..."}, fmt="magpie") == (
        [{"role": "user", "content": "Write a poem"}],
        None,
    )


def test_field_map_for_sharegpt_turn_fields() -> None:
    record = {"dialogue": [{"speaker": "human", "says": "hello"}, {"speaker": "gpt", "says": "hi"}]}
    messages, _ = build_prompt(
        record, fmt="sharegpt", field_map={"conversations": "dialogue", "from": "speaker", "value": "says"}
    )
    assert messages == [{"role": "user", "content": "hello"}]


def test_json_array_element_far_over_max_bytes_is_skipped_without_parsing(tmp_path: Path) -> None:
    # 1.5 MB element: more than max_bytes plus one read chunk, so it is skipped by bracket scan.
    records = [{"question": "first"}, {"question": "x" * 1_500_000, "nested": [{"a": "]}"}]}, {"question": "third"}]
    (tmp_path / "big.json").write_text(json.dumps(records, indent=1))
    counts = _ingest(tmp_path / "big.json", tmp_path / "out", max_bytes=1000)
    assert (counts.read, counts.accepted, counts.rejects_by_reason) == (3, 2, {"too_large": 1})
    rows = pq.read_table(tmp_path / "out" / "accepted.parquet").to_pylist()
    assert [r["source_row"] for r in rows] == [1, 3]
