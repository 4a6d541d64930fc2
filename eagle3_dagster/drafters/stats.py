"""The statistics of a drafter comparison: pure functions on arrays, no I/O.

A group's acceptance has ONE definition, generate/group_acceptance.py's: accept length = Σ completion
tokens / Σ verify steps, accept rate = Σ correct drafts / Σ proposed drafts. Sums, never a mean of per-row
ratios: a long answer weighs by its tokens, as it does in serving. Each drafter's figure (`Figures.acceptance`)
is `group_acceptance.accept_length` / `accept_rate` on its units' sums (the units' terms: drafters/units.py),
so a comparison shows the number the report's probe tables show for the same rows. `ratio_of_sums` is that
definition vectorised over the bootstrap's resamples (the same sums and the same division, on arrays).

The interval of a difference (candidate - production) comes from a paired bootstrap over units (a
prompt, or a turn of a multi-turn probe): each resample draws units with replacement, the same units
for both drafters, and recomputes the ratio of sums for each. Resampling runs within each probe source
(stratum), so the overall interval keeps the probe set's mix of sources. Every stratum has its own
random stream, seeded from the rule's seed and the stratum's name, drawn in fixed blocks: the same
stored results give the same interval on any machine, and adding a source leaves the others' unchanged.

Probe sets are small (80 mt-bench prompts, a dozen per source), where the plain percentile interval is too
narrow: it is the "expanded percentile" interval (Hesterberg, "What Teachers Should Know About the
Bootstrap", 2015), whose tail probability is moved so that it matches a t interval's width at n units:
alpha' / 2 = Phi(-sqrt(n / (n - k)) t(alpha / 2, n - k)), k the number of strata. For large n it is the
percentile interval. A stratum of one unit has no interval (no_difference, too few).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from ..generate.group_acceptance import accept_length, accept_rate

OVERALL = "overall"
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no_difference"
BLOCK = 250  # resamples drawn at a time (part of the algorithm: the draws do not depend on memory or machine)
_FIGURES = ("completion", "verify", "correct", "proposed")


def ratio_of_sums(
    completion: np.ndarray, verify: np.ndarray, correct: np.ndarray, proposed: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(accept length, accept rate) of groups summed over the last axis (one group per resample):
    Σ completion / Σ verify and Σ correct / Σ proposed, group_acceptance.accept_length / accept_rate on
    arrays (nan where they give None: a denominator of 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v, p = verify.sum(axis=-1), proposed.sum(axis=-1)
        length = np.where(v > 0, completion.sum(axis=-1) / np.where(v > 0, v, 1), np.nan)
        rate = np.where(p > 0, correct.sum(axis=-1) / np.where(p > 0, p, 1), np.nan)
    return length, rate


@dataclass(frozen=True)
class Figures:
    """One drafter's figures per unit (prompt or turn), in the units' order: counts (int64 arrays of one
    length; whole numbers given as floats are taken, anything else is a ValueError)."""

    completion: np.ndarray
    verify: np.ndarray
    correct: np.ndarray
    proposed: np.ndarray

    def __post_init__(self) -> None:
        sizes = {len(getattr(self, f)) for f in _FIGURES}
        if len(sizes) != 1:
            raise ValueError(f"Figures: arrays of different lengths {sorted(sizes)}")
        for f in _FIGURES:
            values = np.asarray(getattr(self, f))
            whole = values.dtype.kind in "iub" or (
                values.dtype.kind == "f" and bool(np.all(np.isfinite(values) & (values == np.round(values))))
            )
            if not whole:
                raise ValueError(f"Figures: {f} must hold counts (whole numbers), got {values[:5]!r}")
            object.__setattr__(self, f, values.astype(np.int64))

    def __len__(self) -> int:
        return len(self.completion)

    def acceptance(self) -> tuple[float, float]:
        """(accept length, accept rate) of these units: accept_length / accept_rate on their sums (nan for None)."""
        length = accept_length(int(self.completion.sum()), int(self.verify.sum()))
        rate = accept_rate(int(self.correct.sum()), int(self.proposed.sum()))
        return (math.nan if length is None else length), (math.nan if rate is None else rate)


@dataclass(frozen=True)
class Stratum:
    """One probe source: both drafters' figures on the same units, in the same order."""

    name: str
    base: Figures
    cand: Figures

    def __post_init__(self) -> None:
        if len(self.base) != len(self.cand):
            raise ValueError(
                f"stratum {self.name}: {len(self.base)} production units, {len(self.cand)} candidate units"
            )


@dataclass(frozen=True)
class Estimate:
    """A difference candidate - production with its interval."""

    base: float
    cand: float
    difference: float
    lo: float
    hi: float

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    @property
    def verdict(self) -> str:
        return verdict(self.lo, self.hi)


def verdict(lo: float, hi: float) -> str:
    """`better` when the interval lies above 0, `worse` below, else `no_difference` (it includes 0)."""
    if lo > 0:
        return BETTER
    return WORSE if hi < 0 else NO_DIFFERENCE


