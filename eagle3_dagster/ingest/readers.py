"""Stream records out of data files, detecting the container by content, not by file name.

Containers: JSON Lines, a JSON array, a single JSON object, Parquet; any of the JSON ones may be
gzip-compressed. Detection (`sniff_container`): Parquet by its `PAR1` magic; then, after an optional
UTF-8 BOM and whitespace, text whose first line is a complete JSON value followed by more lines is
JSON Lines (so BFCL's `.json` that is really JSONL works), text starting with `[` otherwise is a
JSON array, and a `{` document that spans lines is one record.

Each record comes out as a `RawRecord` with its 1-based row (line number for JSON Lines, record index
for arrays and Parquet). Per-record problems (bad JSON, bad UTF-8, too large) are carried on the
record, never raised, so one bad row cannot stop a file. Whole-file problems (missing, unreadable,
corrupt Parquet) raise `IngestFileError` naming the file.

Blank lines in JSON Lines are not records and are skipped (they still count for line numbers).
In a JSON array, a malformed or oversized element becomes one reject and reading resumes after
it (its end is found by matching brackets and strings). When the array cannot be followed any
further (missing comma, file ends inside a record), the records before the break are kept, the
break becomes one `not_json` reject at the next record index, and reading that file stops.

A file is a local `Path` or, for a source named by a URI, a remote `storage.DataPath` (remote.py):
the same detection and parsing, over a streamed, buffered remote input (Parquet: a random-access
remote file), so rows and reject reasons are the same wherever the file lives.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import pyarrow.parquet as pq

from ..storage import DataPath
from .errors import IngestFileError
from .remote import SourceFile, open_remote_binary

_BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20
_EXCERPT = 200  # bytes of UTF-8 in a reject's excerpt, the cut mark included
EXCERPT_CUT_MARK = "…[cut]"


@dataclass
class RawRecord:
    row: int
    value: Any = None  # the parsed record (when error is None)
    error: tuple[str, str] | None = None  # (reason, detail) for a row that failed before parsing
    raw: str | bytes | None = None  # the row's raw text, for the excerpt
    parsed_row: bool = False  # Parquet: value came from columns (excerpt = JSON of it)

    def excerpt(self) -> str:
        if self.raw is None:
            text = json.dumps(self.value, ensure_ascii=False, default=str) if self.parsed_row else ""
        elif isinstance(self.raw, bytes):
            text = self.raw[: _EXCERPT * 4].decode("utf-8", errors="backslashreplace")
        else:
            text = self.raw[: _EXCERPT * 2]
        return cut_utf8(safe_text(text), _EXCERPT)


def cut_utf8(text: str, max_bytes: int) -> str:
    """`text` if its UTF-8 is at most `max_bytes`, else its head cut on a character boundary and
    ended with EXCERPT_CUT_MARK, all within `max_bytes` (so an arbitrary file's long lines are never
    copied whole into rejects.parquet, and a cut excerpt says so)."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    room = max_bytes - len(EXCERPT_CUT_MARK.encode("utf-8"))
    # `data` is valid UTF-8, so "ignore" drops only the character the cut went through
    return data[:room].decode("utf-8", errors="ignore") + EXCERPT_CUT_MARK


