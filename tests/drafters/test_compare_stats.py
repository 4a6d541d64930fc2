"""The statistics and the decision of a drafter comparison, in process on synthetic drafters whose true accept
length is known (drafters/stats.py, compare.py, units.py, rule.py).

A synthetic drafter: each prompt has a number of verify steps and an acceptance chance per draft; each step
accepts the drafts until the first miss (at most draft_tokens - 1) plus the bonus token, as SGLang counts
them. With the verify steps fixed, the expected accept length of a group is exactly
Σ v_i (1 + p_i + p_i^2 + p_i^3) / Σ v_i: the planted figure the intervals must cover.
"""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.drafters.compare import HOLD, PROMOTE, decide, judge, too_few
from eagle3_dagster.drafters.rule import PromotionRule, RuleError, load_rule, parse_rule
from eagle3_dagster.drafters.stats import (
    Estimate,
    Figures,
    Stratum,
    paired_bootstrap,
    prompts_needed,
    ratio_of_sums,
    t_quantile,
)
from eagle3_dagster.drafters.units import pair

DRAFTS = 3  # speculative_num_draft_tokens 4


def _steps(rng: np.random.Generator, p: float, steps: int) -> np.ndarray:
    """Accepted drafts per verify step: the run of successes before the first miss, at most DRAFTS."""
    hits = rng.random((steps, DRAFTS)) < p
    return np.cumprod(hits, axis=1).sum(axis=1)


def _drafter(rng: np.random.Generator, ps: np.ndarray, verify: np.ndarray) -> Figures:
    accepted = np.array([_steps(rng, p, int(v)).sum() for p, v in zip(ps, verify)], dtype=float)
    return Figures(accepted + verify, verify.astype(float), accepted, verify * float(DRAFTS))


def _expected_length(ps: np.ndarray, verify: np.ndarray) -> float:
    return float((verify * (1 + ps + ps**2 + ps**3)).sum() / verify.sum())


def _plant(rng: np.random.Generator, n: int, factor: float) -> tuple[Stratum, float]:
    """A stratum of n prompts (easy and hard ones) where the candidate's chances are production's x factor,
    and the planted difference of their accept lengths."""
    ps = rng.uniform(0.35, 0.75, n)
    verify = rng.integers(30, 150, n)
    cand_ps = np.minimum(ps * factor, 0.99)
    planted = _expected_length(cand_ps, verify) - _expected_length(ps, verify)
    return Stratum("s", _drafter(rng, ps, verify), _drafter(rng, cand_ps, verify)), planted


def test_a_groups_acceptance_is_a_ratio_of_sums_never_a_mean_of_ratios() -> None:
    # a long answer at 3 tokens per step and a short one at 1: the group is 301/101, not (3 + 1) / 2
    length, rate = ratio_of_sums(
        np.array([300.0, 1.0]), np.array([100.0, 1.0]), np.array([200.0, 0.0]), np.array([300.0, 3.0])
    )
    assert length == pytest.approx(301 / 101) and rate == pytest.approx(200 / 303)
    assert np.isnan(ratio_of_sums(np.array([1.0]), np.array([0.0]), np.array([0.0]), np.array([0.0]))[0])


@pytest.mark.parametrize("factor", [1.15, 0.85, 1.0], ids=["better", "worse", "equal"])
def test_planted_better_worse_and_equal_candidates_get_those_verdicts(factor) -> None:
    rng = np.random.default_rng(7)
    code, planted_code = _plant(rng, 40, factor)
    prose, planted_prose = _plant(rng, 40, factor)
    strata = [Stratum("code", code.base, code.cand), Stratum("prose", prose.base, prose.cand)]
    boot = paired_bootstrap(strata, resamples=2000, seed=11, confidence=0.95)
    want = {1.15: "better", 0.85: "worse", 1.0: "no_difference"}[factor]
    for name, planted in (("code", planted_code), ("prose", planted_prose)):
        est = boot.length[name]
        assert est.verdict == want, (name, est)
        assert est.lo <= planted <= est.hi, (name, planted, est)