def prompts_needed(n: int, half_width: float, margin: float) -> int:
    """About how many units would narrow an interval of `half_width` (seen with `n` units) to `margin`:
    the half-width shrinks as 1/sqrt(n), so n x (half_width / margin)^2."""
    return max(n, math.ceil(n * (half_width / margin) ** 2))


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (p > 0.5) by the Cornish-Fisher expansion around the normal one (Abramowitz and
    Stegun 26.7.5): within 0.01 of the exact value from 3 degrees of freedom, exact in the limit."""
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def expanded_tail(confidence: float, n: int, k: int = 1) -> float | None:
    """The lower quantile the expanded percentile interval reads (module docstring); None below 2 units a stratum."""
    df = n - k
    if df < 1:
        return None
    t = t_quantile(1 - (1 - confidence) / 2, df)
    return NormalDist().cdf(-math.sqrt(n / df) * t)


def _stream(seed: int, name: str) -> np.random.Generator:
    salt = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, salt])


def _resampled_sums(stratum: Stratum, rng: np.random.Generator, b: int) -> dict[str, np.ndarray]:
    """b resamples of the stratum's units: each figure's sum per resample, `base_*` and `cand_*`, shape (b,)."""
    n = len(stratum.base)
    idx = rng.integers(0, n, size=(b, n))
    out: dict[str, np.ndarray] = {}
    for side, figs in (("base", stratum.base), ("cand", stratum.cand)):
        for f in _FIGURES:
            out[f"{side}_{f}"] = np.take(getattr(figs, f), idx).sum(axis=1)
    return out


def _stacked(sums: Sequence[dict[str, np.ndarray]], side: str) -> tuple[np.ndarray, ...]:
    """A side's resampled sums as (b, strata) arrays: ratio_of_sums over them is the ratio of the totals."""
    return tuple(np.stack([s[f"{side}_{f}"] for s in sums], axis=-1) for f in _FIGURES)


def _differences(sums: Sequence[dict[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    base_len, base_rate = ratio_of_sums(*_stacked(sums, "base"))
    cand_len, cand_rate = ratio_of_sums(*_stacked(sums, "cand"))
    return cand_len - base_len, cand_rate - base_rate


def _estimate(
    base: Figures | Sequence[Figures],
    cand: Figures | Sequence[Figures],
    diffs: np.ndarray,
    tail: float | None,
    rate: bool,
) -> Estimate:
    b, c = _pooled(base), _pooled(cand)
    i = 1 if rate else 0
    b_val, c_val = b.acceptance()[i], c.acceptance()[i]
    finite = diffs[np.isfinite(diffs)]
    if tail is None or not finite.size:
        return Estimate(b_val, c_val, c_val - b_val, math.nan, math.nan)
    lo, hi = (float(x) for x in np.quantile(finite, (tail, 1 - tail)))
    return Estimate(b_val, c_val, c_val - b_val, lo, hi)


def _pooled(figs: Figures | Sequence[Figures]) -> Figures:
    if isinstance(figs, Figures):
        return figs
    return Figures(*(np.concatenate([getattr(f, name) for f in figs]) for name in _FIGURES))


@dataclass(frozen=True)
class Bootstrapped:
    """Per stratum name and OVERALL: the accept-length and accept-rate differences with their intervals."""

    length: dict[str, Estimate]
    rate: dict[str, Estimate]


def paired_bootstrap(strata: Sequence[Stratum], *, resamples: int, seed: int, confidence: float) -> Bootstrapped:
    """Paired, stratified percentile bootstrap of the differences candidate - production (module docstring)."""
    if not strata or any(len(s.base) == 0 for s in strata):
        raise ValueError("paired_bootstrap: every stratum needs at least one unit")
    names = [s.name for s in strata]
    if len(set(names)) != len(names) or OVERALL in names:
        raise ValueError(f"paired_bootstrap: stratum names must be distinct and not {OVERALL!r}: {names}")
    streams = [_stream(seed, s.name) for s in strata]
    per: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in [*names, OVERALL]}
    done = 0
    while done < resamples:
        b = min(BLOCK, resamples - done)
        sums = [_resampled_sums(s, rng, b) for s, rng in zip(strata, streams)]
        for s, one in zip(strata, sums):
            per[s.name].append(_differences([one]))
        per[OVERALL].append(_differences(sums))
        done += b
    length: dict[str, Estimate] = {}
    rate: dict[str, Estimate] = {}
    for name, blocks in per.items():
        d_len = np.concatenate([x[0] for x in blocks])
        d_rate = np.concatenate([x[1] for x in blocks])
        mine = strata if name == OVERALL else [s for s in strata if s.name == name]
        n = sum(len(s.base) for s in mine)
        tail = expanded_tail(confidence, n, len(mine)) if all(len(s.base) > 1 for s in mine) else None
        base, cand = [s.base for s in mine], [s.cand for s in mine]
        length[name] = _estimate(base, cand, d_len, tail, rate=False)
        rate[name] = _estimate(base, cand, d_rate, tail, rate=True)
    return Bootstrapped(length, rate)
