"""Rows sorted or looked up by a string key in bounded memory: the spill files a shard step streams through.

A shard step never holds the shard: its domain function hands its output rows to a `SortedSpill`, which
writes them in bounded buckets and gives them back sorted by their key (one Parquet file sorted by
sample_id), one bucket at a time; the rows it joins (a shard's prompts) are read through `KeyedRows`,
which keeps only the key column in memory. Peak memory: one input batch + one bucket + a few blocks.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa

BUCKET_ROWS = 1024  # rows a sorted output bucket holds (about 16 MB of 1,600-token training rows)


class SortedSpill:
    """Rows sorted by a unique string key, in bounded memory (an external bucket sort).

    `keys` are every key the rows may have (one small column for the shard); they are cut into
    buckets of `bucket_rows` consecutive sorted keys. `add()` appends each row to its bucket's spill
    file; `sorted_batches()` then reads the buckets in key order, each sorted: the rows come back in
    exactly `concat(all rows).sort(key)` order, at most one bucket in memory.
    """

    def __init__(
        self, keys: pl.Series, key: str, *, spill_dir: Path | None = None, bucket_rows: int | None = None
    ) -> None:
        self.key = key
        bucket_rows = bucket_rows or BUCKET_ROWS
        ordered = keys.cast(pl.String).sort()
        self.bounds = ordered.gather(list(range(bucket_rows, ordered.len(), bucket_rows)))
        self.dir = Path(tempfile.mkdtemp(prefix="eagle3-spill-", dir=spill_dir))
        self.writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
        self.schemas: dict[int, pa.Schema] = {}
        self.rows = 0

    def add(self, df: pl.DataFrame) -> None:
        if df.height == 0:
            return
        bucket = self.bounds.search_sorted(df[self.key].cast(pl.String), side="right")
        df = df.with_columns(bucket.alias("__bucket"))
        for (b,), part in df.group_by("__bucket", maintain_order=True):
            table = part.drop("__bucket").to_arrow()
            k = int(cast(int, b))
            w = self.writers.get(k)
            if w is None:
                # Arrow IPC, uncompressed: a spill file is written once and read once, so its bytes are
                # copied, never encoded
                self.schemas[k] = table.schema
                w = self.writers[k] = pa.ipc.new_file(self.dir / f"{k:06d}.arrow", table.schema)
            w.write_table(table.cast(self.schemas[k]))
        self.rows += df.height

    def sorted_batches(self) -> Iterator[pl.DataFrame]:
        for w in self.writers.values():
            w.close()
        try:
            for b in sorted(self.writers):
                path = self.dir / f"{b:06d}.arrow"
                with pa.OSFile(str(path), "rb") as source:
                    table = pa.ipc.open_file(source).read_all()
                batch = cast(pl.DataFrame, pl.from_arrow(table)).sort(self.key)
                del table
                yield batch
                path.unlink()
        finally:
            self.close()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class KeyedRows:
    """Rows fetched by a string key in bounded memory: a lookup table that is never held whole.

    The rows (an iterator of frames, e.g. a shard's tokenized prompts read in batches) are spilled in
    their order to files of `block_rows` consecutive rows; only the key column is kept, sorted, with
    each key's position. `rows(keys)` returns every row whose key is in `keys`, in their original
    order (so a later dict or join over them behaves as over the whole table), reading the blocks it
    needs through a small LRU cache. Lookups in about the rows' own order (generations come back in
    nearly the order their prompts were sent) touch one or two blocks; any order is correct.
    """

    def __init__(
        self,
        batches: Iterable[pl.DataFrame],
        key: str,
        schema: dict[str, Any],
        *,
        spill_dir: Path | None = None,
        block_rows: int | None = None,
        cache_blocks: int = 4,
    ) -> None:
        self.key, self.schema = key, schema
        self.block_rows = block_rows or BUCKET_ROWS
        self.cache_blocks = cache_blocks
        self.dir = Path(tempfile.mkdtemp(prefix="eagle3-rows-", dir=spill_dir))
        self._cache: OrderedDict[int, pl.DataFrame] = OrderedDict()
        keys: list[pl.Series] = []
        pending: list[pl.DataFrame] = []
        held = 0
        self.blocks = 0
        try:
            for b in batches:
                b = b.select(list(schema)).cast(cast(Any, schema))
                keys.append(b.get_column(key))
                pending.append(b)
                held += b.height
                while held >= self.block_rows:
                    block = pl.concat(pending)
                    self._write(block.head(self.block_rows))
                    rest = block.slice(self.block_rows)
                    pending, held = ([rest] if rest.height else []), rest.height
            if held:
                self._write(pl.concat(pending))
        except BaseException:
            self.close()
            raise
        all_keys = pl.concat(keys) if keys else pl.Series(key, [], dtype=pl.String)
        self.rows_total = all_keys.len()
        order = all_keys.arg_sort()
        self.sorted_keys = all_keys.gather(order)
        self.positions = order.to_numpy()

    def _write(self, block: pl.DataFrame) -> None:
        block.write_parquet(self.dir / f"{self.blocks:06d}.parquet", compression="lz4")
        self.blocks += 1

    def _block(self, i: int) -> pl.DataFrame:
        if i in self._cache:
            self._cache.move_to_end(i)
            return self._cache[i]
        df = pl.read_parquet(self.dir / f"{i:06d}.parquet")
        self._cache[i] = df
        while len(self._cache) > self.cache_blocks:
            self._cache.popitem(last=False)
        return df

    def rows(self, keys: pl.Series) -> pl.DataFrame:
        """Every row whose key is in `keys`, in the rows' original order."""
        want = keys.cast(pl.String).drop_nulls().unique()
        lo = self.sorted_keys.search_sorted(want, side="left").to_numpy()
        hi = self.sorted_keys.search_sorted(want, side="right").to_numpy()
        hit = [self.positions[a:b] for a, b in zip(lo.tolist(), hi.tolist()) if b > a]
        if not hit:
            return pl.DataFrame(schema=self.schema)
        pos = np.sort(np.concatenate(hit))
        parts = []
        for blk in np.unique(pos // self.block_rows).tolist():
            sel = pos[(pos // self.block_rows) == blk] - blk * self.block_rows
            parts.append(self._block(blk)[sel.tolist()])
        return pl.concat(parts)

    def close(self) -> None:
        self._cache.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> KeyedRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