def test_the_intervals_cover_the_planted_differences_95_times_in_100() -> None:
    rng = np.random.default_rng(2024)
    covered, total, widths = 0, 0, []
    for rep in range(150):
        factor = (1.1, 0.9, 1.0)[rep % 3]
        a, planted_a = _plant(rng, 12, factor)  # small probe sets: a dozen prompts a source
        b, planted_b = _plant(rng, 30, factor)
        strata = [Stratum("a", a.base, a.cand), Stratum("b", b.base, b.cand)]
        boot = paired_bootstrap(strata, resamples=400, seed=rep, confidence=0.95)
        va, vb = np.asarray(a.base.verify), np.asarray(b.base.verify)
        # the overall planted difference: the strata's planted ones weighted by their verify steps
        tokens = planted_a * va.sum() + planted_b * vb.sum()
        planted_overall = tokens / (va.sum() + vb.sum())
        for name, planted in (("a", planted_a), ("b", planted_b), ("overall", planted_overall)):
            est = boot.length[name]
            covered += est.lo <= planted <= est.hi
            total += 1
            widths.append(est.half_width)
    coverage = covered / total
    assert 0.92 <= coverage <= 0.995, coverage  # binomial sd at 450 intervals: 0.01
    assert all(w > 0 for w in widths)


def test_the_bootstrap_is_seeded_and_each_sources_draws_are_its_own() -> None:
    rng = np.random.default_rng(3)
    a, _ = _plant(rng, 20, 1.05)
    b, _ = _plant(rng, 25, 1.05)
    sa, sb = Stratum("code", a.base, a.cand), Stratum("prose", b.base, b.cand)
    one = paired_bootstrap([sa, sb], resamples=1000, seed=5, confidence=0.95)
    again = paired_bootstrap([sa, sb], resamples=1000, seed=5, confidence=0.95)
    other_seed = paired_bootstrap([sa, sb], resamples=1000, seed=6, confidence=0.95)
    alone = paired_bootstrap([sa], resamples=1000, seed=5, confidence=0.95)
    assert one == again
    assert one.length["code"] != other_seed.length["code"]
    assert abs(one.length["code"].lo - other_seed.length["code"].lo) < 0.05  # another seed, about the same interval
    assert alone.length["code"] == one.length["code"]  # adding a source leaves the others' intervals as they were
    with pytest.raises(ValueError, match="distinct"):
        paired_bootstrap([sa, sa], resamples=100, seed=1, confidence=0.95)


def test_small_samples_get_the_expanded_interval_and_one_prompt_gets_none() -> None:
    assert t_quantile(0.975, 11) == pytest.approx(2.201, abs=1e-3)
    assert t_quantile(0.975, 3) == pytest.approx(3.182, abs=0.01)
    rng = np.random.default_rng(9)
    s, _ = _plant(rng, 1, 1.0)
    est = paired_bootstrap([s], resamples=200, seed=1, confidence=0.95).length["s"]
    assert math.isnan(est.lo) and est.verdict == "no_difference"


def _est(diff: float, half: float) -> Estimate:
    return Estimate(2.0, 2.0 + diff, diff, diff - half, diff + half)


def test_too_few_prompts_says_how_many_it_would_take() -> None:
    rule = PromotionRule(margin=0.1, min_prompts=3)
    line, need = too_few("probe_x", 4, _est(0.05, 0.6), rule)
    assert line == "probe_x: 4 prompts, interval ±0.60: too few to tell a 0.1 difference; about 144 prompts would"
    assert need == prompts_needed(4, 0.6, 0.1) == 144
    assert too_few("probe_x", 400, _est(0.05, 0.03), rule) == (None, None)
    line, need = too_few("probe_y", 2, _est(0.05, 0.01), rule)
    assert "fewer than the rule's min_prompts 3" in line and need == 3


def _src(name: str, n: int, diff: float, half: float):
    from eagle3_dagster.drafters.compare import SourceResult

    return SourceResult(name, n, _est(diff, half), None)


