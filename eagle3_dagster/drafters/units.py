"""From stored rows to paired units: what the comparison's statistics run on.

A unit is one probe prompt (`prompt_id`), or one turn of a multi-turn probe conversation (`prompt_id`
and `turn_index`). Both drafters' rows are keyed the same way and joined on the unit: only units both
drafters answered with usable figures are compared, and the others are counted by why.

A row is left out of every figure when its spec figures are flagged `spec_metrics_inconsistent:*` in
its integrity_violations (flagged figures feed nothing) or it carries no figures (the server did not
speculate, a one-token answer has no verify step). Rows stored before the count columns existed keep
their length and rate: the counts are derived from them (verify steps = completion tokens / accept
length, exactly as SGLang defines it; proposed = verify steps x (draft tokens - 1), correct = rate x
proposed), which leaves the sums unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ..generate.drafter import INCONSISTENT
from .stats import Figures, Stratum

ROW_COLUMNS: dict[str, Any] = {
    "sample_id": pl.String,
    "prompt_id": pl.String,
    "source": pl.String,
    "turn_index": pl.Int32,  # null: a single-prompt row (one turn)
    "drafter_id": pl.String,
    "completion_tokens": pl.Int64,
    "spec_accept_length": pl.Float64,
    "spec_accept_rate": pl.Float64,
    "spec_verify_ct": pl.Int64,
    "spec_num_correct_drafts": pl.Int64,
    "spec_num_proposed_drafts": pl.Int64,
    "spec_num_draft_tokens": pl.Int64,
    "integrity_violations": pl.List(pl.String),
    "model_revision": pl.String,
    "sampling_hash": pl.String,
}
FIGURE_COLUMNS = ("completion", "verify", "correct", "proposed")


def conform(rows: pl.DataFrame) -> pl.DataFrame:
    """`rows` with exactly ROW_COLUMNS (a column it lacks is null), cast."""
    return rows.select(
        [(pl.col(c) if c in rows.columns else pl.lit(None)).cast(t).alias(c) for c, t in ROW_COLUMNS.items()]
    )


def flagged_expr() -> pl.Expr:
    """True for a row whose spec figures are flagged inconsistent (left out of every figure)."""
    return (
        pl.col("integrity_violations")
        .fill_null(pl.lit([], dtype=pl.List(pl.String)))
        .list.eval(pl.element().str.starts_with(INCONSISTENT))
        .list.any()
    )


def with_figures(rows: pl.DataFrame) -> pl.DataFrame:
    """The four per-row figures (floats; counts derived where a row stored only its length and rate)."""
    verify = pl.coalesce(
        pl.col("spec_verify_ct").cast(pl.Float64),
        (pl.col("completion_tokens") / pl.col("spec_accept_length")).round(0),
    )
    proposed = pl.coalesce(
        pl.col("spec_num_proposed_drafts").cast(pl.Float64),
        pl.when(pl.col("spec_num_draft_tokens") > 1)
        .then(verify * (pl.col("spec_num_draft_tokens") - 1))
        .otherwise(verify),  # draft tokens unknown: proportional within one drafter, the rate is unchanged
    )
    correct = pl.coalesce(pl.col("spec_num_correct_drafts").cast(pl.Float64), pl.col("spec_accept_rate") * proposed)
    return rows.with_columns(
        pl.col("completion_tokens").cast(pl.Float64).alias("completion"),
        verify.alias("verify"),
        correct.alias("correct"),
        proposed.alias("proposed"),
    )


@dataclass(frozen=True)
class Usable:
    """One drafter's rows, split: usable (with figures), flagged inconsistent, without figures."""

    rows: pl.DataFrame
    flagged: pl.DataFrame
    no_figures: pl.DataFrame


def usable_rows(rows: pl.DataFrame) -> Usable:
    """`rows` (any columns of ROW_COLUMNS) split as Usable; usable rows carry the four figures and `unit`."""
    rows = with_figures(conform(rows))
    rows = rows.with_columns(
        pl.when(pl.col("turn_index").is_null())
        .then(pl.col("prompt_id"))
        .otherwise(pl.col("prompt_id") + "#turn" + pl.col("turn_index").cast(pl.String))
        .alias("unit")
    )
    flagged = rows.filter(flagged_expr())
    rest = rows.filter(~flagged_expr())
    ok = pl.all_horizontal([pl.col(c).is_not_null() & pl.col(c).is_not_nan() for c in FIGURE_COLUMNS]) & (
        pl.col("verify") > 0
    )
    return Usable(rest.filter(ok), flagged, rest.filter(~ok))


@dataclass(frozen=True)
class Paired:
    """Both drafters' figures on the units both answered, and what was left out, per source."""

    table: pl.DataFrame  # source, unit, base_<figure>, cand_<figure>
    units_base: dict[str, int] = field(default_factory=dict)  # source -> units production answered
    left_out: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> why -> units

    def sources(self) -> list[str]:
        return sorted(set(self.table["source"].to_list()))

    def strata(self) -> list[Stratum]:
        out = []
        for name in self.sources():
            part = self.table.filter(pl.col("source") == name).sort("unit")
            out.append(
                Stratum(
                    name,
                    Figures(*(part[f"base_{f}"].to_numpy().astype(np.float64) for f in FIGURE_COLUMNS)),
                    Figures(*(part[f"cand_{f}"].to_numpy().astype(np.float64) for f in FIGURE_COLUMNS)),
                )
            )
        return out


def _count_by_source(df: pl.DataFrame, why: str, into: dict[str, dict[str, int]]) -> None:
    for r in df.group_by("source").len().iter_rows(named=True):
        into.setdefault(str(r["source"]), {})[why] = into.get(str(r["source"]), {}).get(why, 0) + int(r["len"])


def pair(base_rows: pl.DataFrame, cand_rows: pl.DataFrame) -> Paired:
    """Join production's and the candidate's rows on the unit (one row per unit and side expected: the
    latest is kept). A unit is left out, counted by why, when either side's figures are flagged
    inconsistent or missing, or the candidate has no row for it (a request that failed)."""
    base, cand = usable_rows(base_rows), usable_rows(cand_rows)
    keep = ["source", "unit", *FIGURE_COLUMNS]
    b = base.rows.unique("unit", keep="last").select(keep)
    c = cand.rows.unique("unit", keep="last").select(["unit", *FIGURE_COLUMNS])
    table = b.rename({f: f"base_{f}" for f in FIGURE_COLUMNS}).join(
        c.rename({f: f"cand_{f}" for f in FIGURE_COLUMNS}), on="unit", how="inner"
    )
    left: dict[str, dict[str, int]] = {}
    _count_by_source(base.flagged, "production figures flagged spec_metrics_inconsistent", left)
    _count_by_source(base.no_figures, "production row without acceptance figures", left)
    lost = b.join(c.select("unit"), on="unit", how="anti")
    cand_flagged = lost.join(cand.flagged.select("unit"), on="unit", how="semi")
    cand_empty = lost.join(cand.no_figures.select("unit"), on="unit", how="semi")
    missing = lost.join(pl.concat([cand.flagged, cand.no_figures]).select("unit"), on="unit", how="anti")
    _count_by_source(cand_flagged, "candidate figures flagged spec_metrics_inconsistent", left)
    _count_by_source(cand_empty, "candidate row without acceptance figures", left)
    _count_by_source(missing, "no candidate answer (request failed or not sent)", left)
    units_base = {str(r["source"]): int(r["len"]) for r in b.group_by("source").len().iter_rows(named=True)}
    return Paired(table, units_base, left)
