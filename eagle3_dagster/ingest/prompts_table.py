"""The prompts table (prompts/prompts.parquet), laid out so that one shard's rows are read without the rest.

`combine_sources` writes it through `ShardSortedWriter`; every step that needs one shard's prompts (the
tokenize step, the all_turns conversations of the generate step, the training lookups) reads them through
`shard_prompts`.

Layout: the accepted rows are held (up to HELD_BYTES of Arrow data at a time) and written sorted by shard,
stable (within a shard, in the order they were accepted), cut into row groups at shard boundaries: a row group
holds one shard's rows (at most GROUP_ROWS), or, where the held rows are spread over many small shards,
several consecutive shards with MIN_GROUP_ROWS rows or more in all. The `shard` column's statistics of a row
group (min, max) thus name the shards it can hold, and `shard_prompts` reads only the row groups whose range
holds its shard (and keeps only that shard's rows of them). A table written in acceptance order (every shard in
every row group, as before this layout) is read the same, only not faster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..storage import DataPath, ParquetSink, PathLike, parquet_file

SHARD = "shard"
GROUP_ROWS = 8192  # rows of a row group at most (and the rows held in Python objects before they become Arrow)
MIN_GROUP_ROWS = 256  # consecutive small shards share a row group until it has this many rows
HELD_BYTES = 32 << 20  # Arrow bytes held before they are sorted by shard and written
READ_ROWS = 4096  # rows a slice `shard_prompts` yields (at least, but the last)


def row_group_bounds(run_lengths: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(offset, rows) of each row group, given the lengths of the shard runs of rows sorted by shard: a shard's
    run ends its row group once the group has MIN_GROUP_ROWS rows; no group has more than GROUP_ROWS."""
    start = size = 0
    for n in run_lengths:
        if size >= MIN_GROUP_ROWS:
            yield start, size
            start, size = start + size, 0
        size += n
        while size > GROUP_ROWS:
            yield start, GROUP_ROWS
            start, size = start + GROUP_ROWS, size - GROUP_ROWS
    if size:
        yield start, size


def _run_lengths(sorted_shards: np.ndarray) -> np.ndarray:
    if sorted_shards.size == 0:
        return np.empty(0, dtype=np.int64)
    edges = np.flatnonzero(np.diff(sorted_shards)) + 1
    return np.diff(np.concatenate(([0], edges, [sorted_shards.size])))


class ShardSortedWriter:
    """The prompts table, written a row at a time, appearing under its final name only on commit() (storage's
    ParquetSink); rows are held and written sorted by shard, in row groups the reader can pick (the module's
    docstring). Memory: HELD_BYTES of Arrow data and GROUP_ROWS rows of Python objects."""

    def __init__(self, path: DataPath, schema: pa.Schema, *, held_bytes: int = HELD_BYTES) -> None:
        if SHARD not in schema.names:
            raise ValueError(f"{path}: a table sorted by shard needs a {SHARD!r} column, got {schema.names}")
        self.path = path
        self.schema = schema
        self.held_bytes = held_bytes
        self._sink = ParquetSink(path, schema, compression="zstd")
        self._columns: dict[str, list[Any]] = {n: [] for n in schema.names}
        self._pending = 0
        self._held: list[pa.Table] = []
        self._held_size = 0
        self.rows = 0
        self.row_groups = 0

    def add(self, row: dict[str, Any]) -> None:
        for name, values in self._columns.items():
            values.append(row[name])
        self._pending += 1
        if self._pending >= GROUP_ROWS:
            self._hold()

    def _hold(self) -> None:
        if not self._pending:
            return
        table = pa.table(self._columns, schema=self.schema)
        self._columns = {n: [] for n in self.schema.names}
        self._pending = 0
        self._held.append(table)
        self._held_size += table.nbytes
        if self._held_size >= self.held_bytes:
            self._write_held()

    def _write_held(self) -> None:
        if not self._held:
            return
        table = pa.concat_tables(self._held)
        self._held, self._held_size = [], 0
        table = table.take(pc.sort_indices(table, sort_keys=[(SHARD, "ascending")]))  # a stable sort
        shards = table.column(SHARD).to_numpy(zero_copy_only=False)
        for start, rows in row_group_bounds(_run_lengths(shards).tolist()):
            self._sink.write_table(table.slice(start, rows))
            self.row_groups += 1
        self.rows += table.num_rows

    def close(self) -> None:
        self._hold()
        self._write_held()
        self._sink.close()

    def commit(self) -> None:
        self._sink.commit()

    def abort(self) -> None:
        self._sink.abort()


def _shard_leaf(pf: pq.ParquetFile, where: str) -> int:
    schema = pf.metadata.schema
    for i in range(len(schema)):
        if schema.column(i).path == SHARD:
            return i
    raise ValueError(f"{where}: the prompts table has no {SHARD!r} column (columns: {pf.schema_arrow.names})")


def shard_row_groups(pf: pq.ParquetFile, shard: int, *, where: str = "prompts table") -> list[int]:
    """The row groups that can hold `shard`'s rows: those whose `shard` statistics range holds it (or that
    have no statistics)."""
    leaf = _shard_leaf(pf, where)
    meta = pf.metadata
    groups = []
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(leaf).statistics
        if stats is None or not stats.has_min_max or stats.min <= shard <= stats.max:
            groups.append(i)
    return groups


def shard_prompts(
    prompts_file: PathLike, shard: int, *, columns: Sequence[str] | None = None, batch_rows: int = READ_ROWS
) -> Iterator[pl.DataFrame]:
    """The shard's rows of the prompts table (`columns`, default every column; file order), streamed in slices
    of at least `batch_rows` rows (the last one fewer): only the row groups that can hold the shard are read."""
    pf = parquet_file(prompts_file)
    groups = shard_row_groups(pf, shard, where=str(prompts_file))
    if not groups:
        return
    read = None if columns is None else list(dict.fromkeys([*columns, SHARD]))
    held: list[pl.DataFrame] = []
    n = 0
    for rb in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=read):
        b = cast(pl.DataFrame, pl.from_arrow(rb)).filter(pl.col(SHARD) == shard)
        if not b.height:
            continue
        held.append(b if columns is None else b.select(columns))
        n += b.height
        if n >= batch_rows:
            yield pl.concat(held)
            held, n = [], 0
    if held:
        yield pl.concat(held)


def prompt_columns(prompts_file: PathLike) -> list[str]:
    """The columns of a prompts table (one written before a column was added to schemas.PROMPTS lacks it)."""
    return list(parquet_file(prompts_file).schema_arrow.names)
