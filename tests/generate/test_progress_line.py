"""The live progress line of a generations step: a cached rerun says so instead of "0/0 (100%)"."""

from __future__ import annotations

from eagle3_dagster.generate.report import RunStats, progress_line


def test_a_rerun_with_every_sample_stored_says_all_cached():
    line = progress_line("shard=0003", RunStats(total=0, cached=120).progress())
    assert line == "generations shard 0003: all 120 cached, nothing to generate"


def test_a_shard_without_prompts_says_nothing_to_generate():
    assert (
        progress_line("0001", RunStats(total=0).progress()) == "generations shard 0001: no prompts, nothing to generate"
    )


def test_a_partly_cached_run_counts_what_it_generates_and_names_the_stored_rest():
    stats = RunStats(total=40, cached=60)
    stats.succeeded, stats.failed = 9, 1
    line = progress_line("0002", stats.progress())
    assert line.startswith("generations shard 0002: 10/40 (25%) + 60 already stored · ")
