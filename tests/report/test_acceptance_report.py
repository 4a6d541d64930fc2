"""Where the drafter is weak (quality/acceptance.py, report/acceptance.py): sums by source, turn, length and
tool calls, the weakest prompts, the histogram, float metadata, and the quality report's section."""

from __future__ import annotations

import polars as pl

from eagle3_dagster.generate.group_acceptance import GroupAcceptance
from eagle3_dagster.quality.acceptance import (
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
    g = GroupAcceptance.from_sums(code)
    assert g.accept_length == 3100 / 1030  # not the mean of 100/30 and 3000/1000
    assert g.accept_rate == 1560 / 3090
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
        "spec_rows_left_out": 0.0,
        "spec_accept_length": 3300 / 1170,
        "spec_accept_rate": (60 + 1500 + 30 + 15) / (1170 * 3),
    }
    assert all(isinstance(v, float) for v in md.values())


def test_the_report_section_sums_shards_and_names_the_weak_spots():
    s = _summary()
    assert s is not None
    both = merge_groups([s, s], "by_source")
    assert (
        both["code"].rows == 4
        and both["code"].accept_rate == GroupAcceptance.from_sums(s["by_source"]["code"]).accept_rate
    )
    html = "\n".join(acceptance_section({"0000": s, "0001": s}))
    for text in ("Drafter acceptance", "weakest sources", "weakest prompts", "histogram", "with tool calls", "2k-8k"):
        assert text in html, text
    assert "8 rows" in html and f"{3300 / 1170:.3f}" in html
    assert acceptance_section({}) == []


def test_rows_whose_figures_failed_their_checks_feed_nothing_and_are_counted(tmp_path):
    """A lying row (accept rate 2.0, flagged correct_gt_proposed) and an impossible one (more verify steps than
    tokens) change no figure: not a group, the histogram, the weakest prompts, the metadata or the report."""
    lying = {
        **_gen("lie", "code", 100, 10, 60),
        "integrity_violations": ["spec_metrics_inconsistent:correct_gt_proposed"],
    }
    steps = {
        **_gen("steps", "chat", 3, 4, 0, [4]),
        "integrity_violations": ["spec_metrics_inconsistent:length_below_1"],
    }
    path = tmp_path / "part-0.parquet"
    pl.concat(
        [
            GENS.with_columns(pl.lit([], dtype=pl.List(pl.String)).alias("integrity_violations")),
            pl.DataFrame([lying, steps]),
        ]
    ).write_parquet(path)
    feats = pl.concat(
        [FEATURES, pl.DataFrame({"row_id": ["lie", "steps"], "output_len": [100, 3], "has_tool_call": [False, False]})]
    )
    s = acceptance_summary(acceptance_rows([pl.read_parquet(path)], feats, TURNS))
    honest = _summary()
    assert s is not None and honest is not None
    for key in ("by_source", "by_turn", "by_length", "by_tools", "by_drafter"):
        for name, g in honest[key].items():
            assert {k: v for k, v in s[key][name].items() if k != "left_out"} == {
                k: v for k, v in g.items() if k != "left_out"
            }, (key, name)
    assert s["all"]["left_out"] == 2 and s["by_source"]["code"]["left_out"] == 1
    assert s["left_out_by_check"] == {"correct_gt_proposed": 1, "length_below_1": 1}
    assert s["histogram"] == honest["histogram"]
    assert not {"lie", "steps"} & {w["sample_id"] for w in s["weakest_prompts"]}
    md = acceptance_metadata(s)
    assert md["spec_rows_left_out"] == 2.0
    assert {k: v for k, v in md.items() if k != "spec_rows_left_out"} == {
        k: v for k, v in acceptance_metadata(honest).items() if k != "spec_rows_left_out"
    }
    page = "\n".join(acceptance_section({"0000": s}))
    assert "2 row(s) left out: their speculative-decoding figures failed their checks" in page
    assert "correct_gt_proposed 1, length_below_1 1" in page and "2.000" not in page
    assert f"accept rate {GroupAcceptance.from_sums(honest['all']).accept_rate:.3f}" in page


def test_the_demo_summary_names_the_acceptance_and_what_was_left_out(tmp_path):
    from eagle3_dagster.app.speculative_demo import acceptance_lines
    from eagle3_dagster.quality.acceptance import write_acceptance
    from eagle3_dagster.storage import as_data_path

    data = as_data_path(tmp_path / "data")
    assert acceptance_lines(data, [0, 1]) == []  # nothing speculated: nothing said
    s = _summary()
    assert s is not None
    for shard in (0, 1):
        folder = data / "generations" / f"shard={shard:04d}"
        folder.mkdir()
        write_acceptance(folder, {**s, "all": {**s["all"], "left_out": 1}, "left_out_by_check": {"length_below_1": 1}})
    (line,) = acceptance_lines(data, [0, 1])
    assert line.startswith("acceptance: 8 row(s) with the drafter's figures: accept length 2.82 tokens per verify")
    assert "2 row(s) left out" in line and "length_below_1 2" in line
