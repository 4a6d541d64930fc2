"""Secrets: a value that does not print itself, and the one function that removes secrets from text.

The settings module (config.py) reads the key from the environment once and hands it over as a
`Secret`; code that needs the value calls `reveal()` at the one place it is used (the Authorization
header). `repr`/`str`/f-strings show `Secret('***')`, so a config, a log line, metadata or run
config that contains the object never contains the key.

Servers quote requests back (a gateway's 4xx, a validation error listing the headers): any text a
server sends, and any exception text that may hold a URL, goes through `redact` where it enters the
program, before it can reach a log line, an error row, metadata or a report. `redact` removes every
secret value this process holds (each `Secret` registers its value when it is made) and the key-like
patterns: bearer/basic credentials, `user:password@` in URLs, `api_key=`/`token:`-style pairs, `sk-` keys.
`RedactingFilter` applies it to log records as well (belt and braces, not instead): on the project's
handlers, and on the HTTP library's loggers, whose INFO line names each request's URL as given (with
any `user:password@`).

A server's text can also forge what a person reads: a newline starts a fake log line, `ESC[2J` clears
the terminal, a right-to-left override reorders what follows. `printable` escapes every control, format
and line-separator character (`\\n`, `\\x1b`, `\\u202e`) so that server text is shown as one inert line:
every string a server sends (model path, drafter, version, error bodies, abort messages) is displayed
through it (logs, summaries, metadata, the data card); stored data keeps the text as received.
`PrintableFilter` does the same to log records on the handlers that carry server text.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from typing import Any
from urllib.parse import quote

REDACTED = "[redacted]"
_MIN_SECRET_LEN = 4  # shorter values would mangle ordinary text; the patterns still catch them in headers
_KNOWN: set[str] = set()

_PATTERNS = (
    # Authorization header values: "Bearer <key>", "Basic <base64>"
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=:-]+"),
    # URL user info: scheme://user:password@host -> scheme://user:[redacted]@host
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s:/?#@\"']*:)[^\s/?#@\"']+(?=@)"),
    # key=value / "key": "value" pairs whose name says credential
    re.compile(
        r"(?i)(\b[\w-]*(?:api[_-]?key|token|password|passwd|secret)[\"']?\s*[:=]\s*[\"']?)"
        r"(?!\[redacted\])[^\s\"',;&}]+"
    ),
    # any other Authorization scheme ("Token x", "ApiKey x"): the whole value, up to the quote or line end
    re.compile(
        r"(?i)(\b[\w-]*authorization[\"']?\s*[:=]\s*[\"']?)(?!\[redacted\])(?!(?:bearer|basic)\s)[^\s\"'][^\"'\r\n,;}]*"
    ),
    # OpenAI-style keys anywhere
    re.compile(r"()\bsk-[A-Za-z0-9_-]{6,}"),
)


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("a Secret needs a non-empty string")
        self._value = value
        register_secret(value)

    def reveal(self) -> str:
        """The value itself: only where it is sent, never into logs, metadata or data."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))


def register_secret(value: str | None) -> None:
    """Make `redact` remove `value` (and its URL-encoded form) from any text in this process."""
    if value and len(value) >= _MIN_SECRET_LEN:
        _KNOWN.add(value)
        _KNOWN.add(quote(value, safe=""))


def redact(text: str, *, secrets: tuple[str, ...] = ()) -> str:
    """`text` without any known secret value (registered, or passed in `secrets`) or key-like string."""
    if not text:
        return text
    for sec in sorted(_KNOWN.union(s for s in secrets if s and len(s) >= _MIN_SECRET_LEN), key=len, reverse=True):
        text = text.replace(sec, REDACTED)
    for pat in _PATTERNS:
        text = pat.sub(lambda m: m.group(1) + REDACTED, text)
    return text


# Cc: C0 controls, DEL, C1 controls; Cf: format characters (bidi overrides, zero-width); Zl, Zp: line and
# paragraph separators (a line break to some terminals and viewers); Cs: lone surrogates
_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(text: str) -> str:
    """`text` with every control, format and line-separator character escaped (`\\n`, `\\x1b`, `\\u202e`):
    one inert line, whatever a server put in it. Plain text comes back unchanged (the same object)."""
    if not text or text.isprintable():
        return text
    return "".join(_escaped(c) if unicodedata.category(c) in _UNPRINTABLE else c for c in text)


class PrintableFilter(logging.Filter):
    """Escapes a record's message (arguments included) with `printable` before a handler formats it: the
    handler's lines then never hold a terminal escape or a line a server forged."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = printable(msg)
        if clean is not msg:
            record.msg, record.args = clean, None
        return True


_CREDENTIAL_KEY = re.compile(r"(?i)[\w-]*(?:api[_-]?key|token|password|passwd|secret|authorization|credentials?)")


def redact_json(value: Any) -> Any:
    """A JSON value (a server's meta_info) with every secret out: each string through `redact`, and the string
    value of a key that names a credential (`authorization`, `api_key`, `x-auth-token`, ...) replaced whole.
    Numbers, booleans and nulls are kept as they are; a value with nothing to remove comes back equal."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            key = redact(k) if isinstance(k, str) else k
            named = isinstance(k, str) and _CREDENTIAL_KEY.fullmatch(k) is not None
            out[key] = REDACTED if named and isinstance(v, str) and v else redact_json(v)
        return out
    return value


def redacted_json_text(value: Any) -> str:
    """`value` as compact JSON after `redact_json` (how a server's meta_info is stored). The common case, a
    value with nothing to redact, costs one dump and one pass of the patterns over its text."""
    text = json.dumps(value, separators=(",", ":"))
    # the patterns see a credential-named key's value in the JSON text too ("credentials" is not among them)
    if redact(text) == text and "credential" not in text.lower():
        return text
    return json.dumps(redact_json(value), separators=(",", ":"))


class RedactingFilter(logging.Filter):
    """Redacts a record's message (arguments included) before a handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


HTTP_LIBRARY_LOGGERS = ("httpx", "httpcore")


def redact_http_library_logs() -> None:
    """Put a RedactingFilter on the HTTP library's loggers (once): their records name request URLs."""
    for name in HTTP_LIBRARY_LOGGERS:
        lg = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in lg.filters):
            lg.addFilter(RedactingFilter())
