"""What a shard step keeps of a batch for the whole shard (per-row features, stats, lineage) must not pin
the batch: a batch read back from a SortedSpill (Arrow IPC) has every column sliced from one record-batch
body, and a kept polars string column is a view into it. `detached` copies what is kept into buffers of
its own; without it a 100,000-sample training shard peaked at 3x the RSS of a 2,000-sample one."""

from __future__ import annotations

import datetime as dt
import gc

import polars as pl
import pyarrow as pa
from polars.testing import assert_frame_equal

from eagle3_dagster.storage import SortedSpill, detached

ROWS, PAYLOAD = 4000, 20_000  # ~80 MB of payload, the size of long training rows


def _shard(tmp_path, n_batches: int = 40) -> SortedSpill:
    ids = [f"sample-{i:08d}-{'x' * 20}" for i in range(ROWS)]  # > 12 bytes: stored out of line, as sample ids are
    spill = SortedSpill(pl.Series(ids), "sample_id", spill_dir=tmp_path, bucket_rows=256)
    per = ROWS // n_batches
    for b in range(n_batches):  # batches in an order unrelated to the key, like generations
        part = ids[b::n_batches][:per]
        spill.add(
            pl.DataFrame(
                {
                    "sample_id": part,
                    "payload": ["p" * PAYLOAD] * len(part),
                    "ids": [list(range(PAYLOAD // 4))] * len(part),
                }
            )
        )
    return spill


def _kept_bytes(tmp_path, keep) -> tuple[int, pl.DataFrame]:
    gc.collect()
    base = pa.total_allocated_bytes()
    kept = [
        keep(batch.select("sample_id", pl.col("ids").list.len().alias("n")))
        for batch in _shard(tmp_path).sorted_batches()
    ]
    gc.collect()
    return pa.total_allocated_bytes() - base, pl.concat(kept)


def test_kept_columns_do_not_pin_their_batches(tmp_path) -> None:
    held, frame = _kept_bytes(tmp_path, detached)
    payload = ROWS * PAYLOAD * 2  # the string and the ids each ~PAYLOAD bytes a row
    assert frame.height == ROWS and frame["sample_id"].is_sorted() and frame["n"].unique().to_list() == [PAYLOAD // 4]
    # what stays allocated is about the ids kept (4000 x ~37 bytes), not the 160 MB the batches held
    assert held < 2 << 20, f"{held / 2**20:.1f} MB still allocated after the batches (payload {payload / 2**20:.0f} MB)"


def test_the_spill_pins_what_is_kept_without_detached(tmp_path) -> None:
    """The hazard `detached` exists for, measured: without it the kept ids hold most of the payload."""
    held, _ = _kept_bytes(tmp_path, lambda f: f)
    assert held > ROWS * PAYLOAD // 2, f"{held / 2**20:.1f} MB held"


def test_detached_keeps_values_and_types() -> None:
    df = pl.DataFrame(
        {
            "sample_id": ["a" * 40, None, "b"],
            "n": pl.Series([1, 2, None], dtype=pl.Int32),
            "u": pl.Series([1, 2, 3], dtype=pl.UInt8),
            "f": [0.5, float("nan"), None],
            "ok": [True, False, None],
            "reasons": [["x" * 30], [], None],
            "raw": pl.Series([b"\x00\xff", b"", None], dtype=pl.Binary),
            "at": pl.Series([dt.datetime(2026, 12, 4, tzinfo=dt.UTC)] * 3).dt.convert_time_zone("UTC"),
        }
    )
    out = detached(df)
    assert_frame_equal(out, df)
    assert out.schema == df.schema
    assert_frame_equal(detached(df.clear()), df.clear())
