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

from .atomic import _local_atomic, _put
from .paths import DataPath, PathLike, _native, as_data_path


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