def test_the_decision_follows_the_rule_and_names_each_reason() -> None:
    rule = PromotionRule(margin=0.05, min_prompts=20)
    good = [_src("code", 40, 0.3, 0.1), _src("prose", 40, 0.2, 0.1)]
    assert decide(_src("overall", 80, 0.25, 0.07), good, rule) == (
        PROMOTE,
        ["overall better by +0.250 [+0.180, +0.320], at least the margin 0.05", "no probe source worse (2 compared)"],
    )
    mixed = [_src("code", 40, 0.4, 0.1), _src("prose", 40, -0.2, 0.1)]
    decision, why = decide(_src("overall", 80, 0.1, 0.05), mixed, rule)
    assert decision == HOLD and why == ["prose is worse: -0.200 [-0.300, -0.100]"]
    assert (
        decide(_src("overall", 80, 0.1, 0.05), mixed, PromotionRule(margin=0.05, no_source_worse=False))[0] == PROMOTE
    )
    decision, why = decide(_src("overall", 80, 0.03, 0.02), good, rule)
    assert decision == HOLD and why == ["overall better by +0.030 [+0.010, +0.050], less than the margin 0.05"]
    decision, why = decide(_src("overall", 80, 0.01, 0.05), good, rule)
    assert why == ["overall accept length is no difference: +0.010 [-0.040, +0.060] includes 0"]
    decision, why = decide(_src("overall", 10, 0.5, 0.05), good, rule)
    assert decision == HOLD and "10 prompts" in why[0]
    decision, why = decide(
        _src("overall", 80, 0.25, 0.07), good, rule, holds=["3 probe prompts have no candidate answer"]
    )
    assert decision == HOLD and why == ["3 probe prompts have no candidate answer"]


def _rows(units: list[tuple[str, str, int, int, float]], **extra) -> pl.DataFrame:
    """Stored rows: (prompt_id, source, completion, verify, accept rate), 4 draft tokens."""
    return pl.DataFrame(
        {
            "sample_id": [f"s-{u[0]}" for u in units],
            "prompt_id": [u[0] for u in units],
            "source": [u[1] for u in units],
            "completion_tokens": [u[2] for u in units],
            "spec_verify_ct": [u[3] for u in units],
            "spec_num_proposed_drafts": [u[3] * 3 for u in units],
            "spec_num_correct_drafts": [round(u[4] * u[3] * 3) for u in units],
            "spec_accept_length": [u[2] / u[3] for u in units],
            "spec_accept_rate": [u[4] for u in units],
            "spec_num_draft_tokens": [4] * len(units),
            **extra,
        }
    )


def test_flagged_figures_feed_nothing_and_every_left_out_unit_is_counted() -> None:
    flags = [[], ["spec_metrics_inconsistent:accept_length"], [], [], ["think_end_missing"]]
    base = _rows(
        [("p1", "code", 100, 50, 0.3), ("p2", "code", 100, 50, 0.3), ("p3", "code", 90, 45, 0.3), ("p4", "prose", 80, 40, 0.3),
         ("p5", "prose", 60, 30, 0.3)],
        integrity_violations=flags,
    )  # fmt: skip
    cand_flags = [[], [], ["spec_metrics_inconsistent:partial"], []]
    cand = _rows(
        [("p1", "code", 100, 25, 0.6), ("p2", "code", 100, 25, 0.6), ("p3", "code", 90, 10, 0.9), ("p5", "prose", 60, 20, 0.5)],
        integrity_violations=cand_flags,
    )  # fmt: skip
    paired = pair(base, cand)
    # p2: production flagged; p3: candidate flagged; p4: no candidate answer; p5's unrelated flag does not count
    assert sorted(paired.table["unit"].to_list()) == ["p1", "p5"]
    assert paired.left_out == {
        "code": {
            "production figures flagged spec_metrics_inconsistent": 1,
            "candidate figures flagged spec_metrics_inconsistent": 1,
        },
        "prose": {"no candidate answer (request failed or not sent)": 1},
    }
    # the flagged candidate figure (90 tokens in 10 steps) never reaches a sum
    strata = {s.name: s for s in paired.strata()}
    assert strata["code"].cand.acceptance()[0] == pytest.approx(100 / 25)


def test_rows_stored_without_the_counts_feed_no_sum_and_are_counted() -> None:
    """A row with a length and a rate but no verify steps (a result written before the sums were kept) is left
    out on either side, as the report leaves it out: steps rounded back from a stored length are an estimate."""
    full = _rows([("p1", "code", 120, 40, 0.5), ("p2", "code", 30, 20, 0.25), ("p3", "code", 70, 20, 0.5)])
    counts = ["spec_verify_ct", "spec_num_proposed_drafts", "spec_num_correct_drafts"]

    def without_counts(prompt: str) -> pl.DataFrame:
        return full.with_columns(pl.when(pl.col("prompt_id") != prompt).then(pl.col(c)).alias(c) for c in counts)

    paired = pair(without_counts("p2"), without_counts("p3"))
    assert paired.table["unit"].to_list() == ["p1"]
    assert paired.left_out == {
        "code": {
            "production row stored without the acceptance sums (written before they were kept)": 1,
            "candidate row stored without the acceptance sums (written before they were kept)": 1,
        }
    }
    assert paired.strata()[0].base.acceptance() == (120 / 40, 60 / 120)


