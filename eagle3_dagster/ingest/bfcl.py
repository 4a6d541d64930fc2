"""BFCL multi-turn records joined to their function docs (the source option `function_docs`).

BFCL's multi-turn files (`BFCL_v4_multi_turn_{base,long_context,miss_func,miss_param}.json`) name the
API classes a record uses in `involved_classes` and keep each class's function docs in one JSON Lines
file of `multi_turn_func_doc/`. The facts below are BFCL's own (gorilla commit 6ea5797, see docs/bfcl.md):

* class -> file: `MULTI_TURN_FUNC_DOC_FILE_MAPPING` (bfcl_eval/constants/executable_backend_config.py);
* a record's functions: the docs of its classes in `involved_classes` order, each file's docs in file
  order (bfcl_eval/utils.py `populate_test_cases_with_predefined_functions`);
* `missed_function` ({"<turn index>": [names]}, miss_func records): those docs are taken out of the
  list and held back; at that turn (whose question is empty) they are appended to the list and the
  user says `ADDITIONAL_FUNCTION_PROMPT` (bfcl_eval/model_handler/base_handler.py, FC mode);
* `excluded_function` ([names], 18 records of each file): BFCL's PR #1239 holds these out to keep one
  valid action path (cp/mv/rm). BFCL's loader does not read the field at that commit; here the named
  functions are left out of the record's tools for every turn.

Unlike BFCL (which skips a name it cannot find) every name must match a doc of the record's classes,
else the record is rejected, naming the record, the field and the name.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from .errors import IngestFileError, RowReject
from .tools import json_type, normalize_tools

MULTI_TURN_FUNC_DOC_FILE_MAPPING: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
    "WebSearchAPI": "web_search.json",
    "MemoryAPI_kv": "memory_kv.json",
    "MemoryAPI_vector": "memory_vector.json",
    "MemoryAPI_rec_sum": "memory_rec_sum.json",
}

# BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC: the user turn at which held-back functions appear.
ADDITIONAL_FUNCTION_PROMPT = "I have updated some more functions you can choose from. What about now?"


class FunctionDocs:
    """A `multi_turn_func_doc/` folder; each class's file is read once, on first use."""

    def __init__(self, folder: Path, source: str) -> None:
        if not folder.exists():
            raise IngestFileError(f"source {source!r}: field 'function_docs': folder not found: {folder}")
        if not folder.is_dir():
            raise IngestFileError(f"source {source!r}: field 'function_docs': {folder} is not a folder")
        self.folder = folder
        self.source = source
        self._docs: dict[str, list[dict[str, Any]] | None] = {}

    def of_class(self, name: Any, where: str, record_id: str) -> list[dict[str, Any]]:
        """The class's function docs; RowReject for an unknown class or a class whose file is absent."""
        file = MULTI_TURN_FUNC_DOC_FILE_MAPPING.get(name) if isinstance(name, str) else None
        if file is None:
            known = ", ".join(MULTI_TURN_FUNC_DOC_FILE_MAPPING)
            raise RowReject(
                "bad_field", f"record {record_id}: {where} {str(name)[:60]!r} is not a BFCL class ({known})"
            )
        if name not in self._docs:
            self._docs[name] = self._load(self.folder / file)
        docs = self._docs[name]
        if docs is None:
            raise RowReject(
                "missing_field",
                f"record {record_id}: {where} {name}: its function docs {self.folder / file} are missing",
            )
        return docs

    def _load(self, path: Path) -> list[dict[str, Any]] | None:
        """JSON Lines of function docs (BFCL's layout); None when absent; IngestFileError when unreadable."""
        if not path.is_file():
            return None
        docs: list[dict[str, Any]] = []
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise IngestFileError(f"source {self.source!r}: function docs {path}: cannot read: {e}") from None
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as e:
                raise IngestFileError(
                    f"source {self.source!r}: function docs {path} line {n}: invalid JSON: {e}"
                ) from None
            if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
                raise IngestFileError(
                    f"source {self.source!r}: function docs {path} line {n}: not a function doc with a name"
                )
            docs.append(doc)
        return docs


