"""A group's acceptance, defined once (generate/group_acceptance.py): sums over trusted rows, never a mean of
the rows' ratios, and a row whose figures failed their checks left out and counted, on real Parquet."""

from __future__ import annotations

import polars as pl

from eagle3_dagster.generate.group_acceptance import (
    LEFT_OUT,
    GroupAcceptance,
    accept_length,
    accept_rate,
    failed_checks,
    group_acceptance,
    trusted_figures,
)

FLAG = "spec_metrics_inconsistent"


def _rows() -> pl.DataFrame:
    # a short answer and a long one of drafter a; a lying row (rate 2.0) of a; one row of b; one without figures
    return pl.DataFrame(
        {
            "drafter_id": ["a", "a", "a", "b", None],
            "completion_tokens": [10, 1000, 40, 12, 30],
            "spec_verify_ct": [2, 500, 10, 4, None],
            "spec_num_correct_drafts": [6, 400, 60, 7, None],
            "spec_num_proposed_drafts": [6, 1500, 30, 12, None],
            "spec_accept_length": [5.0, 2.0, 4.0, 3.0, None],
            "spec_accept_rate": [1.0, 400 / 1500, 2.0, 7 / 12, None],
            "spec_correct_drafts_histogram": [[0, 0, 0, 2], [200, 200, 50, 50], [0, 0, 0, 10], [1, 1, 0, 2], None],
            "integrity_violations": [[], [], [f"{FLAG}:correct_gt_proposed"], [], None],
        }
    )


def test_length_and_rate_are_sums_over_trusted_rows_and_flagged_rows_are_counted(tmp_path) -> None:
    path = tmp_path / "rows.parquet"
    _rows().write_parquet(path)
    trusted = trusted_figures(pl.read_parquet(path))
    lying = trusted.row(2, named=True)
    assert lying[LEFT_OUT] == "correct_gt_proposed"
    assert lying["spec_accept_rate"] is None and lying["spec_verify_ct"] is None  # feeds nothing
    assert trusted.filter(pl.col(LEFT_OUT).is_null()).height == 4

    a = GroupAcceptance.of(trusted.filter(pl.col("drafter_id") == "a"))
    assert (a.rows, a.left_out, dict(a.left_out_by_check)) == (2, 1, {"correct_gt_proposed": 1})
    assert a.accept_length == 1010 / 502 and a.accept_rate == 406 / 1506  # not the mean of 5.0 and 2.0
    assert "1 row(s) left out" in a.left_out_text() and "correct_gt_proposed 1" in a.left_out_text()

    per = {r["drafter_id"]: r for r in group_acceptance(trusted, "drafter_id").iter_rows(named=True)}
    assert per["a"]["accept_length"] == a.accept_length and per["a"]["accept_rate"] == a.accept_rate
    assert (per["a"]["rows"], per["a"]["left_out"]) == (2, 1)
    assert per[None]["rows"] == 0 and per[None]["accept_length"] is None  # no figures: no ratio

    everything = GroupAcceptance.of(trusted)
    assert everything == a + GroupAcceptance.of(trusted.filter(pl.col("drafter_id") != "a"))
    assert GroupAcceptance.from_sums(everything.as_sums()) == everything
    assert everything.accept_length == accept_length(1022, 506) and everything.accept_rate == accept_rate(413, 1518)
    assert accept_length(5, 0) is None and accept_rate(3, 0) is None


def test_a_stored_left_out_stays_left_out_where_no_flags_are_read(tmp_path) -> None:
    """Probe results store `spec_left_out` and nulled figures, not the flags: judged again (the drafter
    comparison joins each result with its generations row, which may be gone), a row stays left out and counted."""
    stored = trusted_figures(_rows()).drop("integrity_violations")  # as a probe result keeps it
    path = tmp_path / "results.parquet"
    stored.write_parquet(path)
    for again in (
        pl.read_parquet(path),  # no flags at all
        pl.read_parquet(path).with_columns(pl.lit(None, dtype=pl.List(pl.String)).alias("integrity_violations")),
    ):
        judged = trusted_figures(again)
        assert judged[LEFT_OUT].to_list() == [None, None, "correct_gt_proposed", None, None]
        g = GroupAcceptance.of(judged.filter(pl.col("drafter_id") == "a"))
        assert (g.left_out, g.left_out_by_check) == (1, {"correct_gt_proposed": 1})
        assert g.accept_length == accept_length(1010, 502)


def test_one_rule_for_a_row_and_for_a_frame() -> None:
    """failed_checks (one row's flags) and trusted_figures (a frame) leave out the same rows for the same checks."""
    rows = _rows().with_columns(
        pl.Series(
            "integrity_violations",
            [[f"{FLAG}:a", "think_end_missing"], [], [f"{FLAG}:b", f"{FLAG}:c"], [FLAG, f"x{FLAG}:d"], None],
        )
    )
    judged = trusted_figures(rows)
    for flags, left in zip(rows["integrity_violations"].to_list(), judged[LEFT_OUT].to_list()):
        assert failed_checks(flags) == (left.split(",") if left else [])
    assert judged[LEFT_OUT].to_list() == ["a", None, "b,c", None, None]
