"""Where pipeline data lives: a local folder (the default) or object storage, behind one small API.

The data directory is a path or a URI (`EAGLE3_DATA_DIR`, the `pipeline.data_dir` resource):

- a local path or `file://...`: Parquet under a folder, every write to a temporary name in the same
  folder, fsynced and renamed into place, so a reader never sees half a file and a crash never leaves
  one behind under the final name;
- `s3://bucket/prefix`, `gs://bucket/prefix`, `abfs://...`, `hdfs://...`: a pyarrow filesystem
  (`pyarrow.fs.FileSystem.from_uri`), with pyarrow's URI options, e.g.
  `s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1`. Credentials
  come from the provider's standard chain (for S3: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/
  `AWS_SESSION_TOKEN`, `AWS_PROFILE`, instance roles); a URI carrying credentials is refused, because
  the URI lands in run config, metadata and logs;
- any other fsspec protocol (`memory://`, ...), wrapped as `PyFileSystem(FSSpecHandler(...))`.

On object storage there is no rename: an object appears under its final key only when its upload
completes (one PUT, or the completion of a multipart upload), so each object is fully serialized
first (in memory, or for streamed tables in a local spool file) and then written to its final key
in one call. A crash leaves either the previous object or the new one, never a partial one; an
interrupted multipart upload stays invisible (expire them with a bucket lifecycle rule).

`DataPath` is the one type the pipeline passes around: a root (filesystem + base) and a relative
key validated segment by segment, so a join can never leave the data root (`..`, absolute parts,
backslashes and NUL are refused). Functions here also accept a plain `Path` (local, as before) and
then return a `Path`, so local callers see no difference.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import posixpath
import re
import tempfile
import threading
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Union, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

_SHARD_KEY = re.compile(r"[0-9]{4}")  # ASCII only; fullmatch (a `$` would let "0000\n" through)

# Schemes pyarrow opens itself (FileSystem.from_uri); everything else goes through fsspec.
PYARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs"})
# Query keys that would put a secret in the URI (and so in run config and logs): refused.
_SECRET_KEYS = re.compile(r"(secret|password|passwd|token|credential|access_key|account_key|sas|signature|sig$|key_id)", re.I)


class StorageError(ValueError):
    pass


# --------------------------------------------------------------------------------------- keys


def shard_key(shard: int) -> str:
    return f"{shard:04d}"


def parse_shard_key(key: str) -> int:
    """Partition keys are exactly four digits; anything else (e.g. '../x') is refused."""
    if not isinstance(key, str) or not _SHARD_KEY.fullmatch(key):
        raise StorageError(f"invalid shard partition key {key!r}: expected four digits like '0003'")
    return int(key)


def _segments(part: str) -> list[str]:
    """Validated path segments of one join argument (may hold '/'): never '..', '.', '', '\\', NUL."""
    if not isinstance(part, str):
        part = os.fspath(part)
    if part.startswith("/"):
        raise StorageError(f"path {part!r} escapes the data directory (absolute)")
    out = []
    for seg in part.split("/"):
        if seg in ("", "."):
            if part == "":
                raise StorageError("empty path component")
            continue
        if seg == ".." or "\\" in seg or "\x00" in seg:
            raise StorageError(f"path {part!r} escapes the data directory (segment {seg!r} refused)")
        out.append(seg)
    return out


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


class DataRoot:
    """A data directory: where it is (display), and a lazily opened pyarrow filesystem."""

    __slots__ = ("_base", "_display", "_fs", "local", "scheme", "uri")

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.scheme = _scheme(uri)
        self.local = self.scheme in ("", "file")
        self._fs: pafs.FileSystem | None = None
        if self.scheme == "":
            self._base = os.path.abspath(os.path.expanduser(uri))
            self._display = self._base
        elif self.scheme == "file":
            _check_uri(uri)
            parts = urlsplit(uri)
            if parts.netloc not in ("", "localhost"):
                raise StorageError(f"{redact_uri(uri)}: file:// URIs must be local (file:///abs/path)")
            if parts.query:
                raise StorageError(f"{redact_uri(uri)}: file:// URIs take no query options")
            self._base = os.path.abspath(unquote(parts.path))
            self._display = self._base
        else:
            _check_uri(uri)
            self._base = ""  # known once the filesystem is opened
            parts = urlsplit(redact_uri(uri))
            self._display = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))

    # The filesystem is opened on first use, not when settings are read (definitions load).
    @property
    def fs(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs, self._base = _open_filesystem(self.uri, self.scheme)
        return self._fs

    @property
    def base(self) -> str:
        if not self.local:
            _ = self.fs  # opens the filesystem, which fixes the base path
        return self._base

    @property
    def display(self) -> str:
        return self._display

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataRoot) and (self.uri, self._display) == (other.uri, other._display)

    def __hash__(self) -> int:
        return hash((self.uri, self._display))

    def __repr__(self) -> str:
        return f"DataRoot({self._display!r})"


_FS_CACHE: dict[str, tuple[pafs.FileSystem, str]] = {}
_FS_LOCK = threading.Lock()


def _open_filesystem(uri: str, scheme: str) -> tuple[pafs.FileSystem, str]:
    with _FS_LOCK:
        hit = _FS_CACHE.get(uri)
        if hit is not None:
            return hit
        if scheme in PYARROW_SCHEMES:
            try:
                fs, path = pafs.FileSystem.from_uri(uri)
            except (pa.ArrowException, ValueError, OSError) as e:
                raise StorageError(f"cannot open data directory {redact_uri(uri)}: {e}") from None
        else:
            try:
                import fsspec

                ffs, path = fsspec.core.url_to_fs(uri)
            except (ImportError, ValueError, OSError) as e:
                raise StorageError(f"cannot open data directory {redact_uri(uri)} through fsspec: {e}") from None
            fs = pafs.PyFileSystem(pafs.FSSpecHandler(ffs))
        path = path.rstrip("/") or path
        _FS_CACHE[uri] = (fs, path)
        return fs, path


# --------------------------------------------------------------------------------------- DataPath


class DataPath:
    """A file or folder under a data root: `root / "generations" / "shard=0003"`.

    Path-like where the pipeline needs it (`/`, name, parent, with_name, exists, glob, read/write);
    `str()` is the OS path for local data and the URI without query or credentials otherwise.
    """

    __slots__ = ("rel", "root")

    def __init__(self, root: DataRoot, rel: str = "") -> None:
        self.root = root
        self.rel = rel

    # -- construction --------------------------------------------------------------------
    def joinpath(self, *parts: str) -> DataPath:
        segs = [s for p in parts for s in _segments(p)]
        if not segs:
            return self
        rel = "/".join(([self.rel] if self.rel else []) + segs)
        return DataPath(self.root, rel)

    def __truediv__(self, part: str) -> DataPath:
        return self.joinpath(part)

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1] if self.rel else posixpath.basename(self.root.display.rstrip("/"))

    @property
    def stem(self) -> str:
        n = self.name
        i = n.rfind(".")
        return n[:i] if i > 0 else n

    @property
    def suffix(self) -> str:
        n = self.name
        i = n.rfind(".")
        return n[i:] if i > 0 else ""

    @property
    def parent(self) -> DataPath:
        if not self.rel:
            raise StorageError(f"{self}: the data directory has no parent inside it")
        return DataPath(self.root, self.rel.rsplit("/", 1)[0] if "/" in self.rel else "")

    def with_name(self, name: str) -> DataPath:
        return self.parent / name

    def relative_to(self, other: DataPath) -> str:
        if other.root != self.root or not (other.rel == "" or self.rel == other.rel or self.rel.startswith(other.rel + "/")):
            raise StorageError(f"{self} is not under {other}")
        return self.rel[len(other.rel):].lstrip("/")

    # -- identity ------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return self.root.local

    @property
    def fs(self) -> pafs.FileSystem:
        return self.root.fs

    @property
    def path(self) -> str:
        """The path inside the filesystem (an OS path when local, `bucket/key` on S3)."""
        base = self.root.base
        if not self.rel:
            return base
        return os.path.join(base, *self.rel.split("/")) if self.is_local else f"{base}/{self.rel}" if base else self.rel

    @property
    def local_path(self) -> Path:
        if not self.is_local:
            raise StorageError(f"{self} is not on the local filesystem")
        return Path(self.path)

    def __fspath__(self) -> str:
        if not self.is_local:
            raise TypeError(f"{self} is object storage, not an OS path; use eagle3_dagster.storage helpers")
        return self.path

    def __str__(self) -> str:
        if self.is_local:
            return self.path
        return f"{self.root.display}/{self.rel}" if self.rel else self.root.display

    def __repr__(self) -> str:
        return f"DataPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataPath) and self.root == other.root and self.rel == other.rel

    def __hash__(self) -> int:
        return hash((self.root, self.rel))

    def __lt__(self, other: DataPath) -> bool:
        return str(self) < str(other)

    # -- queries -------------------------------------------------------------------------
    def _info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        if self.is_local:
            return os.path.exists(self.path)
        return self._info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        if self.is_local:
            return os.path.isfile(self.path)
        return self._info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        if self.is_local:
            return os.path.isdir(self.path)
        return self._info().type == pafs.FileType.Directory

    def size(self) -> int:
        if self.is_local:
            return os.path.getsize(self.path)
        info = self._info()
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(str(self))
        return int(info.size)

    def iterdir(self) -> list[DataPath]:
        """Children (files and folders), sorted by name; empty when the folder does not exist."""
        if self.is_local:
            try:
                names = os.listdir(self.path)
            except (FileNotFoundError, NotADirectoryError):
                return []
        else:
            sel = pafs.FileSelector(self.path, recursive=False, allow_not_found=True)
            try:
                infos = self.fs.get_file_info(sel)
            except (FileNotFoundError, NotADirectoryError):
                return []
            names = [i.base_name for i in infos]
        out = []
        for n in sorted(set(names)):
            try:
                out.append(self / n)
            except StorageError:
                continue  # a name we would never write (e.g. with a backslash): not ours
        return out

    def glob(self, pattern: str) -> list[DataPath]:
        """Matches of a relative pattern, one `fnmatch` per segment ('*/manifest.json'); sorted."""
        level = [self]
        for seg in pattern.split("/"):
            if seg in ("", ".", ".."):
                raise StorageError(f"glob pattern {pattern!r} not supported")
            nxt: list[DataPath] = []
            for d in level:
                if any(c in seg for c in "*?["):
                    nxt.extend(c for c in d.iterdir() if fnmatch.fnmatchcase(c.name, seg))
                else:
                    c = d / seg
                    if c.exists():
                        nxt.append(c)
            level = nxt
        return sorted(level, key=lambda p: p.rel)

    # -- reads ---------------------------------------------------------------------------
    def open_input_file(self) -> Any:
        """A random-access file (for pyarrow.parquet.ParquetFile)."""
        if self.is_local:
            return pa.OSFile(self.path, "rb")
        return self.fs.open_input_file(self.path)

    def read_bytes(self) -> bytes:
        if self.is_local:
            return Path(self.path).read_bytes()
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def read_json(self) -> Any:
        return json.loads(self.read_bytes())

    # -- writes --------------------------------------------------------------------------
    def mkdir(self) -> None:
        """Local: create the folder (and parents). Object storage has no folders: nothing to do."""
        if self.is_local:
            os.makedirs(self.path, exist_ok=True)

    def write_bytes(self, data: bytes | pa.Buffer) -> DataPath:
        """Atomic: local tmp + fsync + rename; object storage: one upload to the final key."""
        if self.is_local:
            _local_atomic(Path(self.path), lambda tmp: tmp.write_bytes(bytes(data) if isinstance(data, pa.Buffer) else data))
        else:
            _put(self, data)
        return self

    def write_text(self, text: str, encoding: str = "utf-8") -> DataPath:
        return self.write_bytes(text.encode(encoding))

    def write_json(self, obj: Any, **kw: Any) -> DataPath:
        kw.setdefault("indent", 2)
        return self.write_text(json.dumps(obj, **kw) + "\n")

    def upload_file(self, local_file: Path) -> DataPath:
        """Put a finished local file at this key (atomic, as write_bytes)."""
        if self.is_local:
            def copy(tmp: Path) -> None:
                with open(local_file, "rb") as src, open(tmp, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
            _local_atomic(Path(self.path), copy)
        else:
            with pa.memory_map(str(local_file), "r") as mm:
                _put(self, mm.read_buffer())
        return self

    def unlink(self, missing_ok: bool = True) -> None:
        try:
            if self.is_local:
                os.unlink(self.path)
            else:
                self.fs.delete_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def rmtree(self) -> None:
        """Delete a folder (every key under the prefix) and its contents; nothing if absent."""
        if not self.rel:
            raise StorageError("refusing to delete the whole data directory")
        if self.is_local:
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)
            return
        try:
            if self._info().type == pafs.FileType.Directory:
                self.fs.delete_dir(self.path)
        except FileNotFoundError:
            pass

    def copy_to(self, dst: DataPath) -> DataPath:
        """Copy a file; atomic at the destination (local tmp + rename; object stores copy server-side)."""
        if self.is_local and dst.is_local:
            import shutil

            _local_atomic(Path(dst.path), lambda tmp: shutil.copyfile(self.path, tmp))
        elif self.root == dst.root or (not self.is_local and self.fs.equals(dst.fs)):
            self.fs.copy_file(self.path, dst.path)  # S3: CopyObject, visible only when complete
        else:
            dst.write_bytes(self.read_bytes())
        return dst


PathLike = Union[str, "os.PathLike[str]", DataPath]


def data_root(uri: str | os.PathLike[str] | DataPath) -> DataPath:
    """The data directory named by a local path or a URI (see the module docstring)."""
    if isinstance(uri, DataPath):
        return uri
    s = os.fspath(uri) if not isinstance(uri, str) else uri
    if not s:
        raise StorageError("empty data directory")
    return DataPath(DataRoot(s))


_LOCAL_ANCHOR = DataRoot(os.path.abspath(os.sep))


def as_data_path(p: PathLike) -> DataPath:
    """A DataPath for `p`: unchanged if it is one, a URI opened as a root, a local path as is."""
    if isinstance(p, DataPath):
        return p
    s = os.fspath(p)
    if _scheme(s) and not isinstance(p, Path):
        return data_root(s)
    absolute = os.path.abspath(os.path.expanduser(s))
    rel = absolute[len(_LOCAL_ANCHOR.base):].strip(os.sep).replace(os.sep, "/")
    return DataPath(_LOCAL_ANCHOR, "") if not rel else DataPath(_LOCAL_ANCHOR, rel)


def _native(result: DataPath, like: Any) -> Any:
    """Callers that passed a plain local path get a Path back (behaviour as before)."""
    if isinstance(like, DataPath) or not result.is_local:
        return result
    return result.local_path


def is_local(p: PathLike) -> bool:
    return as_data_path(p).is_local


def display(p: PathLike) -> str:
    """What logs and metadata may show: the OS path, or the URI without secrets or query."""
    return str(p) if isinstance(p, DataPath) else redact_uri(os.fspath(p))


# --------------------------------------------------------------------------------------- atomic writes


def _local_atomic(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _put(dst: DataPath, data: bytes | pa.Buffer) -> None:
    """One object, fully serialized, written to its final key in a single call.

    The object becomes visible only when the upload completes (PutObject, or the completion of a
    multipart upload after every part succeeded); nothing is ever written under a temporary key.
    Arrow's S3 stream uploads parts in the background and refuses to complete an upload whose part
    failed, so a failure leaves the previous object (or none), never a partial one.
    """
    out = dst.fs.open_output_stream(dst.path)
    out.write(data)
    out.close()


def write_table_atomic(table: pa.Table, path: PathLike, *, schema: pa.Schema | None = None) -> Any:
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    dp = as_data_path(path)
    if dp.is_local:
        _local_atomic(dp.local_path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    else:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        _put(dp, sink.getvalue())
    return _native(dp, path)


def write_frame_atomic(df: pl.DataFrame, path: PathLike, *, schema: pa.Schema | None = None) -> Any:
    table = df.to_arrow()
    if schema is not None and df.height == 0:
        table = schema.empty_table()
    return write_table_atomic(table, path, schema=schema)


def _staging_file(target: DataPath, suffix: str) -> Path:
    """Where a streamed write goes before it is published: beside the target locally (so the final
    rename is atomic on one filesystem), else a local spool file to upload in one call."""
    if target.is_local:
        final = target.local_path
        final.parent.mkdir(parents=True, exist_ok=True)
        return final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    fd, name = tempfile.mkstemp(prefix="eagle3-", suffix=suffix)
    os.close(fd)
    return Path(name)


def _publish_staged(tmp: Path, target: DataPath) -> None:
    """Put a finished, fsynced staging file under the target's final name (rename or one upload)."""
    try:
        if target.is_local:
            os.replace(tmp, target.local_path)
        else:
            target.upload_file(tmp)
    finally:
        tmp.unlink(missing_ok=True)


