"""ParquetSink with a buffer: under it, the streamed file is byte for byte the whole-table write; past it,
one row group per written table (bounded memory), same rows, order and schema."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from eagle3_dagster.schemas import TRAINING_SAMPLES
from eagle3_dagster.storage import ParquetSink, write_frame_atomic


def _rows(start: int, n: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "sample_id": [f"s{i:05d}" for i in range(start, start + n)],
            "prompt_id": [f"p{i % 7}" for i in range(start, start + n)],
            "source": ["gsm8k"] * n,
            "input_ids": [
                [163584 + (i % 3), *range(i, i + 50 + i % 40), 163607, 163586] for i in range(start, start + n)
            ],
            "loss_mask": [[0] * 10 + [1] * (43 + i % 40) for i in range(start, start + n)],
            "prompt_len": [10] * n,
            "output_len": [43 + i % 40 for i in range(start, start + n)],
            "total_len": [53 + i % 40 for i in range(start, start + n)],
            "conversation": [f'[{{"role": "user", "content": "q{i}"}}]' for i in range(start, start + n)],
            "text_exact": [i % 5 != 0 for i in range(start, start + n)],
        }
    )


def _batches() -> list[pl.DataFrame]:
    return [_rows(0, 300), _rows(300, 1), _rows(301, 250), _rows(551, 449)]


def _arrow(df: pl.DataFrame) -> pa.Table:
    full = pl.from_arrow(TRAINING_SAMPLES.empty_table())
    assert isinstance(full, pl.DataFrame)
    cols = [pl.col(c) if c in df.columns else pl.lit(None, dtype=full.schema[c]).alias(c) for c in full.columns]
    return df.select(cols).to_arrow().select(TRAINING_SAMPLES.names).cast(TRAINING_SAMPLES)


def test_under_the_buffer_the_streamed_file_is_the_whole_table_write_byte_for_byte(tmp_path):
    sink = ParquetSink(tmp_path / "streamed.parquet", TRAINING_SAMPLES, buffer_bytes=64 << 20)
    for b in _batches():
        sink.write_table(_arrow(b))
    assert not (tmp_path / "streamed.parquet").exists()  # appears only on commit
    sink.commit()
    whole = pl.from_arrow(pa.concat_tables([_arrow(b) for b in _batches()]))
    assert isinstance(whole, pl.DataFrame)
    write_frame_atomic(whole, tmp_path / "whole.parquet", schema=TRAINING_SAMPLES)
    assert (tmp_path / "streamed.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    assert sink.row_groups == 1 and not sink.streaming


def test_an_empty_file_is_the_empty_whole_table_write(tmp_path):
    sink = ParquetSink(tmp_path / "streamed.parquet", TRAINING_SAMPLES, buffer_bytes=64 << 20)
    sink.commit()
    empty = pl.from_arrow(TRAINING_SAMPLES.empty_table())
    assert isinstance(empty, pl.DataFrame)
    write_frame_atomic(empty, tmp_path / "whole.parquet", schema=TRAINING_SAMPLES)
    assert (tmp_path / "streamed.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    assert pq.read_table(tmp_path / "streamed.parquet").num_rows == 0


def test_past_the_buffer_every_table_is_a_row_group_and_nothing_is_lost(tmp_path):
    tables = [_arrow(b) for b in _batches()]
    budget = tables[0].nbytes + tables[1].nbytes  # overflows on the third table
    sink = ParquetSink(tmp_path / "streamed.parquet", TRAINING_SAMPLES, buffer_bytes=budget)
    for i, t in enumerate(tables):
        sink.write_table(t)
        assert sink.streaming == (i >= 2)
    sink.commit()
    f = pq.ParquetFile(tmp_path / "streamed.parquet")
    assert f.num_row_groups == sink.row_groups == 4
    assert [f.metadata.row_group(i).num_rows for i in range(4)] == [300, 1, 250, 449]
    assert f.read().equals(pa.concat_tables(tables))


def test_abort_leaves_nothing(tmp_path):
    sink = ParquetSink(tmp_path / "streamed.parquet", TRAINING_SAMPLES, buffer_bytes=1 << 20)
    sink.write_table(_arrow(_rows(0, 10)))
    sink.abort()
    assert list(tmp_path.iterdir()) == []
