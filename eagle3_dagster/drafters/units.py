"""From stored rows to paired units: what the comparison's statistics run on.

A unit is one probe prompt (`prompt_id`), or one turn of a multi-turn probe conversation (`prompt_id`
and `turn_index`). Both drafters' rows are keyed the same way and joined on the unit: only units both
drafters answered with usable figures are compared, and the others are counted by why.

Which rows count, and what each adds to a group's sums, is the one definition of a group's acceptance
(generate/group_acceptance.py), the one the report's probe tables use: `trusted_figures` leaves out a
row whose figures are flagged `spec_metrics_inconsistent:*` (in its integrity_violations, or the
`spec_left_out` a probe result stores), and `row_terms` gives each usable row's completion tokens, verify
steps, correct and proposed drafts. A row stored without the counts (a probe result written before the sums
were kept: a length and a rate only) is left out and counted, as the report leaves it out: verify steps
rounded back from a stored length would be an estimate, not SGLang's count. So the same rows give the same
accept length and rate here as in the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ..generate.group_acceptance import LEFT_OUT, row_terms, trusted_figures
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
# why a unit is left out (after "production " or "candidate ")
FLAGGED = "figures flagged spec_metrics_inconsistent"
NO_SUMS = "row stored without the acceptance sums (written before they were kept)"
NO_FIGURES = "row without acceptance figures"
MISSING = "no candidate answer (request failed or not sent)"


def conform(rows: pl.DataFrame) -> pl.DataFrame:
    """`rows` with exactly ROW_COLUMNS (a column it lacks is null), cast, and `spec_left_out` (the checks a
    stored probe result's figures failed; null where none or not stored)."""
    cols = [(pl.col(c) if c in rows.columns else pl.lit(None)).cast(t).alias(c) for c, t in ROW_COLUMNS.items()]
    left = (pl.col(LEFT_OUT) if LEFT_OUT in rows.columns else pl.lit(None)).cast(pl.String).alias(LEFT_OUT)
    return rows.select(*cols, left)


# a unit's figure -> the row term (group_acceptance.row_terms) it is
_TERMS = {
    "completion": "completion_tokens",
    "verify": "spec_verify_ct",
    "correct": "spec_num_correct_drafts",
    "proposed": "spec_num_proposed_drafts",
}


def with_figures(rows: pl.DataFrame) -> pl.DataFrame:
    """`rows` (after trusted_figures) with the four per-row figures: each row's terms of its group's sums
    (group_acceptance.row_terms, Int64) and `counts` (it had a verify step)."""
    terms = row_terms()
    return rows.with_columns(
        *(terms[col].alias(figure) for figure, col in _TERMS.items()),
        (terms["rows"] == 1).alias("counts"),
    )


@dataclass(frozen=True)
class Usable:
    """One drafter's rows, split: usable (with figures), flagged inconsistent, stored without the counts,
    without figures (the server did not speculate; a one-token answer has no verify step)."""

    rows: pl.DataFrame
    flagged: pl.DataFrame
    no_sums: pl.DataFrame
    no_figures: pl.DataFrame


def usable_rows(rows: pl.DataFrame) -> Usable:
    """`rows` (any columns of ROW_COLUMNS) split as Usable; usable rows carry the four figures and `unit`."""
    rows = with_figures(trusted_figures(conform(rows)))
    rows = rows.with_columns(
        pl.when(pl.col("turn_index").is_null())
        .then(pl.col("prompt_id"))
        .otherwise(pl.col("prompt_id") + "#turn" + pl.col("turn_index").cast(pl.String))
        .alias("unit")
    )
    flagged = pl.col(LEFT_OUT).is_not_null()
    no_sums = ~flagged & pl.col("spec_verify_ct").is_null() & pl.col("spec_accept_length").is_not_null()
    return Usable(
        rows.filter(pl.col("counts")),
        rows.filter(flagged),
        rows.filter(no_sums),
        rows.filter(~pl.col("counts") & ~flagged & ~no_sums),
    )


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
                    Figures(*(part[f"base_{f}"].to_numpy().astype(np.int64) for f in FIGURE_COLUMNS)),
                    Figures(*(part[f"cand_{f}"].to_numpy().astype(np.int64) for f in FIGURE_COLUMNS)),
                )
            )
        return out


def _count_by_source(df: pl.DataFrame, why: str, into: dict[str, dict[str, int]]) -> None:
    for r in df.group_by("source").len().iter_rows(named=True):
        into.setdefault(str(r["source"]), {})[why] = into.get(str(r["source"]), {}).get(why, 0) + int(r["len"])


def pair(base_rows: pl.DataFrame, cand_rows: pl.DataFrame) -> Paired:
    """Join production's and the candidate's rows on the unit (one row per unit and side expected: the
    latest is kept). A unit is left out, counted by why, when either side's figures are flagged
    inconsistent, stored without the counts or missing, or the candidate has no row for it (a request that
    failed)."""
    base, cand = usable_rows(base_rows), usable_rows(cand_rows)
    keep = ["source", "unit", *FIGURE_COLUMNS]
    b = base.rows.unique("unit", keep="last").select(keep)
    c = cand.rows.unique("unit", keep="last").select(["unit", *FIGURE_COLUMNS])
    table = b.rename({f: f"base_{f}" for f in FIGURE_COLUMNS}).join(
        c.rename({f: f"cand_{f}" for f in FIGURE_COLUMNS}), on="unit", how="inner"
    )
    left: dict[str, dict[str, int]] = {}
    lost = b.join(c.select("unit"), on="unit", how="anti")  # production's usable units without a usable candidate row
    splits = ((FLAGGED, base.flagged, cand.flagged), (NO_SUMS, base.no_sums, cand.no_sums),
              (NO_FIGURES, base.no_figures, cand.no_figures))  # fmt: skip
    for why, prod_rows, cand_rows in splits:
        _count_by_source(prod_rows, f"production {why}", left)
        _count_by_source(lost.join(cand_rows.select("unit"), on="unit", how="semi"), f"candidate {why}", left)
    answered = pl.concat([rows.select("unit") for _, _, rows in splits])
    _count_by_source(lost.join(answered, on="unit", how="anti"), MISSING, left)
    units_base = {str(r["source"]): int(r["len"]) for r in b.group_by("source").len().iter_rows(named=True)}
    return Paired(table, units_base, left)