def test_the_bootstrap_ratio_is_the_one_definition_on_each_resample() -> None:
    """ratio_of_sums over resamples (rows) is group_acceptance.accept_length / accept_rate of each one's sums."""
    from eagle3_dagster.generate.group_acceptance import accept_length, accept_rate

    rng = np.random.default_rng(4)
    figs = [rng.integers(0, 5000, size=(50, 7)) for _ in range(4)]
    figs[1][3] = 0  # a resample without a verify step: no length (None there, nan here)
    length, rate = ratio_of_sums(*figs)
    for i in range(50):
        sums = [int(f[i].sum()) for f in figs]
        want_len, want_rate = accept_length(sums[0], sums[1]), accept_rate(sums[2], sums[3])
        assert np.isnan(length[i]) if want_len is None else length[i] == want_len
        assert rate[i] == want_rate
    assert np.isnan(length[3])
    one = Figures(*(f[0] for f in figs))
    assert one.acceptance() == (accept_length(*(int(f[0].sum()) for f in figs[:2])), rate[0])
    with pytest.raises(ValueError, match="counts"):
        Figures(np.array([1.5]), np.array([1.0]), np.array([0.0]), np.array([0.0]))


def test_a_multi_turn_probe_counts_per_turn() -> None:
    base = _rows([("c1", "chat", 100, 50, 0.3), ("c1", "chat", 90, 45, 0.3), ("c2", "chat", 80, 40, 0.3)])
    base = base.with_columns(pl.Series("turn_index", [1, 2, 1], dtype=pl.Int32))
    cand = base.with_columns(pl.col("spec_verify_ct") // 2)
    paired = pair(base, cand)
    assert sorted(paired.table["unit"].to_list()) == ["c1#turn1", "c1#turn2", "c2#turn1"]
    rule = PromotionRule(min_prompts=2)
    overall, sources = judge(paired, rule, rates_compared=True)
    assert overall.prompts == 3 and sources[0].prompts == 3


def test_the_rule_file_is_validated_with_one_line_per_problem(tmp_path) -> None:
    rule = load_rule(PROJECT_ROOT / "expectations")
    assert rule == PromotionRule() and rule.confidence == 0.95  # the file and the defaults agree
    with pytest.raises(RuleError, match="drafter_promotion.json: the promotion rule file is missing"):
        load_rule(tmp_path)
    (tmp_path / "drafter_promotion.json").write_text("{not json")
    with pytest.raises(RuleError, match="not valid JSON"):
        load_rule(tmp_path)
    bad = {"rule": {"margin": 0, "no_source_worse": "yes", "min_prompts": 1, "confidence": 1.5, "resamples": 10,
                    "seed": -1, "mrgin": 0.1}}  # fmt: skip
    with pytest.raises(RuleError) as e:
        parse_rule(bad, source="x.json")
    lines = str(e.value).splitlines()
    assert lines == [
        "x.json: field 'rule.mrgin' is not a known field (one of margin, no_source_worse, min_prompts, confidence, "
        "resamples, seed)",
        "x.json: field 'rule.margin': must be a number > 0, got 0",
        "x.json: field 'rule.no_source_worse': must be true or false, got 'yes'",
        "x.json: field 'rule.min_prompts': must be an integer >= 2, got 1",
        "x.json: field 'rule.confidence': must be a number in (0.5, 1), got 1.5",
        "x.json: field 'rule.resamples': must be an integer from 100 to 100000, got 10",
        "x.json: field 'rule.seed': must be an integer >= 0, got -1",
    ]
    with pytest.raises(RuleError, match="field 'rule.seed' is missing"):
        parse_rule({"rule": {k: v for k, v in PromotionRule().as_dict().items() if k != "seed"}}, source="y")
    assert (
        json.loads((PROJECT_ROOT / "expectations" / "drafter_promotion.json").read_text())["name"]
        == "drafter_promotion"
    )
