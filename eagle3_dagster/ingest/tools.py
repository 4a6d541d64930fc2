"""A record's `tools` field as OpenAI function schemas, and the JSON helpers the normalizers share.

Split from normalize.py (one responsibility a module): tools arrive as a list, a JSON string
(hermes/glaive dumps, Parquet, CSV) or BFCL's `function` docs with JSON-Schema type "dict".
"""

from __future__ import annotations

import json
from typing import Any

from .errors import RowReject

__all__ = ["decode_json_string", "json_type", "normalize_tools"]


def decode_json_string(value: Any, reason: str, message: str) -> Any:
    """Exports (Parquet, CSV, hermes/glaive dumps) often store lists and objects as JSON strings:
    decode a string, pass anything else through; undecodable JSON rejects the row with `reason`."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise RowReject(reason, message) from None


def normalize_tools(raw: Any) -> list[dict[str, Any]] | None:
    """Tools field -> OpenAI function schemas, or None for none. Raises RowReject(bad_tools)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        if not raw.strip():
            return None
        raw = decode_json_string(raw, "bad_tools", "field 'tools' is a string that is not valid JSON")
    if isinstance(raw, dict):
        raise RowReject("bad_tools", "field 'tools' must be a list of function schemas, got an object")
    if not isinstance(raw, list):
        raise RowReject("bad_tools", f"field 'tools' must be a list of function schemas, got {json_type(raw)}")
    tools: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise RowReject("bad_tools", f"tools[{i}] is a JSON {json_type(item)}, expected a function schema")
        fn: dict[str, Any] = item["function"] if isinstance(item.get("function"), dict) else item
        if item.get("type", "function") != "function":
            raise RowReject(
                "bad_tools", f"tools[{i}] has type {str(item.get('type'))[:30]!r}, only 'function' is supported"
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise RowReject("bad_tools", f"tools[{i}] has no function name")
        schema: dict[str, Any] = {"name": name}
        if "description" in fn and fn["description"] is not None:
            if not isinstance(fn["description"], str):
                raise RowReject("bad_tools", f"tools[{i}] ({name}) description must be a string")
            schema["description"] = fn["description"]
        if "parameters" in fn and fn["parameters"] is not None:
            params = fn["parameters"]
            params = decode_json_string(params, "bad_tools", f"tools[{i}] ({name}) parameters are not valid JSON")
            if not isinstance(params, dict):
                raise RowReject(
                    "bad_tools",
                    f"tools[{i}] ({name}) parameters must be a JSON schema object, got {json_type(params)}",
                )
            schema["parameters"] = _dict_type_to_object(params)
        tools.append({"type": "function", "function": schema})
    return tools or None


def _dict_type_to_object(node: Any) -> Any:
    """BFCL writes JSON-Schema type "dict"; the standard (and every chat template) says "object"."""
    if isinstance(node, dict):
        return {k: ("object" if k == "type" and v == "dict" else _dict_type_to_object(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_dict_type_to_object(v) for v in node]
    return node


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
