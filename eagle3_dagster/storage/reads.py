"""Parquet reads (local or object storage), folder listings and checksums."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any, cast

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from .paths import DataPath, PathLike, as_data_path, as_given


def parquet_file(path: PathLike) -> pq.ParquetFile:
    dp = as_data_path(path)
    if dp.is_local:
        return pq.ParquetFile(dp.path)
    return pq.ParquetFile(dp.open_input_file())


def parquet_num_rows(path: PathLike) -> int:
    return parquet_file(path).metadata.num_rows


def parquet_schema(path: PathLike) -> pa.Schema:
    return parquet_file(path).schema_arrow


def read_parquet(
    paths: PathLike | Sequence[PathLike], *, columns: Sequence[str] | None = None, n_rows: int | None = None
) -> pl.DataFrame:
    """One file or several (concatenated in the given order) as a polars frame."""
    items = [paths] if isinstance(paths, (str, os.PathLike, DataPath)) else list(paths)
    dps = [as_data_path(p) for p in items]
    if not dps:
        return pl.DataFrame()
    if len(dps) > 1 and columns is None and n_rows is None and _column_sets_differ(dps):
        # files written before a column was added to their table lack it: null there, not a schema error
        return pl.concat([read_parquet(d) for d in dps], how="diagonal_relaxed")
    if all(d.is_local for d in dps):
        files = [d.path for d in dps]
        return pl.read_parquet(
            files if len(files) > 1 else files[0], columns=list(columns) if columns else None, n_rows=n_rows
        )
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


def _column_sets_differ(dps: Sequence[DataPath]) -> bool:
    return len({tuple(parquet_schema(d).names) for d in dps}) > 1


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
    return [as_given(p, folder) for p in dp.glob(pattern)]


def read_parquet_dir(
    folder: PathLike, pattern: str = "part-*.parquet", *, schema: pa.Schema | None = None
) -> pl.DataFrame:
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