def safe_text(text: str) -> str:
    """Make any str storable as UTF-8 (lone surrogates become \\udcxx escapes)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def _open_binary(path: SourceFile) -> IO[bytes]:
    if isinstance(path, DataPath):
        return open_remote_binary(path)
    try:
        f: IO[bytes] = open(path, "rb")
    except FileNotFoundError:
        raise IngestFileError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise IngestFileError(f"{path}: is a directory, not a data file") from None
    except OSError as e:
        raise IngestFileError(f"{path}: cannot open: {e.strerror or e}") from None
    if f.read(2) == _GZIP_MAGIC:
        f.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def sniff_container(path: SourceFile) -> str:
    """'parquet' | 'jsonl' | 'json_array' | 'json_document' (an empty file is 'jsonl')."""
    try:
        with _open_binary(path) as f:
            head = f.read(_CHUNK)
    except (OSError, EOFError) as e:
        raise IngestFileError(f"{path}: cannot read: {e}") from None
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(_BOM):
        head = head[len(_BOM) :]
    body = head.lstrip()
    if not body:
        return "jsonl"
    first = body[:1]
    newline = body.find(b"\n")
    first_line = body if newline < 0 else body[:newline]
    rest_blank = newline < 0 or not body[newline:].strip()
    if first in (b"[", b"{"):
        first_line_ok = _parses(first_line)
        if first_line_ok and not rest_blank:
            return "jsonl"
        if first == b"[":
            return "json_array"
        if first_line_ok:
            return "jsonl"  # a one-line file holding one object
        # A multi-line object: one pretty-printed record, unless the lines are broken JSONL rows.
        if _whole_file_parses(path):
            return "json_document"
        return "jsonl"
    return "jsonl"


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
        return True
    except (ValueError, RecursionError):
        return False


def _whole_file_parses(path: SourceFile) -> bool:
    with _open_binary(path) as f:
        return _parses(f.read())


def _local_version(path: SourceFile) -> tuple[int, int, int] | None:
    """(size, mtime ns, inode) of a local file; None for object storage (its reads are one version)."""
    if isinstance(path, DataPath):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def iter_records(path: SourceFile, *, max_bytes: int) -> Iterator[RawRecord]:
    """Every record of one file. A local file that changed while it was read (size, mtime or inode differ
    at the end) raises IngestFileError: the records read may mix two versions or stop half-way."""
    before = _local_version(path)
    container = sniff_container(path)
    if container == "parquet":
        yield from _iter_parquet(path, max_bytes=max_bytes)
    elif container == "json_array":
        yield from _iter_json_array(path, max_bytes=max_bytes)
    elif container == "json_document":
        yield from _iter_json_document(path, max_bytes=max_bytes)
    else:
        yield from _iter_jsonl(path, max_bytes=max_bytes)
    after = _local_version(path)
    if before is not None and after != before:
        was = f"{before[0]:,} bytes"
        now = "gone" if after is None else f"{after[0]:,} bytes" + (", replaced" if after[2] != before[2] else "")
        raise IngestFileError(
            f"{path}: changed while it was read ({was} when the read started, {now} at its end, modified "
            "meanwhile): the rows read may mix two versions of the file or stop half-way; nothing of this "
            "source was written (the previous outputs stay): rerun once the writer has finished"
        )


def _iter_jsonl(path: SourceFile, *, max_bytes: int) -> Iterator[RawRecord]:
    with _open_binary(path) as f:
        line_no = 0
        while True:
            try:
                # Bounded read: a 1 GB line must not be pulled into memory to be rejected.
                line = f.readline(max_bytes + 2)
            except (OSError, EOFError) as e:
                raise IngestFileError(f"{path}: read failed after line {line_no}: {e}") from None
            if not line:
                return
            line_no += 1
            if line_no == 1 and line.startswith(_BOM):
                line = line[len(_BOM) :]
            payload = line.rstrip(b"\r\n")
            if len(payload) > max_bytes:
                size = len(line)
                while not line.endswith(b"\n"):
                    line = f.readline(_CHUNK)
                    if not line:
                        break
                    size += len(line)
                yield RawRecord(
                    line_no,
                    error=("too_large", f"line is {size} bytes, over max_bytes={max_bytes}"),
                    raw=payload[: _EXCERPT * 4],
                )
                continue
            if not payload.strip():
                continue
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError as e:
                yield RawRecord(
                    line_no, error=("invalid_utf8", f"byte {e.start} of the line is not UTF-8"), raw=payload
                )
                continue
            try:
                value = json.loads(text)
            except RecursionError:
                yield RawRecord(line_no, error=("not_json", "JSON nested too deeply"), raw=text)
                continue
            except ValueError as e:
                yield RawRecord(line_no, error=("not_json", f"invalid JSON: {e}"), raw=text)
                continue
            yield RawRecord(line_no, value=value, raw=text)


def _iter_json_document(path: SourceFile, *, max_bytes: int) -> Iterator[RawRecord]:
    with _open_binary(path) as f:
        data = f.read()
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    if len(data.strip()) > max_bytes:
        yield RawRecord(
            1, error=("too_large", f"record is {len(data)} bytes, over max_bytes={max_bytes}"), raw=data[: _EXCERPT * 4]
        )
        return
    try:
        yield RawRecord(1, value=json.loads(data.decode("utf-8")), raw=data)
    except UnicodeDecodeError as e:
        yield RawRecord(1, error=("invalid_utf8", f"byte {e.start} is not UTF-8"), raw=data)
    except (ValueError, RecursionError) as e:
        yield RawRecord(1, error=("not_json", f"invalid JSON: {e}"), raw=data)


class _TextBuffer:
    """Incrementally decoded text of a file; invalid UTF-8 bytes survive as lone surrogates."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self.text = ""
        self.eof = False

    def more(self) -> bool:
        if self.eof:
            return False
        chunk = self._f.read(_CHUNK)
        if not chunk:
            self.eof = True
            self.text += self._decoder.decode(b"", final=True)
            return False
        self.text += self._decoder.decode(chunk)
        return True

    def skip_ws(self, pos: int) -> int:
        while True:
            n = len(self.text)
            while pos < n and self.text[pos] in " \t\r\n":
                pos += 1
            if pos < n or not self.more():
                return pos

    def compact(self, pos: int) -> int:
        """Drop consumed text so memory stays at about one record plus one chunk."""
        if pos > _CHUNK:
            self.text = self.text[pos:]
            return 0
        return pos


