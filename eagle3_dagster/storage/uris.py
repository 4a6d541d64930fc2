"""URIs of data directories and prompt files: schemes, validation, and what logs may show."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

# Schemes pyarrow opens itself (FileSystem.from_uri); everything else goes through fsspec.
PYARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs"})
# Query keys that would put a secret in the URI (and so in run config and logs): refused.
_SECRET_KEYS = re.compile(
    r"(secret|password|passwd|token|credential|access_key|account_key|sas|signature|sig$|key_id)", re.I
)


class StorageError(ValueError):
    pass


# --------------------------------------------------------------------------------------- URIs


def _scheme(uri: str) -> str:
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", uri)
    return m.group(1).lower() if m else ""


def redact_uri(uri: str) -> str:
    """The URI without anything secret: no user-info, no credential-like query parameters."""
    if not _scheme(uri):
        return uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return f"{_scheme(uri)}://<unparsable>"
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not _SECRET_KEYS.search(k)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _check_uri(uri: str) -> None:
    parts = urlsplit(uri)
    if parts.username or parts.password or "@" in parts.netloc:
        raise StorageError(
            f"{redact_uri(uri)}: credentials in the data URI are refused (they would be stored in run config and "
            "logs); use the provider's environment variables, e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
        )
    for k, _ in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_KEYS.search(k):
            raise StorageError(
                f"{redact_uri(uri)}: query parameter {k!r} looks like a credential; credentials come from the "
                "environment only (e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
            )
    for seg in unquote(parts.path).split("/"):
        if seg == ".." or "\\" in seg or "\x00" in seg:
            raise StorageError(f"{redact_uri(uri)}: '..' (or '\\', NUL) in the data URI is refused")
    if parts.fragment:
        raise StorageError(f"{redact_uri(uri)}: a '#fragment' in the data URI is not supported")


# --------------------------------------------------------------------------------------- URIs of other files
# Small public helpers for code that reads files named by a URI outside the data directory (the
# prompt-source files of eagle3_dagster/ingest): the same validation and display rules as above.


def uri_scheme(uri: str) -> str:
    """The URI's scheme in lower case ('s3', 'memory', 'file'), or '' for a plain path."""
    return _scheme(uri)


def check_uri(uri: str) -> None:
    """Raise StorageError for a URI carrying credentials (user-info or a credential-like query key),
    a '..' / backslash / NUL segment, or a '#fragment' (the rules of the data-directory URI)."""
    _check_uri(uri)


def display_uri(uri: str) -> str:
    """What logs, metadata and lineage may show: scheme://host/path, no user-info, no query at all."""
    if not _scheme(uri):
        return uri
    try:
        parts = urlsplit(redact_uri(uri))
    except ValueError:
        return f"{_scheme(uri)}://<unparsable>"
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
