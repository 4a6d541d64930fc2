"""Parquet under the data directory: paths, atomic writes, safe partition keys.

Every write goes to a temporary name in the same folder and is renamed into place, so a reader
never sees half a file and a crash never leaves one behind under the final name.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

_SHARD_KEY = re.compile(r"[0-9]{4}")  # ASCII only; fullmatch (a `$` would let "0000\n" through)


class StorageError(ValueError):
    pass


def shard_key(shard: int) -> str:
    return f"{shard:04d}"


def parse_shard_key(key: str) -> int:
    """Partition keys are exactly four digits; anything else (e.g. '../x') is refused."""
    if not isinstance(key, str) or not _SHARD_KEY.fullmatch(key):
        raise StorageError(f"invalid shard partition key {key!r}: expected four digits like '0003'")
    return int(key)


def safe_join(root: Path, *parts: str) -> Path:
    """Join under root, refusing any result that escapes it (path traversal)."""
    root = root.resolve()
    p = root.joinpath(*parts).resolve()
    if p != root and root not in p.parents:
        raise StorageError(f"path {'/'.join(parts)!r} escapes the data directory {root}")
    return p


def shard_dir(data_dir: Path, table: str, shard: int) -> Path:
    return safe_join(data_dir, table, f"shard={shard_key(shard)}")


def write_table_atomic(table: pa.Table, path: Path, *, schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_frame_atomic(df: pl.DataFrame, path: Path, *, schema: pa.Schema | None = None) -> Path:
    table = df.to_arrow()
    if schema is not None and df.height == 0:
        table = schema.empty_table()
    return write_table_atomic(table, path, schema=schema)


def read_parquet_dir(folder: Path, pattern: str = "part-*.parquet", *, schema: pa.Schema | None = None) -> pl.DataFrame:
    """Read every matching file in a folder (sorted by name); an empty frame with `schema` if none."""
    files = sorted(folder.glob(pattern)) if folder.exists() else []
    if not files:
        if schema is None:
            return pl.DataFrame()
        return pl.from_arrow(schema.empty_table())  # type: ignore[return-value]
    return pl.read_parquet(files)


def replace_dir_contents(folder: Path, pattern: str) -> None:
    """Remove files matching pattern before a full rewrite of a partition."""
    if folder.exists():
        for f in folder.glob(pattern):
            f.unlink()
