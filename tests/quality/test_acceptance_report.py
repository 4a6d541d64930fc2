"""Where the drafter is weak (quality/acceptance.py, report/acceptance.py): sums by source, turn, length and
tool calls, the weakest prompts, the histogram, float metadata, and the quality report's section."""

from __future__ import annotations

import polars as pl

from eagle3_dagster.quality.acceptance import (
    accept_length,
    accept_rate,
    acceptance_metadata,
    acceptance_rows,
    acceptance_summary,
    merge_groups,
)
from eagle3_dagster.report.acceptance import acceptance_section


def _gen(sid: str, source: str, n: int, vct: int, correct: int, hist: list[int] | None = None) -> dict:
    return {
        "sample_id": sid,
        "prompt_id": "p" + sid,
        "source": source,
        "completion_tokens": n,
        "spec_verify_ct": vct,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": vct * 3,
        "spec_correct_drafts_histogram": hist or [vct - correct // 3, 0, 0, correct // 3],
        "drafter_id": "eagle3-abc",
    }


GENS = pl.DataFrame(
    [
        _gen("a", "code", 100, 30, 60),
        _gen("b", "code", 3000, 1000, 1500),
        _gen("c", "chat", 100, 60, 30),
        _gen("t2", "chat", 100, 80, 15),
    ]
)
FEATURES = pl.DataFrame(
    {"row_id": ["a", "b", "c", "t2"], "output_len": [100, 3000, 100, 100], "has_tool_call": [True, False, False, False]}
)
TURNS = pl.DataFrame({"sample_id": ["t2"], "turn_index": [2]})


def _summary():
    no_spec = pl.DataFrame(
        {"sample_id": ["x"], "source": ["chat"], "spec_verify_ct": [None]},
        schema_overrides={"spec_verify_ct": pl.Int64},
    )
    return acceptance_summary(acceptance_rows([GENS, no_spec], FEATURES, TURNS))


def test_groups_keep_sums_and_ratios_come_from_them():
    s = _summary()
    assert s is not None and s["all"]["rows"] == 4  # the row without figures is not counted
    code = s["by_source"]["code"]
    assert (code["rows"], code["completion_tokens"], code["spec_verify_ct"]) == (2, 3100, 1030)
    assert accept_length(code) == 3100 / 1030  # not the mean of 100/30 and 3000/1000
    assert accept_rate(code) == 1560 / 3090
    assert set(s["by_turn"]) == {"1", "2"} and s["by_turn"]["2"]["rows"] == 1
    assert s["by_length"]["2k-8k"]["rows"] == 1 and s["by_length"]["<512"]["rows"] == 3
    assert s["by_tools"]["with tool calls"]["rows"] == 1
    assert s["by_drafter"]["eagle3-abc"]["rows"] == 4
    assert sum(s["histogram"]) == 30 + 1000 + 60 + 80
    assert [w["sample_id"] for w in s["weakest_prompts"]][:2] == ["t2", "c"]


def test_no_figures_no_summary_and_no_metadata():
    plain = pl.DataFrame({"sample_id": ["x"], "spec_verify_ct": [None]}, schema_overrides={"spec_verify_ct": pl.Int64})
    assert acceptance_summary(acceptance_rows([plain], FEATURES, None)) is None
    assert acceptance_metadata(None) == {}


def test_float_metadata_for_the_ui():
    md = acceptance_metadata(_summary())
    assert md == {
        "spec_rows": 4.0,
        "spec_accept_length": 3300 / 1170,
        "spec_accept_rate": (60 + 1500 + 30 + 15) / (1170 * 3),
    }
    assert all(isinstance(v, float) for v in md.values())


def test_the_report_section_sums_shards_and_names_the_weak_spots():
    s = _summary()
    assert s is not None
    both = merge_groups([s, s], "by_source")
    assert both["code"]["rows"] == 4 and accept_rate(both["code"]) == accept_rate(s["by_source"]["code"])
    html = "\n".join(acceptance_section({"0000": s, "0001": s}))
    for text in ("Drafter acceptance", "weakest sources", "weakest prompts", "histogram", "with tool calls", "2k-8k"):
        assert text in html, text
    assert "8 rows" in html and f"{3300 / 1170:.3f}" in html
    assert acceptance_section({}) == []
