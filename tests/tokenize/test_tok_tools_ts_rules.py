"""Rules of ../shared/specs/kimi-tools-ts.md that the golden cases do not pin down (section numbers cited)."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_dagster.tokenize import ToolSchemaError, compute_tools_ts_str, deep_sort, tools_to_typescript


def fn(name: str = "f", parameters: Any = None, description: Any = None, **extra: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, **extra}
    if parameters is not None:
        function["parameters"] = parameters
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, **extra}
    if required is not None:
        schema["required"] = required
    return schema


def block(tools: list[dict[str, Any]]) -> str:
    """The namespace body (between the header and the closing brace)."""
    text = tools_to_typescript(deep_sort(tools))
    assert text.startswith("# Tools\n\n## functions\nnamespace functions {\n") and text.endswith("\n}\n")
    return text[len("# Tools\n\n## functions\nnamespace functions {\n") : -len("\n}\n")]


def test_comment_lines_split_on_lf_only_and_keep_spaces() -> None:  # §6
    assert block([fn("a", description="x\r\ny")]) == "// x\r\n// y\ntype a = (_: {}) => any;"
    assert block([fn("b", description="\n")]) == "\n\ntype b = (_: {}) => any;"
    assert block([fn("c", description="   ")]) == "//    \ntype c = (_: {}) => any;"


def test_which_entries_become_blocks() -> None:  # §4, §5
    tools = [
        {"type": "function"},
        {"type": "function", "function": {}},
        {"type": "_plugin", "x": 1},
        {"type": "function", "function": {"description": "no name"}},
        fn(name=None),
        fn("my-tool.v2"),
    ]
    assert (
        block(tools) == "// no name\ntype function = (_: {}) => any;\ntype None = (_: {}) => any;\n"
        "type my-tool.v2 = (_: {}) => any;"
    )
    sorted_tools, ts, reason = compute_tools_ts_str(tools[:3])
    assert ts is None and reason == "no usable function tool" and sorted_tools == deep_sort(tools[:3])


def test_top_level_parameters_are_always_an_object() -> None:  # §5, §7.3
    params = {
        "type": "string",
        "description": "dropped",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert block([fn("g", params)]) == "type g = (_: {\n  a?: number,\n  [k: string]: never\n}) => any;"


@pytest.mark.parametrize(
    "schema,expected",
    [
        ({"type": "integer", "enum": [True, 2]}, "True | 2"),  # §7.5 bools count as integers
        ({"type": ["string", "null"], "enum": ['say "hi"', None]}, '"say "hi"" | None'),  # never escaped
        ({"enum": [{"b": 1, "a": 2}, [1, 2.5]]}, "{'a': 2, 'b': 1} | [1, 2.5]"),  # Python repr, deep-sorted
        ({"type": ["integer", "number"]}, "number | number"),  # §7.7 duplicates kept
        ({"type": ["string"], "maxLength": 3}, "string"),  # no constraints on type lists
        ({"type": "file"}, "file"),  # unknown scalar verbatim
        ({"anyOf": [{"type": "string", "description": "hidden"}, {"type": "null"}], "enum": [1]}, "string | null"),
        ({"$ref": "#/$defs/D", "type": "string"}, "D"),  # $ref beats everything
        (True, "any"),
        ({}, "any"),
        ({"type": "array", "items": {}}, "Array<any>"),
    ],
)
def test_type_expressions(schema: Any, expected: str) -> None:  # §7.1 - §7.8
    params = {"type": "object", "properties": {"x": schema}, "required": ["x"], "$defs": {"D": {"type": "string"}}}
    body = block([fn("t", params)])
    assert f"  x: {expected}\n}}) => any;" in body


@pytest.mark.parametrize(
    "default,line",
    [
        (1e-07, "1e-07"),
        (1e16, "1e+16"),
        (30.0, "30.0"),
        (False, "False"),
        ('héllo "q"', '"héllo \\"q\\""'),
        ({"z": True, "a": None}, '{"a": null, "z": true}'),
    ],
)
def test_default_values(default: Any, line: str) -> None:  # §7.10
    body = block([fn("d", obj({"v": {"type": "number", "default": default}}))])
    assert f"  // Default: {line}\n  v?: number" in body


def test_constraints_sorted_with_python_values() -> None:  # §7.9
    schema = {"type": "number", "minimum": 0.0, "maximum": 10, "multipleOf": 2}
    assert "  // maximum: 10, minimum: 0.0\n  n?: number" in block([fn("c", obj({"n": schema}))])


def test_ref_to_a_definition_registered_later_is_an_error() -> None:  # §8.1
    later = obj({"a_first": {"$ref": "#/$defs/Late"}, "b_nested": obj({}, **{"$defs": {"Late": {"type": "string"}}})})
    with pytest.raises(ToolSchemaError, match="reference not found"):
        tools_to_typescript(deep_sort([fn("r", later)]))
    earlier = obj({"a_nested": obj({}, **{"$defs": {"Early": {"type": "string"}}}), "b_use": {"$ref": "#/$defs/Early"}})
    assert block([fn("r", earlier)]).startswith("interface Early string\n")


def test_self_reference_only_inside_defs_does_not_switch_mode() -> None:  # §8.3
    params = obj({"n": {"$ref": "#/$defs/Node"}}, **{"$defs": {"Node": obj({"parent": {"$ref": "#"}})}})
    assert (
        block([fn("s", params)]) == "interface Node {\n  parent?: parameters\n}\ntype s = (_: {\n  n?: Node\n}) => any;"
    )


@pytest.mark.parametrize(
    "params",
    [
        obj({"x": {"description": "only a description"}}),
        obj({"x": {"type": "integer", "enum": [1.0]}}),
        obj({"x": {"type": ["string", "number"], "enum": ["a"]}}),
        obj({"x": {"type": ["string", "date"]}}),
        obj({"x": {"$ref": "#/definitions/X"}}),
        obj({"x": {"type": "array", "items": [{"type": "string"}]}}),
        obj({"x": {"type": "string"}}, additionalProperties="yes"),
        obj({"x": {"type": "string", "description": 5}}),
        {"type": "object", "properties": {"x": {"type": "string"}}, "required": None},
        {"type": "object", "properties": ["x"]},
    ],
)
def test_schema_errors_fall_back_to_json(params: dict[str, Any]) -> None:  # §10
    tools = [fn("good", obj({"a": {"type": "string"}})), fn("bad", params)]
    sorted_tools, ts, reason = compute_tools_ts_str(tools)
    assert ts is None and reason
    assert sorted_tools == deep_sort(tools)


def test_function_description_must_be_text() -> None:  # §10
    with pytest.raises(ToolSchemaError, match="description"):
        tools_to_typescript([fn("f", description=3)])