class ParquetSink:
    """A streamed Parquet file (ParquetWriter) that appears under its final name only on commit().

    Local: a temporary file beside the target, fsynced and renamed. Object storage: a local spool
    file (TMPDIR), uploaded in one call on commit. abort() leaves nothing behind.
    """

    def __init__(self, path: PathLike, schema: pa.Schema, *, compression: str = "zstd") -> None:
        self.target = as_data_path(path)
        self.tmp = _staging_file(self.target, ".parquet.spool")
        self.writer = pq.ParquetWriter(self.tmp, schema, compression=compression)
        self._closed = False

    def write_table(self, table: pa.Table) -> None:
        self.writer.write_table(table)

    def close(self) -> None:
        self.writer.close()
        self._closed = True
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())

    def commit(self) -> None:
        if not self._closed:
            self.close()
        _publish_staged(self.tmp, self.target)

    def abort(self) -> None:
        try:
            if not self._closed:
                self.writer.close()
        except Exception:
            pass
        self.tmp.unlink(missing_ok=True)


class TextSink:
    """Lines of text written to a local temporary file, then put at the target atomically (commit)."""

    def __init__(self, path: PathLike) -> None:
        self.target = as_data_path(path)
        self.tmp = _staging_file(self.target, ".spool")
        self.file: io.TextIOWrapper = open(self.tmp, "w", encoding="utf-8")

    def write(self, s: str) -> None:
        self.file.write(s)

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        _publish_staged(self.tmp, self.target)

    def abort(self) -> None:
        try:
            self.file.close()
        finally:
            self.tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------- reads


