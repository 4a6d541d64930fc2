"""The named parts of run_gate and load_suite: an expectation's verdict (polars against GX) and a
config override, on plain values."""

from __future__ import annotations

import pytest

from eagle3_dagster.quality.gate import GateConsistencyError, _row_level_pass_rate, _table_level_success
from eagle3_dagster.quality.suites import ExpectationSpec, SuiteError, apply_override


def _spec(etype: str = "expect_column_values_to_be_in_set", mostly: float = 0.9) -> ExpectationSpec:
    return ExpectationSpec("k", "k", etype, {"column": "c", "mostly": mostly}, "critical", "", "row")


def test_row_level_pass_rate_is_polars_and_must_agree_with_gx():
    assert _row_level_pass_rate("g", _spec(), True, {"unexpected_count": 1}, 10, 1) == 0.9
    assert _row_level_pass_rate("g", _spec(), True, {}, 0, 0) == 1.0  # nothing the expectation applies to
    with pytest.raises(GateConsistencyError, match="GX says success=True"):
        _row_level_pass_rate("g", _spec(), True, {}, 10, 2)  # 0.8 < mostly, yet GX passed it
    with pytest.raises(GateConsistencyError, match="unexpected=3"):
        _row_level_pass_rate("g", _spec(), True, {"unexpected_count": 3}, 10, 1)  # counts differ


def test_a_column_aggregate_of_an_empty_shard_judges_nothing_but_a_row_count_keeps_gx_s_verdict():
    assert _table_level_success(_spec("expect_column_proportion_of_unique_values_to_be_between"), False, 0)
    assert not _table_level_success(_spec("expect_column_proportion_of_unique_values_to_be_between"), False, 5)
    assert not _table_level_success(_spec("expect_table_row_count_to_be_between"), False, 0)


def test_an_override_sets_mostly_kwargs_severity_and_enabled_and_refuses_unknown_fields():
    kwargs: dict = {"column": "c", "mostly": 1.0}
    got = apply_override(
        "k", {"mostly": 0.5, "kwargs": {"max_value": 3}, "severity": "warning"}, kwargs, "critical", True
    )
    assert got == ("warning", True) and kwargs == {"column": "c", "mostly": 0.5, "max_value": 3}
    assert apply_override("k", None, kwargs, "critical", True) == ("critical", True)
    assert apply_override("k", {"enabled": False}, kwargs, "critical", True) == ("critical", False)
    with pytest.raises(SuiteError, match=r"unknown field\(s\) \['mostyl'\]"):
        apply_override("k", {"mostyl": 0.5}, kwargs, "critical", True)
