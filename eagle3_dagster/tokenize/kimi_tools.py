"""Kimi-K2.5 tool declarations: the TypeScript-like `tools_ts_str` the served model sees.

An independent implementation of ../shared/specs/kimi-tools-ts.md (section numbers below refer to
it). The official tokenizer computes this text in remote code; we compute it here so a plain,
offline tokenizer produces byte-identical prompts. Any schema the spec calls an error raises
`ToolSchemaError`, and the caller falls back to the template's compact-JSON rendering (§2.4, §10).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Bump when the rendering rules below change: it feeds the template hash (lineage), so a fixed
# rendering bug invalidates cached prompts instead of silently mixing old and new texts.
TOOLS_TS_VERSION = "kimi-tools-ts/1"

_HEADER = "# Tools\n\n## functions\nnamespace functions {\n"
_FOOTER = "\n}\n"
_INDENT_STEP = "  "

# §7.7: a `type` list maps each name to a fixed word; any other name is an error.
_TYPE_LIST_WORDS = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}
# §7.2 / §7.4: the constraint keys shown in comments, per kind.
_STRING_CONSTRAINTS = ("maxLength", "minLength", "pattern")
_NUMBER_CONSTRAINTS = ("maximum", "minimum")
_ARRAY_CONSTRAINTS = ("maxItems", "minItems")


class ToolSchemaError(ValueError):
    """A tool schema the converter rejects (§10); the whole tools list falls back to JSON."""


def deep_sort(value: Any) -> Any:
    """§2.1: copy with every object's keys in code-point order; arrays keep their order."""
    if isinstance(value, dict):
        return {key: deep_sort(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [deep_sort(item) for item in value]
    return value


def tools_to_typescript(tools: list[Any]) -> str:
    """Render an (already deep-sorted) tools list as tools_ts_str; "" when no usable function tool.

    Raises ToolSchemaError for any schema the spec rejects.
    """
    blocks: list[str] = []
    for tool in tools:
        # §4: only {"type": "function", "function": {non-empty}} entries become blocks.
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        function = tool.get("function")
        if not function:
            continue
        if not isinstance(function, dict):
            raise ToolSchemaError(f"'function' must be an object, got {type(function).__name__}")
        blocks.append(_FunctionRenderer(function).render())
    if not blocks:
        return ""
    return _HEADER + "\n".join(blocks) + _FOOTER


def compute_tools_ts_str(tools: list[Any] | None) -> tuple[list[Any] | None, str | None, str | None]:
    """The official tokenizer's steps (§2): (sorted tools, tools_ts_str or None, fallback reason or None).

    tools_ts_str is None when the template must fall back to compact JSON of the sorted tools:
    no usable function tool, or a schema error (the reason then says which).
    """
    if not tools:
        return (None if tools is None else [], None, None)
    sorted_tools = deep_sort(tools)
    try:
        text = tools_to_typescript(sorted_tools)
    except ToolSchemaError as e:
        return sorted_tools, None, str(e)
    except Exception as e:  # any other failure on odd input also means "fall back", never a crash
        return sorted_tools, None, f"{type(e).__name__}: {e}"
    return sorted_tools, (text or None), (None if text else "no usable function tool")


# ---------------------------------------------------------------------------------------------
# Value formatting (§7.5, §7.9, §7.10): Python spellings leak through on purpose.


def _python_str(value: Any) -> str:
    # Python's str(): True/False/None, float repr ("30.0", "1e-05"), dict/list repr.
    return str(value)


def _default_text(value: Any) -> str:
    if isinstance(value, (bool, int, float)):
        return _python_str(value)
    # strings, arrays and objects are JSON (", " and ": " separators, non-ASCII raw)
    return json.dumps(value, ensure_ascii=False)


def _comment_lines(description: str, indent: str) -> str:
    """§6: split on LF only; empty pieces are bare empty lines, others `indent// piece`."""
    return "\n".join(f"{indent}// {piece}" if piece else "" for piece in description.split("\n"))


def _checked_description(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    description = schema.get("description")
    if not description:
        return None
    if not isinstance(description, str):
        raise ToolSchemaError(f"description must be a string, got {type(description).__name__}: {description!r}")
    return description


def _enum_member(value: Any) -> str:
    # §7.5: strings are quoted but never escaped.
    return f'"{value}"' if isinstance(value, str) else _python_str(value)


def _check_enum_types(schema: dict[str, Any], members: list[Any]) -> None:
    declared = schema.get("type")
    if isinstance(declared, list):
        if len(declared) == 1:
            declared = declared[0]
        elif len(declared) == 2 and "null" in declared:
            declared = declared[1] if declared[0] == "null" else declared[0]
        else:
            raise ToolSchemaError(f"enum with type list {declared!r}: only [T] or [T, 'null'] allowed")
    checks = {
        "string": lambda v: isinstance(v, str),
        # bool is an int in Python, so booleans pass as integer and number (§7.5)
        "number": lambda v: isinstance(v, (int, float)),
        "integer": lambda v: isinstance(v, int),
        "boolean": lambda v: isinstance(v, bool),
    }
    check = checks.get(declared) if isinstance(declared, str) else None
    if check is None:
        return
    for member in members:
        if member is not None and not check(member):
            raise ToolSchemaError(f"enum member {member!r} does not match type {declared!r}")


def _shown_constraint_keys(schema: Any) -> tuple[str, ...]:
    """Which constraint keys this schema shows, by its kind (§7.1 order; only scalars and arrays)."""
    if not isinstance(schema, dict):
        return ()
    if "$ref" in schema or "anyOf" in schema or "enum" in schema:
        return ()
    kind = schema.get("type")
    if kind == "string":
        return _STRING_CONSTRAINTS
    if kind in ("number", "integer"):
        return _NUMBER_CONSTRAINTS
    if kind == "array":
        return _ARRAY_CONSTRAINTS
    return ()


def _constraints_text(schema: Any) -> str | None:
    keys = [k for k in _shown_constraint_keys(schema) if k in schema]
    if not keys:
        return None
    return ", ".join(f"{k}: {_python_str(schema[k])}" for k in sorted(keys))


@dataclass
class _FunctionRenderer:
    """One function block (§5, §8). Holds the per-function $defs registry and mode flags."""

    function: dict[str, Any]
    definitions: dict[str, Any] = field(default_factory=dict)
    parsing_parameters: bool = False
    self_reference: bool = False

    def render(self) -> str:
        fn = self.function
        name = _python_str(fn["name"]) if "name" in fn else "function"
        description = _checked_description(fn)
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, dict):
            raise ToolSchemaError(f"function {name}: parameters must be an object, got {type(parameters).__name__}")

        self.parsing_parameters = True
        fields_by_name, additional = self._object_parts(parameters, "")
        self.parsing_parameters = False

        parts: list[str] = []
        if self.self_reference:
            # §8.3: plain key order (sorted by the deep sort), no additionalProperties entry.
            entries = list(fields_by_name.values())
            parts.append("interface parameters " + self._braces(entries, ""))
            params_expr = "parameters"
        else:
            params_expr = self._braces(self._ordered_entries(parameters, fields_by_name, additional), "")
        # §8.2: one interface per definition registered while parsing, in registration order.
        for def_name, definition in list(self.definitions.items()):
            def_description = _checked_description(definition)
            interface = f"interface {def_name} {self._expr(definition, '')}"
            if def_description:
                interface = _comment_lines(def_description, "") + "\n" + interface
            parts.append(interface)
        if description:
            parts.append(_comment_lines(description, ""))
        parts.append(f"type {name} = (_: {params_expr}) => any;")
        return "\n".join(parts)

    # -- objects (§7.3) ------------------------------------------------------------------------

    def _object_parts(self, schema: dict[str, Any], indent: str) -> tuple[dict[str, str], str | None]:
        """Parse an object: register $defs, render each field entry in key order (parse order)."""
        # validated even where never shown (top-level parameters, §5)
        _checked_description(schema)
        defs = schema.get("$defs")
        if defs is not None:
            if not isinstance(defs, dict):
                raise ToolSchemaError(f"$defs must be an object, got {type(defs).__name__}")
            self.definitions.update(defs)
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise ToolSchemaError(f"properties must be an object, got {type(properties).__name__}")
        required = schema.get("required", [])
        if not isinstance(required, list):
            raise ToolSchemaError(f"required must be a list, got {type(required).__name__}")
        entry_indent = indent + _INDENT_STEP
        # Render in the deep-sorted key order: that is the parse order deciding $ref resolution (§8.1).
        fields_by_name = {
            name: self._field_entry(name, sub, entry_indent, optional=name not in required)
            for name, sub in properties.items()
        }
        additional: str | None = None
        if "additionalProperties" in schema and schema["additionalProperties"] is not None:
            extra = schema["additionalProperties"]
            if extra is True:
                extra_expr = "any"
            elif extra is False:
                extra_expr = "never"
            elif isinstance(extra, dict):
                extra_expr = self._expr(extra, entry_indent)
            else:
                raise ToolSchemaError(f"additionalProperties must be a boolean or a schema, got {extra!r}")
            additional = f"{entry_indent}[k: string]: {extra_expr}"
        return fields_by_name, additional

    @staticmethod
    def _ordered_entries(schema: dict[str, Any], fields_by_name: dict[str, str], additional: str | None) -> list[str]:
        required = schema.get("required", [])
        names = sorted(fields_by_name)
        ordered = [fields_by_name[n] for n in names if n in required]
        ordered += [fields_by_name[n] for n in names if n not in required]
        if additional is not None:
            ordered.append(additional)
        return ordered

    @staticmethod
    def _braces(entries: list[str], indent: str) -> str:
        if not entries:
            return "{}"
        return "{\n" + ",\n".join(entries) + "\n" + indent + "}"

    def _object_expr(self, schema: dict[str, Any], indent: str) -> str:
        fields_by_name, additional = self._object_parts(schema, indent)
        return self._braces(self._ordered_entries(schema, fields_by_name, additional), indent)

    def _field_entry(self, name: str, schema: Any, indent: str, *, optional: bool) -> str:
        marker = "?" if optional else ""
        expr = self._expr(schema, indent)
        comments: list[str] = []
        description = _checked_description(schema)
        if description:
            comments.append(_comment_lines(description, indent) + "\n")
        constraints = _constraints_text(schema)
        if constraints:
            comments.append(f"{indent}// {constraints}\n")
        if isinstance(schema, dict) and schema.get("default") is not None:
            comments.append(f"{indent}// Default: {_default_text(schema['default'])}\n")
        return "".join(comments) + f"{indent}{name}{marker}: {expr}"

    # -- type expressions (§7.1) ---------------------------------------------------------------

    def _expr(self, schema: Any, indent: str) -> str:
        if schema is True:
            return "any"
        if schema is False:
            return "null"
        if not isinstance(schema, dict):
            raise ToolSchemaError(f"a schema must be an object or a boolean, got {schema!r}")
        _checked_description(schema)
        if "$ref" in schema:
            return self._ref_expr(schema["$ref"])
        if "anyOf" in schema:
            alternatives = schema["anyOf"]
            if not isinstance(alternatives, list):
                raise ToolSchemaError(f"anyOf must be a list, got {type(alternatives).__name__}")
            return " | ".join(self._expr(alt, indent) for alt in alternatives)
        if "enum" in schema:
            members = schema["enum"]
            if not isinstance(members, list):
                raise ToolSchemaError(f"enum must be a list, got {type(members).__name__}")
            _check_enum_types(schema, members)
            return " | ".join(_enum_member(m) for m in members)
        if "type" in schema:
            kind = schema["type"]
            if isinstance(kind, list):
                words = []
                for type_name in kind:
                    word = _TYPE_LIST_WORDS.get(type_name) if isinstance(type_name, str) else None
                    if word is None:
                        raise ToolSchemaError(f"unknown type name {type_name!r} in type list {kind!r}")
                    words.append(word)
                return " | ".join(words)
            if kind == "object":
                return self._object_expr(schema, indent)
            if kind == "array":
                return self._array_expr(schema, indent)
            if kind == "integer":
                return "number"
            return _python_str(kind)  # unknown scalar names are printed verbatim (§10)
        if not schema:
            return "any"
        raise ToolSchemaError(f"schema has no recognised type keyword: {json.dumps(schema, ensure_ascii=False)[:200]}")

    def _array_expr(self, schema: dict[str, Any], indent: str) -> str:
        items = schema.get("items")
        if isinstance(items, list):
            raise ToolSchemaError("items given as an array (tuple form) is not supported")
        if not items:
            return "Array<any>"
        item_description = _checked_description(items)
        item_constraints = _constraints_text(items)
        if not item_description and not item_constraints:
            return f"Array<{self._expr(items, indent)}>"
        inner = indent + _INDENT_STEP
        lines = ["Array<\n"]
        if item_description:
            lines.append(_comment_lines(item_description, inner) + "\n")
        if item_constraints:
            lines.append(f"{inner}// {item_constraints}\n")
        lines.append(f"{inner}{self._expr(items, inner)}\n{indent}>")
        return "".join(lines)

    def _ref_expr(self, ref: Any) -> str:
        if ref == "#":
            if self.parsing_parameters:
                self.self_reference = True
            return "parameters"
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.split("/")[-1]
            if name not in self.definitions:
                raise ToolSchemaError(f"reference not found: {ref}")
            return name
        raise ToolSchemaError(f"unsupported $ref {ref!r}: only '#' and '#/$defs/NAME' are allowed")