def parquet_file(path: PathLike) -> pq.ParquetFile:
    dp = as_data_path(path)
    if dp.is_local:
        return pq.ParquetFile(dp.path)
    return pq.ParquetFile(dp.open_input_file())


def parquet_num_rows(path: PathLike) -> int:
    return parquet_file(path).metadata.num_rows


def parquet_schema(path: PathLike) -> pa.Schema:
    return parquet_file(path).schema_arrow


def read_parquet(paths: PathLike | Sequence[PathLike], *, columns: Sequence[str] | None = None,
                 n_rows: int | None = None) -> pl.DataFrame:
    """One file or several (concatenated in the given order) as a polars frame."""
    items = [paths] if isinstance(paths, (str, os.PathLike, DataPath)) else list(paths)
    dps = [as_data_path(p) for p in items]
    if not dps:
        return pl.DataFrame()
    if all(d.is_local for d in dps):
        files = [d.path for d in dps]
        return pl.read_parquet(files if len(files) > 1 else files[0], columns=list(columns) if columns else None, n_rows=n_rows)
    frames = []
    left = n_rows
    for d in dps:
        pf = parquet_file(d)
        table = pf.read(columns=list(columns) if columns else None)
        if left is not None:
            table = table.slice(0, left)
            left -= table.num_rows
        frames.append(cast(pl.DataFrame, pl.from_arrow(table)))  # a Table gives a DataFrame
        if left is not None and left <= 0:
            break
    return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]


