"""The verdicts and the decision of a drafter comparison: pure functions of paired figures and the rule.

    judge(paired, rule, rates_compared) -> (overall, sources)     per source and overall: both drafters'
                                                                  accept length, the difference, its interval
                                                                  and verdict; too few prompts said, with how
                                                                  many it would take
    decide(overall, sources, rule, holds) -> (decision, reasons)  promote or hold, and why

The decision rests on accept lengths only. Accept rates are compared (and shown) only when both drafters
propose the same number of drafts per step (`speculative_num_draft_tokens`): a larger draft budget lowers
the rate mechanically, so across budgets a rate says nothing about the drafter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .rule import PromotionRule
from .stats import BETTER, OVERALL, WORSE, Estimate, paired_bootstrap, prompts_needed
from .units import Paired

PROMOTE, HOLD = "promote", "hold"


def _r(v: float | None, nd: int = 6) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), nd)


@dataclass(frozen=True)
class SourceResult:
    """One probe source (or `overall`): the units compared and both drafters' figures with the difference."""

    source: str
    prompts: int
    length: Estimate
    rate: Estimate | None  # None: the rates are not comparable (different draft budgets)
    too_few: str | None = None  # why this many prompts cannot decide, with how many would
    prompts_needed: int | None = None
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return self.length.verdict

    def as_json(self, confidence: float) -> dict[str, Any]:
        interval = [_r(self.length.lo), _r(self.length.hi)]
        out: dict[str, Any] = {
            "source": self.source,
            "prompts": self.prompts,
            "production_accept_length": _r(self.length.base),
            "candidate_accept_length": _r(self.length.cand),
            "difference": _r(self.length.difference),
            "interval": interval,
            "confidence": confidence,
            "verdict": self.verdict,
            "production_accept_rate": _r(self.rate.base) if self.rate else None,
            "candidate_accept_rate": _r(self.rate.cand) if self.rate else None,
            "rate_difference": _r(self.rate.difference) if self.rate else None,
            "rate_interval": [_r(self.rate.lo), _r(self.rate.hi)] if self.rate else None,
            "too_few": self.too_few,
            "prompts_needed": self.prompts_needed,
            "left_out": dict(self.left_out),
        }
        if math.isclose(confidence, 0.95):
            out["ci95"] = interval
        return out


def too_few(name: str, n: int, est: Estimate, rule: PromotionRule) -> tuple[str | None, int | None]:
    """(the line saying these prompts cannot decide, how many would) or (None, None) when they can."""
    hw = est.half_width
    known = math.isfinite(hw) and hw > 0
    needed = prompts_needed(n, hw, rule.margin) if known else rule.min_prompts
    if n < rule.min_prompts:
        need = max(rule.min_prompts, needed)
        width = f"interval ±{hw:.2f}" if known else "no interval"
        return (
            f"{name}: {n} prompts, fewer than the rule's min_prompts {rule.min_prompts} ({width}): too few to "
            f"decide; about {need} would",
            need,
        )
    if hw > rule.margin:
        return (
            f"{name}: {n} prompts, interval ±{hw:.2f}: too few to tell a {rule.margin:g} difference; "
            f"about {needed} prompts would",
            needed,
        )
    return None, None


def _result(
    name: str, n: int, length: Estimate, rate: Estimate | None, rule: PromotionRule, left: dict[str, int]
) -> SourceResult:
    line, need = too_few(name, n, length, rule)
    return SourceResult(name, n, length, rate, line, need, left)


def judge(paired: Paired, rule: PromotionRule, *, rates_compared: bool) -> tuple[SourceResult, list[SourceResult]]:
    """The overall result and one per probe source (sorted by name), from the paired units."""
    strata = paired.strata()
    boot = paired_bootstrap(strata, resamples=rule.resamples, seed=rule.seed, confidence=rule.confidence)
    sources = [
        _result(
            s.name,
            len(s.base),
            boot.length[s.name],
            boot.rate[s.name] if rates_compared else None,
            rule,
            paired.left_out.get(s.name, {}),
        )
        for s in strata
    ]
    left_all: dict[str, int] = {}
    for per in paired.left_out.values():
        for why, k in per.items():
            left_all[why] = left_all.get(why, 0) + k
    n_all = sum(len(s.base) for s in strata)
    rate = boot.rate[OVERALL] if rates_compared else None
    return _result(OVERALL, n_all, boot.length[OVERALL], rate, rule, left_all), sources


def interval_text(est: Estimate) -> str:
    return f"{est.difference:+.3f} [{est.lo:+.3f}, {est.hi:+.3f}]"


def decide(
    overall: SourceResult, sources: list[SourceResult], rule: PromotionRule, holds: list[str] | None = None
) -> tuple[str, list[str]]:
    """`promote` when the overall accept length is better by at least the margin (its interval above 0), no
    source is worse (rule.no_source_worse), the comparison has enough prompts and nothing else holds it
    (`holds`: e.g. probe prompts the candidate did not answer); else `hold`. The reasons name each cause."""
    reasons = list(holds or [])
    length = overall.length
    if overall.prompts < rule.min_prompts:
        reasons.append(overall.too_few or f"overall: {overall.prompts} prompts, fewer than min_prompts")
    if overall.verdict != BETTER:
        reasons.append(
            f"overall accept length is {overall.verdict.replace('_', ' ')}: {interval_text(length)}"
            + (" includes 0" if overall.verdict != WORSE else "")
        )
    elif length.difference < rule.margin:
        reasons.append(f"overall better by {interval_text(length)}, less than the margin {rule.margin:g}")
    worse = [s for s in sources if s.verdict == WORSE]
    if rule.no_source_worse:
        reasons += [f"{s.source} is worse: {interval_text(s.length)}" for s in worse]
    if reasons:
        return HOLD, reasons
    why = [f"overall better by {interval_text(length)}, at least the margin {rule.margin:g}"]
    if rule.no_source_worse:
        why.append(f"no probe source worse ({len(sources)} compared)")
    elif worse:
        why.append(f"worse on {', '.join(s.source for s in worse)} (allowed: no_source_worse is false)")
    return PROMOTE, why