def _iter_json_array(path: SourceFile, *, max_bytes: int) -> Iterator[RawRecord]:
    decoder = json.JSONDecoder()
    with _open_binary(path) as f:
        buf = _TextBuffer(f)
        buf.more()
        if buf.text.startswith("\ufeff"):
            buf.text = buf.text[1:]
        pos = buf.skip_ws(0)
        pos += 1  # the '[' (sniff_container checked it)
        index = 0
        while True:
            pos = buf.compact(pos)
            pos = buf.skip_ws(pos)
            if pos >= len(buf.text):
                yield RawRecord(
                    index + 1, error=("not_json", "the JSON array ends without ']' (file truncated?)"), raw=""
                )
                return
            if buf.text[pos] == "]":
                break  # the end (a trailing comma before it is tolerated: it holds no record)
            index += 1
            start = pos
            value, end, problem, raw = _decode_element(decoder, buf, start, max_bytes)
            if problem is not None:
                yield RawRecord(index, error=problem, raw=raw)
                if end < 0:
                    return
            elif _has_surrogate_escape(raw):
                yield RawRecord(index, error=("invalid_utf8", "record holds bytes that are not UTF-8"), raw=raw)
            elif len(raw.encode("utf-8", errors="surrogateescape")) > max_bytes:
                yield RawRecord(
                    index, error=("too_large", f"record is over max_bytes={max_bytes}"), raw=raw[: _EXCERPT * 2]
                )
            else:
                yield RawRecord(index, value=value, raw=raw)
            pos = buf.skip_ws(end)
            if pos < len(buf.text) and buf.text[pos] == ",":
                pos += 1
                continue
            if pos < len(buf.text) and buf.text[pos] == "]":
                break
            got = buf.text[pos : pos + 20]
            yield RawRecord(
                index + 1, error=("not_json", f"expected ',' or ']' after record {index}, found {got!r}"), raw=got
            )
            return
        pos = buf.skip_ws(pos + 1)
        if pos < len(buf.text):
            tail = buf.text[pos : pos + _EXCERPT]
            yield RawRecord(index + 1, error=("not_json", "unexpected data after the end of the JSON array"), raw=tail)


def _has_surrogate_escape(raw: str) -> bool:
    try:
        raw.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _decode_element(
    decoder: json.JSONDecoder, buf: _TextBuffer, start: int, max_bytes: int
) -> tuple[Any, int, tuple[str, str] | None, str]:
    """Decode one array element at `start`, reading more of the file while it is incomplete.

    Returns (value, end, problem, raw text or excerpt). For a bad or oversized element the end is
    found by a bracket/string-aware scan so reading can go on after it; end is -1 when the file
    ends inside the element (then nothing after it can be read).
    """
    while True:
        try:
            value, end = decoder.raw_decode(buf.text, start)
        except RecursionError:
            problem = ("not_json", "JSON nested too deeply")
        except ValueError as e:
            # Incomplete or malformed: only more text can tell, up to the row size limit.
            if len(buf.text) - start <= max_bytes + _CHUNK and buf.more():
                continue
            if len(buf.text) - start > max_bytes:
                problem = ("too_large", f"record is over max_bytes={max_bytes} (not parsed)")
            else:
                problem = ("not_json", f"invalid JSON in the array: {e}")
        else:
            # A number can stop at the buffer's end only because the chunk ended; read on and retry.
            if end >= len(buf.text) and buf.more():
                continue
            return value, end, None, buf.text[start:end]
        excerpt = buf.text[start : start + _EXCERPT * 2]
        end = _skip_value(buf, start)
        if end < 0:
            return (
                None,
                -1,
                (problem[0], problem[1] + "; the file ends inside this record, so reading stopped"),
                excerpt,
            )
        return None, end, problem, excerpt


def _skip_value(buf: _TextBuffer, pos: int) -> int:
    """Position just after the JSON value starting at `pos` (by brackets and strings), or -1 at EOF.

    Scanned text is dropped as it goes, so an oversized record costs one chunk of memory.
    """
    depth = 0
    in_string = False
    escaped = False
    while True:
        text = buf.text
        for i in range(pos, len(text)):
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
                    if depth == 0:
                        return i + 1
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                if depth == 0:
                    return i  # a bare scalar ends where the array does
                depth -= 1
                if depth == 0:
                    return i + 1
            elif depth == 0 and ch == ",":
                return i  # a bare scalar ends at the comma
        buf.text = ""
        pos = 0
        if not buf.more():
            return -1


def _iter_parquet(path: SourceFile, *, max_bytes: int) -> Iterator[RawRecord]:
    remote = None
    try:
        if isinstance(path, DataPath):
            remote = path.open_input_file()  # random access: footer first, then row groups as read
            pf = pq.ParquetFile(remote)
        else:
            pf = pq.ParquetFile(path)
    except IngestFileError:
        raise
    except Exception as e:  # pyarrow raises several types for a corrupt file
        if remote is not None:
            remote.close()
        raise IngestFileError(f"{path}: not a readable Parquet file: {e}") from None
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=2048):
            for value in batch.to_pylist():
                row += 1
                # Size as JSON text, the same measure the JSON containers use.
                size = len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", errors="surrogatepass"))
                if size > max_bytes:
                    yield RawRecord(
                        row,
                        error=("too_large", f"row is {size} bytes as JSON, over max_bytes={max_bytes}"),
                        value=value,
                        parsed_row=True,
                    )
                else:
                    yield RawRecord(row, value=value, parsed_row=True)
    except IngestFileError:
        raise
    except Exception as e:
        raise IngestFileError(f"{path}: Parquet read failed after row {row}: {e}") from None
    finally:
        if remote is not None:
            remote.close()