def scan_parquet(paths: Sequence[PathLike], *, columns: Sequence[str] | None = None) -> pl.LazyFrame:
    """A lazy frame over files: polars' scan locally; on object storage the (projected) columns read eagerly."""
    dps = [as_data_path(p) for p in paths]
    if all(d.is_local for d in dps):
        lf = pl.scan_parquet([d.path for d in dps])
        return lf.select(list(columns)) if columns else lf
    return read_parquet(dps, columns=columns).lazy()


def list_files(folder: PathLike, pattern: str) -> list[Any]:
    """Files in a folder matching a pattern, sorted by name (Path in, Paths out)."""
    dp = as_data_path(folder)
    return [_native(p, folder) for p in dp.glob(pattern)]


def read_parquet_dir(folder: PathLike, pattern: str = "part-*.parquet", *, schema: pa.Schema | None = None) -> pl.DataFrame:
    """Read every matching file in a folder (sorted by name); an empty frame with `schema` if none."""
    files = as_data_path(folder).glob(pattern)
    if not files:
        if schema is None:
            return pl.DataFrame()
        return cast(pl.DataFrame, pl.from_arrow(schema.empty_table()))
    return read_parquet(files)


def replace_dir_contents(folder: PathLike, pattern: str) -> None:
    """Remove files matching pattern before a full rewrite of a partition."""
    for f in as_data_path(folder).glob(pattern):
        f.unlink(missing_ok=True)


