"""Requests that fail for good are counted by reason, named with their last error, and never hidden:
the step's metadata and the demo summary's `warnings:` line carry them (real simulator, real faults)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster import schemas
from eagle3_dagster.demo import request_failures, warnings_line
from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.report import result_line

pytestmark = pytest.mark.integration


def prompts_with_one_too_long(n: int, long_len: int) -> pl.DataFrame:
    """n short prompts; the last one has `long_len` ids (more than the simulator's context length)."""
    df = make_prompts(n, seed=31)
    long_ids = [1000 + i for i in range(long_len)]
    ids = [*df.get_column("input_ids").to_list()[:-1], long_ids]
    lens = [len(x) for x in ids]
    df = df.with_columns(pl.Series("input_ids", ids, dtype=pl.List(pl.Int32)), pl.Series("prompt_len", lens))
    return pl.from_arrow(df.to_arrow().cast(schemas.TOKENIZED_PROMPTS))  # type: ignore[return-value]


def test_permanent_failures_are_counted_by_reason_and_warned(start_sim, tmp_path: Path):
    sim = start_sim("--context-length", "50")
    prompts = prompts_with_one_too_long(6, long_len=60)
    sim.faults(reset_mid_body=2)  # the first sample sent: reset on both of its attempts
    out = tmp_path / "generations" / "shard=0000"
    rep = generate_shard(prompts, out, make_config(sim.url, max_retries=1, max_in_flight=1))

    assert (rep.succeeded, rep.failed) == (4, 2) and rep.reconciles
    assert read_generations(out).height == 4
    assert rep.errors_by_kind == {"retries_exhausted": 1, "http_400": 1}
    details = rep.as_metadata()["failure_details"]  # the generations step's metadata
    assert details["retries_exhausted"].startswith("reset after 2 attempts")
    assert details["http_400"] == "The input (60 tokens) is longer than the model's context length (50 tokens)."
    assert "http_400=1 (last: The input (60 tokens)" in result_line("0000", rep)

    failures = request_failures(tmp_path, [0, 1])  # shard 1 has no folder: nothing failed there
    assert {k: {r: n for r, (n, _) in v.items()} for k, v in failures.items()} == {
        "0000": {"http_400": 1, "retries_exhausted": 1}
    }
    line = warnings_line({}, failures)
    assert line != "warnings:   none"
    assert "generations shard 0000: 2 request(s) failed permanently" in line
    assert "retries_exhausted=1 (last: reset after 2 attempts" in line
    assert "http_400=1 (last: The input (60 tokens) is longer than the model's context length" in line


def test_a_run_without_failures_warns_nothing(start_sim, tmp_path: Path):
    sim = start_sim()
    out = tmp_path / "generations" / "shard=0000"
    rep = generate_shard(make_prompts(4, seed=32), out, make_config(sim.url))
    assert (rep.succeeded, rep.failed, rep.failure_details) == (4, 0, {})
    assert warnings_line({}, request_failures(tmp_path, [0])) == "warnings:   none"
