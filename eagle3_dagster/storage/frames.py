"""Frames streamed batch by batch: copies that do not pin their batch, the Arrow cast of a table write, and
the per-row features a gate judges gathered one batch at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

import polars as pl
import pyarrow as pa

from ..schemas import GENERATIONS


def detached(df: pl.DataFrame) -> pl.DataFrame:
    """`df` with its string and binary columns copied into buffers of their own: a frame kept past its
    batch (per-row features, stats, lineage) must not pin the batch. Polars' string columns are views
    into their source's data buffers, and a batch read back from an Arrow IPC spill file has every
    column sliced from one record-batch body: one kept `sample_id` column would hold the whole bucket.
    Numeric columns are exported zero-copy: a computed column owns its buffer already."""
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