def sha256_of(path: PathLike) -> str:
    dp = as_data_path(path)
    h = hashlib.sha256()
    if dp.is_local:
        with open(dp.path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    else:
        with dp.fs.open_input_stream(dp.path) as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------- joins


def safe_join(root: PathLike, *parts: str) -> Any:
    """Join under root, refusing any result that escapes it (path traversal).

    A local root is resolved, symlinks included, as before; a DataPath root (any scheme) refuses
    '..', absolute parts, backslashes and NUL segment by segment.
    """
    if isinstance(root, DataPath):
        return root.joinpath(*parts)
    r = Path(root).resolve()
    p = r.joinpath(*parts).resolve()
    if p != r and r not in p.parents:
        raise StorageError(f"path {'/'.join(parts)!r} escapes the data directory {r}")
    return p


def shard_dir(data_dir: PathLike, table: str, shard: int) -> Any:
    return safe_join(data_dir, table, f"shard={shard_key(shard)}")


def iter_shard_dirs(data_dir: PathLike, table: str) -> Iterable[DataPath]:
    return as_data_path(data_dir).joinpath(table).glob("shard=*")


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


def fsspec_filesystem(fs: pafs.FileSystem) -> Any:
    """The fsspec filesystem behind a PyFileSystem(FSSpecHandler(...)), or None for a native pyarrow one."""
    handler = getattr(fs, "handler", None)
    return getattr(handler, "fs", None)
