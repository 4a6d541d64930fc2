"""Atomic Parquet/text writes and streamed sinks that appear under their final name only on commit."""

from __future__ import annotations

import io
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import local_atomic, put_object
from .paths import DataPath, PathLike, as_data_path, as_given

# A streamed table that stays under this many Arrow bytes is written as one row group: byte for byte the
# file write_table_atomic writes for all its rows at once (what the shard steps wrote before they were
# streamed). A bigger one streams a row group per written table, so memory never holds more than this.
ONE_ROW_GROUP_BYTES = 64 << 20


def write_table_atomic(table: pa.Table, path: PathLike, *, schema: pa.Schema | None = None) -> Any:
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    dp = as_data_path(path)
    if dp.is_local:
        local_atomic(dp.local_path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    else:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        put_object(dp.fs, dp.path, sink.getvalue())
    return as_given(dp, path)


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

    `buffer_bytes`: tables are held (Arrow bytes) until they pass this size; a file that never passes
    it is written as ONE row group of the concatenated rows, byte for byte what
    `write_table_atomic(concat of the tables)` writes. Past it, the held tables and every later one
    are written as they come, a row group each, so memory stays bounded by the buffer.
    """

    def __init__(self, path: PathLike, schema: pa.Schema, *, compression: str = "zstd", buffer_bytes: int = 0) -> None:
        self.target = as_data_path(path)
        self.schema = schema
        self.tmp = _staging_file(self.target, ".parquet.spool")
        self.writer = pq.ParquetWriter(self.tmp, schema, compression=compression)
        self._closed = False
        self.buffer_bytes = buffer_bytes
        self._held: list[pa.Table] | None = [] if buffer_bytes > 0 else None
        self._held_bytes = 0
        self.row_groups = 0

    @property
    def streaming(self) -> bool:
        """True once rows have been written as row groups of their own (the buffer overflowed)."""
        return self._held is None

    def write_table(self, table: pa.Table) -> None:
        if self._held is None:
            self._write(table)
            return
        self._held.append(table)
        self._held_bytes += table.nbytes
        if self._held_bytes > self.buffer_bytes:
            held, self._held = self._held, None
            for t in held:
                self._write(t)

    def _write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.row_groups += 1

    def close(self) -> None:
        if self._held is not None:  # never overflowed: one row group (an empty one for no rows, as write_table does)
            whole = pa.concat_tables(self._held).combine_chunks() if self._held else self.schema.empty_table()
            self._held = []
            self._write(whole)
        self.writer.close()
        self._closed = True
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())

    def commit(self) -> None:
        if not self._closed:
            self.close()
        _publish_staged(self.tmp, self.target)

    def abort(self) -> None:
        self._held = None
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
