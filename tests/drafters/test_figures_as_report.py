"""A comparison's point estimates are the report's: the same stored probe results give the same per-source and
overall accept length and rate in `eagle3 drafters compare` (drafters/units.py, stats.py) as in the report's
probe tables (generate/probe_results.drafter_versions_by_source, drafter_versions), by the one definition of a
group's acceptance (generate/group_acceptance.py), with the same rows left out: figures flagged
`spec_metrics_inconsistent:*` and rows stored without the sums."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from eagle3_dagster.drafters.baseline import load_baseline
from eagle3_dagster.drafters.compare import judge
from eagle3_dagster.drafters.rule import PromotionRule
from eagle3_dagster.drafters.units import conform, pair
from eagle3_dagster.generate.group_acceptance import accept_length, accept_rate
from eagle3_dagster.generate.probe_results import (
    conform_results,
    drafter_versions,
    drafter_versions_by_source,
    read_all_results,
    results_path,
    update_shard_results,
)
from eagle3_dagster.storage import write_frame_atomic

PROBES = ("probe_code", "probe_prose")
NOW = datetime(2026, 6, 1, tzinfo=UTC)
FLAG = "spec_metrics_inconsistent:accept_length"


def _row(prompt: str, source: str, tokens: int, steps: int, correct: int, **over) -> dict:
    """A speculating server's row with 4 draft tokens: 3 drafts proposed per verify step."""
    return {
        "sample_id": f"s-{prompt}",
        "prompt_id": prompt,
        "source": source,
        "completion_tokens": tokens,
        "spec_verify_ct": steps,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": steps * 3,
        "spec_accept_length": tokens / steps,
        "spec_accept_rate": correct / (steps * 3),
        "spec_num_draft_tokens": 4,
        "integrity_violations": [],
        **over,
    }


def _production(data) -> None:
    """Production's probe results as the generations asset records them (update_shard_results: flagged figures
    kept out), and one row from a file written before the sums were kept (length and rate only)."""
    rows = [
        _row("p1", "probe_code", 120, 40, 60),
        _row("p2", "probe_code", 90, 45, 30),
        # the server's length says 2.5 for 100 tokens in 10 steps: flagged, its figures feed nothing
        _row("p3", "probe_code", 100, 10, 20, spec_accept_length=2.5, integrity_violations=[FLAG]),
        _row("p4", "probe_prose", 80, 20, 45),
        _row("p5", "probe_prose", 60, 30, 20),
    ]
    current = pl.DataFrame(rows).with_columns(
        pl.lit("eagle3-prod").alias("drafter_id"),
        pl.lit("org/drafter-v1").alias("spec_draft_model_path"),
        pl.lit(None, dtype=pl.String).alias("spec_draft_model_revision"),
        pl.lit(NOW).alias("generated_at"),
    )
    stored = update_shard_results(data, 0, current, "eagle3-prod", NOW)
    old = conform_results(
        pl.DataFrame(
            [
                {
                    "sample_id": "s-p6",
                    "prompt_id": "p6",
                    "source": "probe_prose",
                    "drafter_key": "eagle3-prod",
                    "drafter_id": "eagle3-prod",
                    "spec_draft_model_path": "org/drafter-v1",
                    "completion_tokens": 100,
                    "spec_accept_length": 4.0,  # 25 verify steps, as far as the length tells
                    "spec_accept_rate": 0.9,
                    "generated_at": NOW,
                    "first_seen": NOW,
                    "last_seen": NOW,
                }
            ]
        )
    )
    write_frame_atomic(pl.concat([stored, old]), results_path(data, 0))


def _candidate() -> pl.DataFrame:
    """The candidate answered every probe prompt with trusted figures (so the comparison's rows are production's)."""
    rows = [
        _row(p, src, 100, 25, 50)
        for p, src in (("p1", "probe_code"), ("p2", "probe_code"), ("p3", "probe_code"), ("p4", "probe_prose"),
                       ("p5", "probe_prose"), ("p6", "probe_prose"))
    ]  # fmt: skip
    return conform(pl.DataFrame(rows).with_columns(pl.lit("eagle3-cand").alias("drafter_id")))


def test_the_comparisons_production_figures_are_the_report_probe_tables(tmp_path) -> None:
    data = tmp_path / "data"
    _production(data)
    results = read_all_results(data)
    report = {
        r["source"]: r
        for r in drafter_versions_by_source(results).iter_rows(named=True)
        if r["drafter_id"] == "eagle3-prod"
    }
    # the report's figures: p3 (flagged) and p6 (no sums) feed nothing
    assert report["probe_code"]["accept_length"] == accept_length(120 + 90, 40 + 45)
    assert report["probe_prose"]["accept_length"] == accept_length(80 + 60, 20 + 30)
    assert report["probe_code"]["accept_rate"] == accept_rate(60 + 30, 120 + 135)
    assert report["probe_code"]["left_out"] == 1

    baseline = load_baseline(data, None, PROBES)
    paired = pair(baseline.rows, _candidate())
    overall, sources = judge(paired, PromotionRule(min_prompts=2, resamples=200), rates_compared=True)
    for s in sources:
        want = report[s.source]
        assert s.rate is not None
        assert (s.length.base, s.rate.base) == (want["accept_length"], want["accept_rate"]), s.source
        doc = s.as_json(0.95)
        assert doc["production_accept_length"] == round(want["accept_length"], 6)
        assert doc["production_accept_rate"] == round(want["accept_rate"], 6)
    whole = drafter_versions(results).row(0, named=True)
    assert overall.rate is not None
    assert (overall.length.base, overall.rate.base) == (whole["accept_length"], whole["accept_rate"])
    # and every row the figures leave out is counted, by why
    assert paired.left_out == {
        "probe_code": {"production figures flagged spec_metrics_inconsistent": 1},
        "probe_prose": {"production row stored without the acceptance sums (written before they were kept)": 1},
    }