def _names(value: Any, where: str, record_id: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise RowReject(
            "bad_field", f"record {record_id}: {where} must be a list of function names, got {json_type(value)}"
        )
    return value


def join_function_docs(record: Any, docs: FunctionDocs) -> tuple[Any, dict[int, list[dict[str, Any]]]]:
    """A BFCL multi-turn record with its `function` docs filled in, and the docs added at later turns
    ({question index: docs}, miss_func). A record without `involved_classes` is returned as it is."""
    if not isinstance(record, dict) or "involved_classes" not in record:
        return record, {}
    rid = str(record.get("id", "?"))[:80]
    classes = record["involved_classes"]
    if not isinstance(classes, list) or not classes:
        raise RowReject(
            "bad_field", f"record {rid}: field 'involved_classes' must be a non-empty list, got {json_type(classes)}"
        )
    if record.get("function") is not None:
        raise RowReject("bad_field", f"record {rid}: has both 'function' and 'involved_classes'; give one")
    functions = [doc for i, c in enumerate(classes) for doc in docs.of_class(c, f"involved_classes[{i}]", rid)]
    available = {d["name"] for d in functions}
    if "excluded_function" in record:
        excluded = set(_names(record["excluded_function"], "field 'excluded_function'", rid))
        unknown = sorted(excluded - available)
        if unknown:
            raise RowReject(
                "bad_field", f"record {rid}: excluded_function {', '.join(unknown)} not in the docs of {classes}"
            )
        functions = [d for d in functions if d["name"] not in excluded]
    out = dict(record)
    added: dict[int, list[dict[str, Any]]] = {}
    missed = record.get("missed_function")
    if missed is not None:
        question = record.get("question")
        if not isinstance(missed, dict) or not isinstance(question, list):
            raise RowReject("bad_field", f"record {rid}: field 'missed_function' must map turn indices to names")
        if not all(isinstance(turn, list) for turn in question):  # turn indices count lists of messages
            raise RowReject("bad_field", f"record {rid}: with missed_function, every question turn must be a list")
        question = list(question)
        for key in missed:
            turn = int(key) if isinstance(key, str) and key.isdigit() else -1
            if not 0 < turn < len(question):
                raise RowReject(
                    "bad_field",
                    f"record {rid}: missed_function turn {str(key)[:20]!r} is not a later turn of 'question'",
                )
            if question[turn]:
                raise RowReject(
                    "bad_field",
                    f"record {rid}: question[{turn}] holds messages, but BFCL adds functions on an empty turn",
                )
            held = []
            for name in _names(missed[key], f"missed_function[{key}]", rid):
                at = next((i for i, d in enumerate(functions) if d["name"] == name), None)
                if at is None:
                    raise RowReject(
                        "bad_field", f"record {rid}: missed_function[{key}] {name} not in the docs of {classes}"
                    )
                held.append(functions.pop(at))  # BFCL: the first doc of that name is held back
            added[turn] = held
            question[turn] = [{"role": "user", "content": ADDITIONAL_FUNCTION_PROMPT}]
        out["question"] = question
    out["function"] = copy.deepcopy(functions)
    return out, added


def tool_changes(
    conversation: list[dict[str, Any]],
    record: dict[str, Any],
    added: dict[int, list[dict[str, Any]]],
    tools: list[dict[str, Any]] | None,
) -> list[list[Any]]:
    """[[message position, tools from there on], ...] of a conversation built from a joined record
    (normalize.build_conversation: each non-empty question turn, then its answer slot)."""
    if not added:
        return []
    # the position where question turn i starts: just after the answer slot of the turn before it
    starts: list[int] = []
    pos = 0
    slots = iter(i for i, m in enumerate(conversation) if m.get("generate"))
    for turn in record["question"]:
        starts.append(pos)
        if turn:
            pos = next(slots) + 1
    changes: list[list[Any]] = []
    current = list(tools or [])
    for turn in sorted(added):
        current = current + (normalize_tools(added[turn]) or [])
        changes.append([starts[turn], current])
    return changes
