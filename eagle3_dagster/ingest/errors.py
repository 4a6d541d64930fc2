"""Errors of the ingest stage: one for a bad row (becomes a reject row), two for whole-file problems."""

from __future__ import annotations


class RowReject(Exception):
    """A record that cannot become a prompt. `reason` is a stable code; `detail` names the field."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class IngestFileError(ValueError):
    """A whole file (or a source's path) cannot be read; the message names the file."""


class EmptySourceError(IngestFileError):
    """A source yielded no accepted prompt (and its YAML does not say allow_empty); nothing was written."""


class SourceSpecError(ValueError):
    """A source YAML is missing, unreadable or inconsistent; the message names file and field."""


# Every reason code a reject row can carry (kept in one place so gates and docs can list them).
REJECT_REASONS: tuple[str, ...] = (
    "not_json",  # the row (or the JSON array element) is not parseable JSON
    "not_an_object",  # valid JSON, but not an object/record
    "invalid_utf8",  # the row's bytes are not UTF-8
    "invalid_unicode",  # text holds lone surrogates (\ud800 escapes) that cannot be stored
    "too_large",  # the raw row is longer than the source's max_bytes
    "unknown_format",  # format: auto found no known field layout
    "missing_field",  # a required field (messages, role, content, ...) is absent or null
    "bad_field",  # a structural field has the wrong type (messages not a list, ...)
    "unknown_role",  # a role/from value that is not system|user|assistant|tool (or alias)
    "empty_conversation",  # no messages at all
    "empty_turn",  # a user (or bare assistant) turn with no text
    "nothing_to_regenerate",  # no user or tool message, so there is no prompt to answer
    "bad_content",  # content that is not text and cannot be converted to text
    "bad_tools",  # tools not valid JSON / not a list of function schemas
    "bad_tool_call",  # a tool call without a function name, or not an object
    "bad_tool_arguments",  # tool call arguments that are not a JSON object
    "orphan_tool_result",  # a tool message with no earlier tool call to answer
    "bad_number",  # NaN/Infinity, which canonical JSON cannot hold
    "eval_overlap",  # prompts stage: a training prompt overlaps an eval prompt (decontaminate.py); names both
    "probe_overlap",  # prompts stage: a training prompt overlaps a probe prompt (role: probe); names both
)
