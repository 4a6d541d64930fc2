"""Regenerate the bad-input corpus in this folder: `python tests/data/bad/make_corpus.py`.

Each file holds good rows around one bad row (or a broken container), so the tests can check that
the bad row is quarantined with its reason code AND that ingestion carried on. The expected reason
for every file lives in tests/ingest/test_ingest_bad_inputs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent

G1 = {"messages": [{"role": "user", "content": "good one"}]}
G2 = {"messages": [{"role": "user", "content": "good two"}]}
S1 = {"conversations": [{"from": "human", "value": "good one"}, {"from": "gpt", "value": "ok"}]}
S2 = {"conversations": [{"from": "human", "value": "good two"}, {"from": "gpt", "value": "ok"}]}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def with_call(call: object, extra: dict | None = None) -> dict:
    """user -> assistant(tool_calls) -> tool -> (kept) : the call is inside the prompt."""
    row = {"messages": [user("q"), {"role": "assistant", "content": "", "tool_calls": call},
                        {"role": "tool", "tool_call_id": "c1", "content": "r"}]}
    row.update(extra or {})
    return row


def j(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False)


def jsonl(name: str, bad_line: str | bytes, good: tuple[dict, dict] = (G1, G2)) -> None:
    bad = bad_line if isinstance(bad_line, bytes) else bad_line.encode("utf-8")
    (HERE / name).write_bytes(j(good[0]).encode() + b"\n" + bad + b"\n" + j(good[1]).encode() + b"\n")


def json_array_text(name: str, text: str | bytes) -> None:
    (HERE / name).write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))


def json_array(name: str, bad: object, good: tuple[dict, dict] = (G1, G2)) -> None:
    json_array_text(name, json.dumps([good[0], bad, good[1]], indent=2, ensure_ascii=False))


def parquet(name: str, rows: list[dict], schema: pa.Schema) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), HERE / name)


MSG = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def main() -> None:
    for old in HERE.glob("*.json*"):
        old.unlink()
    for old in HERE.glob("*.parquet"):
        old.unlink()
    # --- JSON Lines (format openai unless the test says otherwise)
    jsonl("not_json_truncated.jsonl", '{"messages": [{"role": "user", "content": "cut')
    jsonl("not_json_trailing_garbage.jsonl", '{"messages": [{"role": "user", "content": "x"}]} trailing')
    jsonl("not_json_python_dict.jsonl", "{'messages': [{'role': 'user', 'content': 'hi'}]}")
    jsonl("not_json_deep_nesting.jsonl", '{"messages": ' + "[" * 5000 + "]" * 5000 + "}")
    jsonl("not_json_huge_integer.jsonl", '{"messages": [], "n": 1' + "0" * 5000 + "}")
    jsonl("not_an_object_array.jsonl", j([user("hi")]))
    jsonl("not_an_object_string.jsonl", '"just a string"')
    jsonl("not_an_object_null.jsonl", "null")
    jsonl("invalid_utf8_latin1.jsonl", b'{"messages": [{"role": "user", "content": "caf\xe9"}]}')
    jsonl("invalid_unicode_lone_surrogate.jsonl", '{"messages": [{"role": "user", "content": "x \\ud800 y"}]}')
    jsonl("too_large_line.jsonl", j({"messages": [user("x" * 5000)]}))  # ingested with max_bytes=1000
    jsonl("unknown_format_no_known_field.jsonl", j({"text": "hello", "label": 1}))  # format auto
    jsonl("missing_field_messages.jsonl", j({"conversation": [user("hi")]}))
    jsonl("missing_field_role.jsonl", j({"messages": [{"content": "hi"}]}))
    jsonl("missing_field_user_content.jsonl", j({"messages": [{"role": "user"}]}))
    jsonl("missing_field_assistant_content.jsonl", j({"messages": [user("a"), {"role": "assistant"}, user("b")]}))
    jsonl("unknown_role_narrator.jsonl", j({"messages": [{"role": "narrator", "content": "once"}, user("hi")]}))
    jsonl("unknown_role_number.jsonl", j({"messages": [{"role": 3, "content": "hi"}]}))
    jsonl("empty_conversation.jsonl", j({"messages": []}))
    jsonl("nothing_to_regenerate_assistant_only.jsonl", j({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "hi"}]}))
    jsonl("empty_turn_user_whitespace.jsonl", j({"messages": [user("  \n ")]}))
    jsonl("empty_turn_assistant_in_history.jsonl", j({"messages": [user("a"), {"role": "assistant", "content": ""}, user("b")]}))
    jsonl("bad_content_object.jsonl", j({"messages": [{"role": "user", "content": {"text": "hi"}}]}))
    jsonl("bad_content_number.jsonl", j({"messages": [{"role": "user", "content": 42}]}))
    jsonl("bad_content_image_part.jsonl", j({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]}))
    jsonl("bad_content_null_user.jsonl", j({"messages": [{"role": "user", "content": None}]}))
    jsonl("bad_content_reasoning_not_string.jsonl", j({"messages": [user("a"), {"role": "assistant", "content": "b", "reasoning_content": 5}, user("c")]}))
    jsonl("bad_field_messages_string.jsonl", j({"messages": "hello there"}))
    jsonl("bad_field_message_not_object.jsonl", j({"messages": ["hello there"]}))
    jsonl("bad_field_name_not_string.jsonl", j({"messages": [{"role": "user", "content": "hi", "name": 7}]}))
    jsonl("bad_tools_not_json.jsonl", j({**G1, "messages": [user("t1")], "tools": "[{\"name\": "}))
    jsonl("bad_tools_object.jsonl", j({"messages": [user("t2")], "tools": {"name": "f"}}))
    jsonl("bad_tools_missing_name.jsonl", j({"messages": [user("t3")], "tools": [{"type": "function", "function": {"description": "no name"}}]}))
    jsonl("bad_tools_parameters_string.jsonl", j({"messages": [user("t4")], "tools": [{"name": "f", "parameters": "object"}]}))
    jsonl("bad_tools_item_not_object.jsonl", j({"messages": [user("t5")], "tools": ["get_weather"]}))
    jsonl("bad_tool_arguments_not_json.jsonl", j(with_call([{**CALL, "function": {"name": "f", "arguments": "{city: Paris"}}])))
    jsonl("bad_tool_arguments_list.jsonl", j(with_call([{**CALL, "function": {"name": "f", "arguments": "[1, 2]"}}])))
    jsonl("bad_tool_call_no_name.jsonl", j(with_call([{"id": "c1", "type": "function", "function": {"arguments": "{}"}}])))
    jsonl("bad_tool_call_not_list.jsonl", j(with_call(CALL)))
    jsonl("orphan_tool_result.jsonl", j({"messages": [user("q"), {"role": "tool", "content": "result"}]}))
    jsonl("bad_number_nan.jsonl", '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", '
          '"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": NaN}}}]}, '
          '{"role": "tool", "tool_call_id": "c1", "content": "r"}]}')
    jsonl("hermes_unknown_part_type.jsonl", j({"messages": [{"role": "user", "content": [{"type": "audio", "value": "a.wav"}]}]}))
    jsonl("hermes_tool_call_part_not_json.jsonl", j({"messages": [
        {"role": "user", "content": [{"type": "text", "value": "q"}]},
        {"role": "assistant", "content": [{"type": "tool_call", "value": "f(x=1)"}]},
        {"role": "tool", "content": [{"type": "text", "value": "r"}]}]}))
    jsonl("bfcl_question_not_turns.jsonl", j({"id": "x", "question": ["hi"], "function": []}),
          good=({"question": [[user("good one")]], "function": []}, {"question": [[user("good two")]], "function": []}))
    jsonl("question_null.jsonl", j({"question": None}), good=({"question": "good one"}, {"question": "good two"}))
    # --- JSON arrays (and a JSON Lines file named .json)
    json_array("array_not_an_object_element.json", 42)
    json_array("sharegpt_unknown_from.json", {"conversations": [{"from": "robot", "value": "beep"}]}, good=(S1, S2))
    json_array("sharegpt_function_call_not_json.json", {"conversations": [
        {"from": "human", "value": "q"}, {"from": "function_call", "value": "search(q)"},
        {"from": "observation", "value": "r"}]}, good=(S1, S2))
    json_array("sharegpt_tools_not_json.json", {"conversations": S1["conversations"], "tools": "[{\"name\""}, good=(S1, S2))
    json_array("sharegpt_observation_first.json", {"conversations": [{"from": "observation", "value": "r"}, {"from": "human", "value": "q"}]}, good=(S1, S2))
    json_array("sharegpt_value_list.json", {"conversations": [{"from": "human", "value": ["a", 1]}]}, good=(S1, S2))
    json_array("alpaca_instruction_not_string.json", {"instruction": ["a"], "input": "", "output": "x"},
               good=({"instruction": "good one", "input": "", "output": "x"}, {"instruction": "good two", "input": "", "output": "x"}))
    json_array("alpaca_missing_instruction.json", {"input": "x", "output": "y"},
               good=({"instruction": "good one", "input": "", "output": "x"}, {"instruction": "good two", "input": "", "output": "x"}))
    json_array("array_too_large_element.json", {"messages": [user("x" * 5000)]})  # ingested with max_bytes=1000
    json_array_text("array_malformed_element.json", "[\n" + j(G1) + ',\n{"messages": [{"role": "user", "content": "x"}],, "k": 1},\n' + j(G2) + "\n]\n")
    json_array_text("array_deep_nesting_element.json", "[\n" + j(G1) + ',\n{"messages": ' + "[" * 5000 + "]" * 5000 + "},\n" + j(G2) + "\n]\n")
    json_array_text("array_bare_word_element.json", "[\n" + j(G1) + ",\nundefined,\n" + j(G2) + "\n]\n")
    json_array_text("array_truncated.json", "[\n" + j(G1) + ",\n" + j(G2) + ',\n{"messages": [{"role": "us')
    json_array_text("array_missing_comma.json", "[\n" + j(G1) + "\n" + j(G2) + "\n]\n")
    json_array_text("array_invalid_utf8.json", b"[\n" + j(G1).encode() + b',\n{"messages": [{"role": "user", "content": "caf\xe9"}]},\n' + j(G2).encode() + b"\n]\n")
    json_array_text("array_trailing_garbage.json", "[\n" + j(G1) + ",\n" + j(G2) + "\n]\n}}extra")
    json_array_text("jsonl_named_json_with_bad_line.json", j(G1) + "\n{oops\n" + j(G2) + "\n")
    json_array_text("json_document_scalar.json", '"hello"\n')
    # --- Parquet
    parquet("parquet_messages_null.parquet", [G1, {"messages": None}, G2], pa.schema([("messages", MSG)]))
    parquet("parquet_unknown_role.parquet", [G1, {"messages": [{"role": "bot", "content": "x"}]}, G2], pa.schema([("messages", MSG)]))
    parquet("parquet_empty_messages.parquet", [G1, {"messages": []}, G2], pa.schema([("messages", MSG)]))
    parquet("parquet_nothing_to_regenerate.parquet", [G1, {"messages": [{"role": "assistant", "content": "x"}]}, G2], pa.schema([("messages", MSG)]))
    parquet("parquet_bad_tools.parquet", [{**G1, "tools": None}, {**G1, "tools": "{oops"}, {**G2, "tools": "[]"}],
            pa.schema([("messages", MSG), ("tools", pa.string())]))
    parquet("parquet_messages_json_string_invalid.parquet",
            [{"messages": j(G1["messages"])}, {"messages": "not json"}, {"messages": j(G2["messages"])}], pa.schema([("messages", pa.string())]))
    parquet("parquet_content_null.parquet", [G1, {"messages": [{"role": "user", "content": None}]}, G2], pa.schema([("messages", MSG)]))
    parquet("parquet_too_large.parquet", [G1, {"messages": [{"role": "user", "content": "x" * 5000}]}, G2], pa.schema([("messages", MSG)]))
    (HERE / "parquet_corrupt.parquet").write_bytes(b"PAR1" + b"\x00garbage, not a footer" * 10 + b"PAR1")


if __name__ == "__main__":
    main()
