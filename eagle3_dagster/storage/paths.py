"""`DataPath`: a file or folder under a data root (local folder or object store), traversal-safe."""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import threading
from pathlib import Path
from typing import Any, Union
from urllib.parse import unquote, urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs

from .atomic import local_atomic, put_object
from .uris import PYARROW_SCHEMES, StorageError, _check_uri, _scheme, redact_uri


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
        if other.root != self.root or not (
            other.rel == "" or self.rel == other.rel or self.rel.startswith(other.rel + "/")
        ):
            raise StorageError(f"{self} is not under {other}")
        return self.rel[len(other.rel) :].lstrip("/")

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
            local_atomic(
                Path(self.path), lambda tmp: tmp.write_bytes(bytes(data) if isinstance(data, pa.Buffer) else data)
            )
        else:
            put_object(self.fs, self.path, data)
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

            local_atomic(Path(self.path), copy)
        else:
            with pa.memory_map(str(local_file), "r") as mm:
                put_object(self.fs, self.path, mm.read_buffer())
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

            local_atomic(Path(dst.path), lambda tmp: shutil.copyfile(self.path, tmp))
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
    rel = absolute[len(_LOCAL_ANCHOR.base) :].strip(os.sep).replace(os.sep, "/")
    return DataPath(_LOCAL_ANCHOR, "") if not rel else DataPath(_LOCAL_ANCHOR, rel)


def as_given(result: DataPath, like: Any) -> Any:
    """`result` in the kind of path the caller gave: a plain local path gets a Path back, a DataPath a DataPath."""
    if isinstance(like, DataPath) or not result.is_local:
        return result
    return result.local_path


def is_local(p: PathLike) -> bool:
    return as_data_path(p).is_local


def display(p: PathLike) -> str:
    """What logs and metadata may show: the OS path, or the URI without secrets or query."""
    return str(p) if isinstance(p, DataPath) else redact_uri(os.fspath(p))


def fsspec_filesystem(fs: pafs.FileSystem) -> Any:
    """The fsspec filesystem behind a PyFileSystem(FSSpecHandler(...)), or None for a native pyarrow one."""
    handler = getattr(fs, "handler", None)
    return getattr(handler, "fs", None)
