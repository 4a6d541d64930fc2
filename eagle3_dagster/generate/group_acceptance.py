"""A group's acceptance, defined once. Every consumer of the per-row figures (acceptance.json and the
quality report, the `generations` asset's UI metadata, the probe results' drafter tables, the nightly drift
entries) groups them here:

- accept length = Σ completion_tokens / Σ spec_verify_ct (tokens per verify step, the bonus token included,
  as SGLang defines it for one request);
- accept rate = Σ spec_num_correct_drafts / Σ spec_num_proposed_drafts.

Sums, never a mean of the rows' ratios (that would weigh a 10-token answer like a 10,000-token one and make
the same rows read differently in two tables). Groups add up by adding their sums (`GroupAcceptance.__add__`).

Only trusted figures count. A row whose figures failed their own checks (`spec_metrics_inconsistent:<which>`
in `integrity_violations`, generate/drafter.py) feeds nothing: `trusted_figures` nulls its figures and names
the failed checks in `spec_left_out`, and a group counts the rows it left out (`left_out`, and by check), so
every consumer can say how many it left out and why. A row counts when it has a verify step; a row without
the counts (stored before they were kept: a length and a rate only) counts in no sum, and nothing is derived
from its rounded length. `row_terms` gives each row's share of the sums, which is what a group adds up (the
drafter comparison's bootstrap resamples these per prompt: drafters/units.py).

    trusted = trusted_figures(rows)          # rows: completion_tokens, the spec_* columns, integrity_violations
    g = GroupAcceptance.of(trusted)          # g.accept_length, g.accept_rate, g.rows, g.left_out
    per = group_acceptance(trusted, "drafter_id")   # one row per group: the sums, both ratios, left_out
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from .drafter import INCONSISTENT

FIGURE_COLUMNS = (
    "spec_accept_length",
    "spec_accept_rate",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
)
SUM_COLUMNS = ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts")
LEFT_OUT = "spec_left_out"  # the row's failed figure checks, comma-joined (`accept_length,histogram_total`)
_PREFIX = f"{INCONSISTENT}:"


def accept_length(completion_tokens: int, verify_steps: int) -> float | None:
    """Tokens per verify step over a group: Σ completion tokens / Σ verify steps (None without a step)."""
    return completion_tokens / verify_steps if verify_steps > 0 else None


def accept_rate(correct_drafts: int, proposed_drafts: int) -> float | None:
    """Accepted drafts over proposed drafts of a group: Σ correct / Σ proposed (None without a proposal)."""
    return correct_drafts / proposed_drafts if proposed_drafts > 0 else None


def failed_checks(violations: Sequence[str] | None) -> list[str]:
    """The figure checks a row failed, from its integrity_violations (`accept_length`, `length_below_1`, ...)."""
    return [v[len(_PREFIX) :] for v in violations or () if v.startswith(_PREFIX)]


def trusted_figures(rows: pl.DataFrame) -> pl.DataFrame:
    """`rows` with the figures of every row that failed a figure check set to null and `spec_left_out` naming
    those checks (null on every other row). The one rule for which rows' figures feed nothing, for every
    consumer. Rows without `integrity_violations` (or with a null list) are judged by the `spec_left_out` they
    already carry (probe results store it: their flags are not kept), else taken as unflagged."""
    kept = pl.col(LEFT_OUT).cast(pl.String) if LEFT_OUT in rows.columns else pl.lit(None, dtype=pl.String)
    if "integrity_violations" not in rows.columns:
        out = rows.with_columns(kept.alias(LEFT_OUT))
    else:
        checks = (
            pl.col("integrity_violations")
            .cast(pl.List(pl.String))
            .list.eval(pl.element().filter(pl.element().str.starts_with(_PREFIX)).str.strip_prefix(_PREFIX))
            .list.join(",")
        )
        out = rows.with_columns(pl.coalesce(pl.when(checks != "").then(checks), kept).alias(LEFT_OUT))
    flagged = pl.col(LEFT_OUT).is_not_null()
    return out.with_columns(
        pl.when(flagged).then(None).otherwise(pl.col(c)).alias(c) for c in FIGURE_COLUMNS if c in out.columns
    )


def _counted() -> pl.Expr:
    """A row whose (trusted) figures count: it had at least one verify step."""
    return pl.col("spec_verify_ct").is_not_null() & (pl.col("spec_verify_ct") > 0)


def _proposing() -> pl.Expr:
    return _counted() & pl.col("spec_num_proposed_drafts").is_not_null()


def _term(col: str, where: pl.Expr) -> pl.Expr:
    return pl.when(where).then(pl.col(col).cast(pl.Int64).fill_null(0)).otherwise(0).cast(pl.Int64).alias(col)


def row_terms() -> dict[str, pl.Expr]:
    """Each row's share of its group's sums (rows after `trusted_figures`), Int64, 0 where the row does not
    count: `rows` (1: it counts, it had a verify step), `completion_tokens` and `spec_verify_ct` (of a row that
    counts), `spec_num_correct_drafts` and `spec_num_proposed_drafts` (of a row that counts and says what it
    proposed). A group's sums are the sums of its rows' terms; its ratios are `accept_length`/`accept_rate`."""
    return {
        "rows": _counted().cast(pl.Int64).alias("rows"),
        "completion_tokens": _term("completion_tokens", _counted()),
        "spec_verify_ct": _term("spec_verify_ct", _counted()),
        "spec_num_correct_drafts": _term("spec_num_correct_drafts", _proposing()),
        "spec_num_proposed_drafts": _term("spec_num_proposed_drafts", _proposing()),
    }


def _term_exprs(left_out: bool) -> list[pl.Expr]:
    left = (pl.col(LEFT_OUT).is_not_null() if left_out else pl.lit(0)).cast(pl.Int64).alias("left_out")
    return [*row_terms().values(), left]


def with_ratios(sums: pl.DataFrame) -> pl.DataFrame:
    """The two ratios from a frame of group sums (`group_acceptance`'s columns), as `accept_length` and
    `accept_rate` defines them (null without a verify step / a proposal)."""
    tokens, steps = pl.col("completion_tokens"), pl.col("spec_verify_ct")
    correct, proposed = pl.col("spec_num_correct_drafts"), pl.col("spec_num_proposed_drafts")
    return sums.with_columns(
        pl.when(steps > 0).then(tokens / steps).otherwise(None).cast(pl.Float64).alias("accept_length"),
        pl.when(proposed > 0).then(correct / proposed).otherwise(None).cast(pl.Float64).alias("accept_rate"),
    )


def group_acceptance(trusted: pl.DataFrame, *by: str) -> pl.DataFrame:
    """One row per group of `by` (one row for the whole frame without `by`): rows counted, the four sums,
    left_out (rows whose figures failed their checks), accept_length and accept_rate. `trusted`: rows after
    `trusted_figures`."""
    terms = trusted.select(*by, *_term_exprs(LEFT_OUT in trusted.columns))
    totals = pl.all().sum()
    sums = terms.group_by(list(by), maintain_order=True).agg(totals) if by else terms.select(totals)
    return with_ratios(sums)


@dataclass(frozen=True)
class GroupAcceptance:
    """One group's sums (its trusted rows) and the rows it left out; its ratios by the one definition."""

    rows: int = 0
    completion_tokens: int = 0
    verify_steps: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    left_out: int = 0  # rows whose figures failed their checks
    left_out_by_check: Mapping[str, int] = field(default_factory=dict)

    @property
    def accept_length(self) -> float | None:
        return accept_length(self.completion_tokens, self.verify_steps)

    @property
    def accept_rate(self) -> float | None:
        return accept_rate(self.correct_drafts, self.proposed_drafts)

    def __add__(self, other: GroupAcceptance) -> GroupAcceptance:
        by = dict(self.left_out_by_check)
        for k, n in other.left_out_by_check.items():
            by[k] = by.get(k, 0) + n
        return GroupAcceptance(
            self.rows + other.rows,
            self.completion_tokens + other.completion_tokens,
            self.verify_steps + other.verify_steps,
            self.correct_drafts + other.correct_drafts,
            self.proposed_drafts + other.proposed_drafts,
            self.left_out + other.left_out,
            dict(sorted(by.items())),
        )

    @classmethod
    def of(cls, trusted: pl.DataFrame) -> GroupAcceptance:
        """The group of every row of `trusted` (rows after `trusted_figures`)."""
        if trusted.height == 0:
            return cls()
        s = group_acceptance(trusted).row(0, named=True)
        by: dict[str, int] = {}
        if LEFT_OUT in trusted.columns:
            for joined in trusted.get_column(LEFT_OUT).drop_nulls().to_list():
                for check in joined.split(","):
                    by[check] = by.get(check, 0) + 1
        return cls(
            int(s["rows"] or 0),
            int(s["completion_tokens"] or 0),
            int(s["spec_verify_ct"] or 0),
            int(s["spec_num_correct_drafts"] or 0),
            int(s["spec_num_proposed_drafts"] or 0),
            int(s["left_out"] or 0),
            dict(sorted(by.items())),
        )

    @classmethod
    def from_sums(cls, sums: Mapping[str, Any]) -> GroupAcceptance:
        """From a stored group (`as_sums`' keys; acceptance.json's groups); absent keys read as 0."""
        return cls(
            int(sums.get("rows") or 0),
            int(sums.get("completion_tokens") or 0),
            int(sums.get("spec_verify_ct") or 0),
            int(sums.get("spec_num_correct_drafts") or 0),
            int(sums.get("spec_num_proposed_drafts") or 0),
            int(sums.get("left_out") or 0),
            {str(k): int(v) for k, v in (sums.get("left_out_by_check") or {}).items()},
        )

    def as_sums(self) -> dict[str, Any]:
        """The stored form (column names as in the generations table); `from_sums` reads it back."""
        return {
            "rows": self.rows,
            "completion_tokens": self.completion_tokens,
            "spec_verify_ct": self.verify_steps,
            "spec_num_correct_drafts": self.correct_drafts,
            "spec_num_proposed_drafts": self.proposed_drafts,
            "left_out": self.left_out,
            "left_out_by_check": dict(self.left_out_by_check),
        }

    def left_out_text(self, what: str = "row(s)") -> str:
        """`3 row(s) left out: their figures failed their checks (accept_length 2, length_below_1 1)`; '' for none."""
        if not self.left_out:
            return ""
        checks = ", ".join(f"{k} {n}" for k, n in self.left_out_by_check.items())
        return (
            f"{self.left_out} {what} left out: their speculative-decoding figures failed their checks "
            f"(spec_metrics_inconsistent: {checks})"
        )
