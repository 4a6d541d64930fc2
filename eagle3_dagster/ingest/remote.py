"""Prompt-source files named by a URI: s3://, gs://, abfs://, hdfs:// (pyarrow), any fsspec protocol
(memory://, ...), and file:// (read as the local path it names).

A source YAML's `path` may be such a URI, with a glob in its path part:

    path: s3://prompts-bucket/ultrachat/*.jsonl.gz?endpoint_override=minio:9000&scheme=http&region=us-east-1
    path: s3://prompts-bucket/sets/**/*.parquet?region=eu-west-1
    path: memory://tests/prompts/part-[0-9].jsonl

The filesystem is opened exactly like the data directory (eagle3_dagster/storage/): pyarrow's URI
options in the query, credentials only from the environment (a URI carrying credentials is refused
when the YAML is loaded), and what is shown anywhere (lineage `source_file`, errors, metadata,
logs) is the URI without its query: `s3://prompts-bucket/ultrachat/part-0001.jsonl.gz`.

Globs: the path is split at the first segment holding `*` or `[`; the part before it is listed
(recursively only when the pattern has more than one segment or a `**`), and every file whose key
matches segment by segment is read, sorted by key, so the order is deterministic. The rules follow
`glob.glob(..., recursive=True)` on a local disk: `*` and `[...]` stay inside one segment, `**`
spans zero or more folders, and names starting with `.` match only a pattern segment starting with
`.`. `?` cannot be a wildcard in a URI (it starts the query). Globs in the bucket/host are refused.

Reads stream from the store: JSON Lines, JSON arrays and gzip through a buffered input stream
(about one 4 MiB buffer per open file), Parquet through a random-access file whose row groups are
fetched as they are read. Nothing is downloaded whole.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs

from ..storage import (
    PYARROW_SCHEMES,
    DataPath,
    StorageError,
    check_uri,
    data_root,
    display_uri,
    fsspec_filesystem,
    redact_uri,
    uri_scheme,
)
from .errors import IngestFileError

# A data file of a source: a local Path (as always) or a DataPath on a remote filesystem.
SourceFile = Path | DataPath

_GZIP_MAGIC = b"\x1f\x8b"
_REMOTE_BUFFER = 4 << 20
_WILDCARDS = "*["


def is_uri(path: str) -> bool:
    return bool(uri_scheme(path))


def is_remote(path: str) -> bool:
    """A URI read through a pyarrow/fsspec filesystem (file:// is local and read as a local path)."""
    return uri_scheme(path) not in ("", "file")


def validate_source_uri(path: str) -> str | None:
    """What is wrong with a source URI (None when fine); checked when the YAML is loaded."""
    try:
        check_uri(path)
        parts = urlsplit(path)
    except (StorageError, ValueError) as e:
        return f"path: {_shown(e, path)}"
    scheme = uri_scheme(path)
    shown = display_uri(path)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return f"path {shown}: file:// URIs must be local (file:///abs/path)"
        if parts.query:
            return f"path {shown}: file:// URIs take no query options"
        return None
    if any(c in parts.netloc for c in _WILDCARDS + "?"):
        return f"path {shown}: a glob in the bucket or host name is not supported"
    if not [s for s in parts.path.split("/") if s]:
        return f"path {shown}: names a bucket or host, not a file or a glob"
    if scheme not in PYARROW_SCHEMES:
        try:
            import fsspec

            known = scheme in fsspec.available_protocols()
        except ImportError:
            known = False
        if not known:
            return f"path {shown}: unknown URI scheme {scheme!r} (pyarrow: {', '.join(sorted(PYARROW_SCHEMES))}; or an fsspec protocol)"
    return None


def file_uri_to_path(path: str) -> str:
    """file:///abs/x/*.jsonl -> /abs/x/*.jsonl (percent-decoded)."""
    return unquote(urlsplit(path).path)


@dataclass(frozen=True)
class RemotePattern:
    uri: str  # as written in the YAML (may hold pyarrow options in the query)
    root_uri: str  # scheme://host/<segments before the first wildcard>?<query>: the folder listed
    pattern: str  # the rest of the path, relative to root_uri (percent-decoded)
    is_glob: bool

    @property
    def display(self) -> str:
        return display_uri(self.uri)


def split_remote(uri: str) -> RemotePattern:
    parts = urlsplit(uri)
    segs = [s for s in parts.path.split("/") if s]
    first = next((i for i, s in enumerate(segs) if any(c in s for c in _WILDCARDS)), None)
    is_glob = first is not None
    cut = first if is_glob else len(segs) - 1
    static, rest = segs[:cut], segs[cut:]
    root_uri = urlunsplit((parts.scheme, parts.netloc, "/" + "/".join(static) if static else "", parts.query, ""))
    return RemotePattern(uri=uri, root_uri=root_uri, pattern="/".join(unquote(s) for s in rest), is_glob=is_glob)


def _match(names: list[str], pats: list[str]) -> bool:
    """glob.glob(recursive=True) semantics on '/'-separated keys (see the module docstring)."""
    if not pats:
        return not names
    p = pats[0]
    if p == "**":
        return _match(names, pats[1:]) or (bool(names) and not names[0].startswith(".") and _match(names[1:], pats))
    if not names:
        return False
    n = names[0]
    if n.startswith(".") and not p.startswith("."):
        return False
    return fnmatchcase(n, p) and _match(names[1:], pats[1:])


def _relative(path: str, base: str) -> str | None:
    base = base.rstrip("/")
    if not base:
        return path.lstrip("/")
    if path.startswith(base + "/"):
        return path[len(base) + 1 :]
    return None


def _open_root(rp: RemotePattern, source: str) -> DataPath:
    try:
        root = data_root(rp.root_uri)
        _ = root.fs  # opens the filesystem now, so a bad URI is reported here
        return root
    except StorageError as e:
        raise IngestFileError(f"source {source!r}: {rp.display}: {_shown(e, rp.root_uri)}") from None


def _shown(e: Exception, uri: str) -> str:
    """An error message with the URI in its display form (storage errors quote it with its query)."""
    return str(e).replace(redact_uri(uri), display_uri(uri))


def list_remote(uri: str, source: str, *, allow_empty: bool = False) -> list[tuple[DataPath, pafs.FileInfo]]:
    """The files a remote path or glob names, sorted by key, each with its FileInfo (size, mtime).

    Raises IngestFileError naming the source and the (display-safe) pattern when a plain path is
    missing or a folder, or (unless allow_empty) when a glob matches nothing.
    """
    rp = split_remote(uri)
    root = _open_root(rp, source)
    fs = root.fs
    try:
        if not rp.is_glob:
            try:
                f = root.joinpath(rp.pattern)
            except StorageError as e:
                raise IngestFileError(f"source {source!r}: {rp.display}: {e}") from None
            info = fs.get_file_info(f.path)
            if info.type == pafs.FileType.NotFound:
                if allow_empty:
                    return []
                raise IngestFileError(f"source {source!r}: file not found: {rp.display}")
            if info.type == pafs.FileType.Directory:
                if allow_empty:
                    return []
                raise IngestFileError(f"source {source!r}: {rp.display} is a directory; give a file or a glob")
            return [(f, info)]
        pats = rp.pattern.split("/")
        recursive = len(pats) > 1 or "**" in pats
        base = root.path
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=recursive, allow_not_found=True))
    except IngestFileError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise IngestFileError(f"source {source!r}: cannot list {rp.display}: {e}") from None
    found: list[tuple[str, pafs.FileInfo]] = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue  # folders, and the zero-byte "folder/" markers some S3 tools leave
        rel = _relative(info.path, base)
        if rel is not None and _match(rel.split("/"), pats):
            found.append((rel, info))
    if not found:
        if allow_empty:
            return []
        raise IngestFileError(f"source {source!r}: no file matches {rp.display!r} (pattern {rp.display})")
    out = []
    for rel, info in sorted(found, key=lambda x: x[0]):
        try:
            out.append((root.joinpath(rel), info))
        except StorageError as e:
            raise IngestFileError(f"source {source!r}: {rp.display}: cannot read key {rel!r}: {e}") from None
    return out


