"""A source file that changes while ingest reads it (an export still being written, a sync rewriting
it): the rows read mix two versions of the file, or stop half-way. Ingest fails naming the file and
keeps the previous outputs; before, it wrote the partial read as the source's prompts and succeeded.
Real files, real Parquet outputs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3_dagster.ingest import IngestFileError, SourceSpec, ingest_source


def _lines(start: int, n: int) -> str:
    return "".join(json.dumps({"question": f"What is {i} + {i}?"}) + "\n" for i in range(start, start + n))


def test_a_source_file_growing_while_it_is_read_fails_and_keeps_the_previous_outputs(tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text(_lines(0, 200))
    spec = SourceSpec(name="growing", path=str(data))
    out = tmp_path / "out"
    first = ingest_source(spec, out, n_shards=2)  # last night's complete read
    assert first.accepted == 200
    previous = pq.read_table(out / "accepted.parquet")

    data.write_text(_lines(0, 20_000))  # tonight's export, still being written while ingest reads it
    stop = threading.Event()
    appended = threading.Event()

    def writer() -> None:
        i = 20_000
        while not stop.is_set():
            with data.open("a") as f:
                f.write(_lines(i, 5))
            i += 5
            appended.set()
            time.sleep(0.001)

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert appended.wait(10)
        with pytest.raises(IngestFileError) as ei:
            ingest_source(spec, out, n_shards=2)
    finally:
        stop.set()
        t.join()
    msg = str(ei.value)
    assert str(data) in msg and "changed while it was read" in msg
    # nothing of the partial read was written: the previous outputs stand
    assert pq.read_table(out / "accepted.parquet").equals(previous)
    assert json.loads((out / "counts.json").read_text())["accepted"] == 200
    # once the writer is done, the same source ingests whole
    done = ingest_source(spec, out, n_shards=2)
    assert done.accepted == sum(1 for _ in data.open()) and done.reconciles
