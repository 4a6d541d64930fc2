"""The gated shard stage, streamed: read -> domain -> write -> features -> gate -> MaterializeResult.

A shard step never holds the shard: the domain function consumes input batches and hands its output
rows to a `SortedSpill`, which writes them in bounded buckets and gives them back sorted by their key
(the order the tables have always had: one Parquet file sorted by sample_id), one bucket at a time, to
be written to the final file through a ParquetSink (appears under its final name only when complete).
What the gate judges is the whole shard, but only its per-row scalar features (a few numbers a row)
are kept for it; `gated_result` validates that frame with the stage's GX suite exactly as before
(`mostly` semantics unchanged), stores the result and returns the step's MaterializeResult.

Peak memory: one input batch + one output bucket + the shard's feature columns, flat in the shard's
size (bench/publish_memory.py measures it, per step).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import dagster as dg
import numpy as np
import polars as pl
import pyarrow as pa

from ..quality import run_gate, write_gate_result
from ..schemas import GENERATIONS
from ..storage import write_frame_atomic

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
                # copied, never encoded (Parquet's encoding cost ~0.1 ms a long training row, both ways)
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


def detached(df: pl.DataFrame) -> pl.DataFrame:
    """`df` with its string and binary columns copied into buffers of their own: a frame kept past its
    batch (per-row features, stats, lineage) must not pin the batch. Polars' string columns are views
    into their source's data buffers, and a batch read back from an Arrow IPC spill file has every
    column sliced from one record-batch body: one kept `sample_id` column held the whole bucket
    (~12 KB a 1,600-token training row, peak RSS x3 at 100,000 samples). Numeric columns are exported
    zero-copy: a computed column owns its buffer already."""
    return cast(pl.DataFrame, pl.from_arrow(df.to_arrow(compat_level=pl.CompatLevel.oldest())))


def streamed_features(
    batches: Iterator[pl.DataFrame], features: Callable[[pl.DataFrame], pl.DataFrame], *, preview: int = 3
) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Per-row features of every batch (concatenated: the frame the gate validates), the first `preview`
    rows (for the sample preview) and the number of rows; one batch in memory at a time (what is kept
    of a batch is `detached` from it)."""
    feats: list[pl.DataFrame] = []
    head: pl.DataFrame | None = None
    rows = 0
    for batch in batches:
        if head is None or head.height < preview:
            part = detached(batch.head(preview if head is None else preview - head.height))
            head = part if head is None else pl.concat([head, part])
        feats.append(detached(features(batch)))
        rows += batch.height
    if head is None:
        head = cast(pl.DataFrame, pl.from_arrow(GENERATIONS.empty_table()))
    return (pl.concat(feats).rechunk() if feats else features(head)), head, rows


def arrow_batch(df: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    """A frame as the table's Arrow schema (the cast write_frame_atomic(df, path, schema=...) applies)."""
    return df.to_arrow().select(schema.names).cast(schema)


def gated_result(
    context: Any,
    pipeline: Any,
    gate: str,
    shard: int,
    features: pl.DataFrame,
    profile: Any,
    *,
    metadata: dict[str, Any],
    headlines: tuple[Any, ...] = (),
    quarantine: Any = None,
    extra_outcomes: tuple[Any, ...] = (),
) -> tuple[Any, dg.MaterializeResult]:
    """Validate the shard's feature frame with expectations/<gate>.json, store the gate result (blocks later
    consumers), write the rows failing a critical expectation to `quarantine` if given
    (metadata `quarantined`); return (the gate result, the step's MaterializeResult with its checks).
    `extra_outcomes`: shard-level outcomes judged outside the suite (the request failure budget), stored and
    reported with the gate's; a failed critical one fails the gate."""
    from ..quality.request_failures import with_outcome
    from .gates import gate_check_results

    result = run_gate(
        gate,
        features,
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
        profile=profile,
        keep_validations=pipeline.gx_keep_validations,
    )
    for outcome in extra_outcomes:  # shard-level outcomes judged outside the suite (quality/request_failures.py)
        result = with_outcome(result, outcome)
    write_gate_result(pipeline.data_path, gate, shard, result)
    if quarantine is not None:
        write_frame_atomic(result.row_failures, quarantine)
        metadata = {**metadata, "quarantined": result.row_failures.height}
    return result, dg.MaterializeResult(
        metadata=metadata,
        check_results=gate_check_results(gate, result, headlines),
    )


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