def remote_files(uri: str, source: str) -> list[DataPath]:
    return [f for f, _ in list_remote(uri, source)]


# --------------------------------------------------------------------------------------- change detection

_VERSION_KEYS = (
    "ETag",
    "etag",
    "md5",
    "generation",
    "version_id",
    "VersionId",
    "mtime",
    "LastModified",
    "last_modified",
    "updated",
    "created",
)


def file_version(f: DataPath, info: pafs.FileInfo) -> str:
    """`<display uri>:<size>:<mtime ns>[:<store version fields>]` for the source-change sensor.

    pyarrow filesystems (s3://, gs://, ...) report size and mtime (S3: LastModified, whole seconds).
    For fsspec filesystems the store's own version fields (ETag, md5, generation, mtime/created, ...)
    are added when its `info()` has them.
    """
    mtime = info.mtime_ns if info.mtime is not None else ""
    line = f"{f}:{info.size}:{mtime}"
    ffs = fsspec_filesystem(f.fs)
    if ffs is not None:
        try:
            raw = ffs.info(f.path)
        except Exception:  # the listing's size is still there
            raw = {}
        extra = [f"{k}={raw[k]}" for k in _VERSION_KEYS if raw.get(k) is not None]
        if extra:
            line += ":" + ",".join(extra)
    return line


# --------------------------------------------------------------------------------------- reading


class _ArrowRaw(io.RawIOBase):
    """A pyarrow input stream as a raw Python stream (for io.BufferedReader / gzip)."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._f.read(len(b))
        n = len(data)
        b[:n] = data
        return n

    def close(self) -> None:
        try:
            if not self.closed:
                self._f.close()
        finally:
            super().close()


class _GzipStream(gzip.GzipFile):
    """gzip over a buffered remote stream; closing it closes the stream too."""

    def __init__(self, inner: IO[bytes]) -> None:
        super().__init__(fileobj=inner, mode="rb")
        self._inner = inner

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._inner.close()


def open_remote_binary(f: DataPath) -> IO[bytes]:
    """A streamed, buffered binary reader of a remote file, gunzipped when it starts with gzip's magic."""
    try:
        # compression=None: pyarrow would otherwise decompress by file extension (.gz, .zst, .bz2);
        # the readers detect gzip by content, as for a local file, so the bytes must come raw.
        stream = f.fs.open_input_stream(f.path, compression=None)
    except FileNotFoundError:
        raise IngestFileError(f"{f}: file not found") from None
    except IsADirectoryError:
        raise IngestFileError(f"{f}: is a directory, not a data file") from None
    except (OSError, pa.ArrowException) as e:
        raise IngestFileError(f"{f}: cannot open: {e}") from None
    buf = io.BufferedReader(_ArrowRaw(stream), buffer_size=_REMOTE_BUFFER)
    try:
        head = buf.peek(2)[:2]
    except (OSError, pa.ArrowException) as e:
        buf.close()
        raise IngestFileError(f"{f}: cannot open: {e}") from None
    if head == _GZIP_MAGIC:
        return _GzipStream(buf)  # type: ignore[return-value]
    return buf
