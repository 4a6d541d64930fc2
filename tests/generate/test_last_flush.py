"""generate_shard returns only once every answered sample is on disk: the step after it (training, the
report) reads the shard at once. The timed flusher may be writing a chunk in a thread when the last
worker finishes; cancelling it then let the run return (and compact, and report N succeeded) while that
chunk was still being written: the next reader saw fewer rows than the report said, and a late
errors.parquet write could replace the final one with an older, shorter list.
Real simulator over HTTP, real Parquet; the timer fires every 10 ms so a run often ends mid-write."""

from __future__ import annotations

from pathlib import Path

import pytest
from gen_helpers import Sim, make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.store import chunk_files

pytestmark = pytest.mark.integration


def test_every_answered_sample_is_stored_when_the_run_returns(clean_sim: Sim, tmp_path: Path):
    runs = []
    for i in range(12):
        out = tmp_path / f"s{i}"
        prompts = make_prompts(24, seed=300 + i)
        cfg = make_config(clean_sim.url, flush_every_n=10_000, flush_every_s=0.01, compact_after_chunks=None)
        rep = generate_shard(prompts, out, cfg)
        stored = read_generations(out).height  # at once, as the next step does
        runs.append((rep.succeeded, stored, len(chunk_files(out))))
    assert all(s == n for s, n, _ in runs), runs
