"""Requests that fail are counted by reason, named with their last error, and never hidden: the step's
metadata and the demo summary's `warnings:` line carry them, the permanent ones (not sent again) and the
retryable ones (the next run sends them again) counted apart (real simulator, real faults)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster import schemas
from eagle3_dagster.app.demo import request_failures, warnings_line
from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.endpoint_info import context_length_of
from eagle3_dagster.generate.report import result_line
from eagle3_dagster.generate.store import read_generation_errors
from eagle3_dagster.quality.request_failures import failure_budget_outcome

pytestmark = pytest.mark.integration


def prompts_with_one_long(n: int, long_len: int) -> pl.DataFrame:
    """n short prompts; the last one has `long_len` ids."""
    df = make_prompts(n, seed=31)
    long_ids = [1000 + i for i in range(long_len)]
    ids = [*df.get_column("input_ids").to_list()[:-1], long_ids]
    lens = [len(x) for x in ids]
    df = df.with_columns(pl.Series("input_ids", ids, dtype=pl.List(pl.Int32)), pl.Series("prompt_len", lens))
    return pl.from_arrow(df.to_arrow().cast(schemas.TOKENIZED_PROMPTS))  # type: ignore[return-value]


def test_failures_are_counted_by_reason_permanent_and_retryable_apart_and_warned(start_sim, tmp_path: Path):
    sim = start_sim("--context-length", "50")
    # 46 ids < the context length 50 but >= the scheduler's max_req_input_len 44 (min(49, KV - 1) - 5): the
    # server refuses it (prompt + max_new_tokens over the context alone is fitted first: test_context_fit.py)
    prompts = prompts_with_one_long(6, long_len=46)
    sim.faults(reset_mid_body=2)  # the first sample sent: reset on both of its attempts
    out = tmp_path / "generations" / "shard=0000"
    # stream=False: the scheduler's refusal is an HTTP 400 (streamed, it is an abort_400 in the stream)
    rep = generate_shard(prompts, out, make_config(sim.url, max_retries=1, max_in_flight=1, stream=False))

    assert (rep.succeeded, rep.failed) == (4, 2) and rep.reconciles
    assert read_generations(out).height == 4
    assert rep.errors_by_kind == {"retries_exhausted": 1, "http_400": 1}
    details = rep.as_metadata()["failure_details"]  # the generations step's metadata
    assert details["retries_exhausted"].startswith("reset after 2 attempts")
    assert details["http_400"].startswith(
        "Input length (46 tokens) exceeds the maximum allowed length (44 tokens). Use a shorter input or enable "
        "--allow-auto-truncate."
    )
    assert "http_400=1 (last: Input length (46 tokens) exceeds" in result_line("0000", rep)

    failures = request_failures(tmp_path, [0, 1])  # shard 1 has no folder: nothing failed there
    assert {k: {r: n for r, (n, _) in v.items()} for k, v in failures.items()} == {
        "0000": {"http_400": 1, "retries_exhausted": 1}
    }
    line = warnings_line({}, failures)
    assert line != "warnings:   none"
    # the 400 is permanent (never sent again); the reset is not: the next run sends it again, so it is not
    # called a permanent failure (the summary said "2 request(s) failed permanently")
    assert "generations shard 0000: 2 request(s) failed: " in line and "failed permanently" not in line
    permanent, retryable = line.split("generations shard 0000: 2 request(s) failed: ")[1].split("; ", 1)
    assert permanent.startswith("1 permanent, not sent again: http_400=1 (last: Input length (46 tokens) exceeds")
    assert retryable.startswith("1 retryable, the next run sends them again: retries_exhausted=1 (last: reset after")
    budget = failure_budget_outcome(
        requested=rep.requested,
        failed=rep.failed,
        errors_by_kind=rep.errors_by_kind,
        failure_details=rep.failure_details,
        max_failed_rate=0.01,
    )
    assert budget.description.startswith(
        "2 of 6 requests failed (1 permanent, not sent again: http_400=1; 1 retryable, the next run sends them "
        "again: retries_exhausted=1)"
    )
    assert "failed permanently" not in budget.description


def test_a_run_without_failures_warns_nothing(start_sim, tmp_path: Path):
    sim = start_sim()
    out = tmp_path / "generations" / "shard=0000"
    rep = generate_shard(make_prompts(4, seed=32), out, make_config(sim.url))
    assert (rep.succeeded, rep.failed, rep.failure_details) == (4, 0, {})
    assert warnings_line({}, request_failures(tmp_path, [0])) == "warnings:   none"


def test_prompt_longer_than_the_servers_context_is_not_sent(start_sim, tmp_path: Path):
    sim = start_sim("--context-length", "50")  # advertised in /server_info as context_length
    prompts = prompts_with_one_long(6, long_len=50)  # 50 >= 50: the server would answer 400 "The input ..."
    before = sim.requests()
    out = tmp_path / "generations" / "shard=0000"
    rep = generate_shard(prompts, out, make_config(sim.url))

    assert rep.server_context_length == 50
    assert (rep.succeeded, rep.failed) == (5, 1) and rep.reconciles
    assert sim.requests() - before == 5  # the long prompt never reached the server
    assert rep.errors_by_kind == {"prompt_too_long_for_server": 1}
    assert rep.failure_details["prompt_too_long_for_server"] == (
        "prompt of 50 ids >= the server's context length 50 (/server_info context_length): not sent"
    )
    errors = read_generation_errors(out)
    assert errors.select("prompt_id", "reason").rows() == [(prompts["prompt_id"][-1], "prompt_too_long_for_server")]

    # one id shorter fits the context (49 < 50): sent, with max_new_tokens fitted to 1 (context_fit.py), and
    # refused by the server's scheduler (49 >= its max_req_input_len 44), not by this check
    rep2 = generate_shard(
        prompts_with_one_long(6, long_len=49), tmp_path / "g2" / "shard=0000", make_config(sim.url, stream=False)
    )
    assert rep2.errors_by_kind == {"http_400": 1} and "prompt_too_long_for_server" not in rep2.failure_details
    assert rep2.context_fitted == 1


def test_context_length_is_read_from_server_info_fields() -> None:
    assert context_length_of({"context_length": 262144}) == 262144
    assert context_length_of({"max_model_len": 4096}) == 4096
    assert context_length_of({"context_length": None, "max_model_len": 8192}) == 8192
    assert context_length_of({}) is None and context_length_of({"context_length": True}) is None


def test_requests_lost_by_one_run_are_sent_again_and_the_report_shows_they_came_back(start_sim, tmp_path: Path):
    """Run 1 loses two requests to resets (and one to a 400, which is permanent); run 2 sends the two
    again, one comes back and one fails again; run 3 brings the last one back. Each run's outcome is in
    its result line, its metadata and the quality report; the 400 is never sent again."""
    from eagle3_dagster.report.html import collect, render

    sim = start_sim("--context-length", "50")
    prompts = prompts_with_one_long(6, long_len=46)  # the long one: a 400 from the server (scheduler), every time
    out = tmp_path / "generations" / "shard=0000"
    config = make_config(sim.url, max_retries=1, max_in_flight=1, stream=False)  # the scheduler's 400: http_400
    row = "earlier failures sent again (generations)"

    sim.faults(reset_mid_body=4)  # the first two samples sent: reset on both attempts
    first = generate_shard(prompts, out, config)
    assert first.errors_by_kind == {"retries_exhausted": 2, "http_400": 1} and first.previous_failures == {}
    assert row not in {r.shard: r.other_rejects for r in collect(tmp_path, tmp_path / "w", n_shards=1).shards}["0000"]

    sim.faults(reset_mid_body=2)  # the first one sent again fails again
    second = generate_shard(prompts, out, config)
    assert (second.succeeded, second.failed, second.skipped_cached) == (1, 2, 3) and second.reconciles
    assert second.previous_failures == {
        "retries_exhausted": {"retried": 2, "came_back": 1, "failed_again": 1, "not_sent": 0}
    }
    assert second.as_metadata()["previous_failures"] == second.previous_failures
    assert "retried 2 failed before (retries_exhausted=2): 1 came back, 1 failed again, 0 not sent" in result_line(
        "0000", second
    )
    m = collect(tmp_path, tmp_path / "w", n_shards=1)
    assert {r.shard: r.other_rejects for r in m.shards}["0000"][row] == {
        "came back (failed before: retries_exhausted)": 1,
        "failed again (failed before: retries_exhausted)": 1,
    }
    html = render(m, tmp_path / "w" / "reports" / "index.html")
    assert row in html and "came back (failed before: retries_exhausted)" in html

    sent_before = sim.requests()
    third = generate_shard(prompts, out, config)
    assert sim.requests() - sent_before == 1  # only the one that failed again; the 400 is not sent
    assert (third.succeeded, third.failed, third.carried_failed) == (1, 1, 1)  # the 400 stays, unsent
    assert third.previous_failures == {
        "retries_exhausted": {"retried": 1, "came_back": 1, "failed_again": 0, "not_sent": 0}
    }
    assert read_generations(out).height == 5
