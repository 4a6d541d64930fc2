"""Where the drafter is weak: the speculating server's per-row figures (generate/drafter.py) grouped.

Per shard, the `generations` step sums the stored figures of its current samples by source, by turn
(the turns of `regenerate: all_turns` conversations and agent loops; `1` for a single-turn prompt), by
output length bucket, with and without tool calls and by drafter, plus the accepted-drafts histogram and
the weakest prompts, into generations/shard=NNNN/acceptance.json (the quality report reads it) and float
metadata on the asset (the Dagster UI plots those across materializations).

Groups keep sums, never averages of averages (generate/group_acceptance.py defines a group's accept
length and rate, once, for every consumer). A row whose figures failed their checks
(`spec_metrics_inconsistent:<which>`) feeds nothing here: not a group, not the histogram, not the weakest
prompts; every group counts it in `left_out`, and the summary names the checks (`left_out_by_check`). A
summary is only for shards with rows that carry figures or were left out (a server that does not speculate
leaves none).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any, cast

import polars as pl

from ..generate.group_acceptance import LEFT_OUT, GroupAcceptance, group_acceptance, trusted_figures
from ..generate.store import iter_generations
from ..storage import DataPath, read_shard_json

ACCEPTANCE_FILE = "acceptance.json"
READ_COLUMNS = (
    "sample_id",
    "prompt_id",
    "source",
    "completion_tokens",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
    "drafter_id",
    "integrity_violations",
)
LENGTH_BUCKETS = ((512, "<512"), (2048, "512-2k"), (8192, "2k-8k"))


def _bucket(n: pl.Expr) -> pl.Expr:
    expr: Any = pl.when(n.is_null()).then(pl.lit("unknown"))
    for hi, label in LENGTH_BUCKETS:
        expr = expr.when(n < hi).then(pl.lit(label))
    return cast(pl.Expr, expr.otherwise(pl.lit(">=8k")))


def acceptance_rows(
    generations: Iterable[pl.DataFrame], features: pl.DataFrame, turn_index: pl.DataFrame | None = None
) -> pl.DataFrame:
    """One row per stored sample with figures: its sums plus source, turn, length bucket and tool-call flag
    (from the gate's features: row_id, output_len, has_tool_call). `turn_index`: sample_id, turn_index of
    the shard's conversation turns."""
    parts = [g.select([c for c in READ_COLUMNS if c in g.columns]) for g in generations]
    # rows with figures, and rows whose figures were flagged (left out of every group, and counted)
    trusted = [trusted_figures(p) for p in parts if "spec_verify_ct" in p.columns]
    frames = [t.filter(pl.col("spec_verify_ct").is_not_null() | pl.col(LEFT_OUT).is_not_null()) for t in trusted]
    if not frames or not sum(f.height for f in frames):
        return pl.DataFrame()
    rows = pl.concat(frames, how="diagonal_relaxed")
    feats = features.select(pl.col("row_id").alias("sample_id"), "output_len", pl.col("has_tool_call").fill_null(False))
    rows = rows.join(feats, on="sample_id", how="left")
    turns = (
        turn_index.select("sample_id", pl.col("turn_index").cast(pl.Int64))
        if turn_index is not None and turn_index.height
        else pl.DataFrame(schema={"sample_id": pl.String, "turn_index": pl.Int64})
    )
    rows = rows.join(turns, on="sample_id", how="left")
    return rows.with_columns(
        pl.col("turn_index").fill_null(1).cast(pl.String).alias("turn"),
        _bucket(pl.col("output_len")).alias("length"),
        pl.when(pl.col("has_tool_call"))
        .then(pl.lit("with tool calls"))
        .otherwise(pl.lit("no tool calls"))
        .alias("tools"),
        pl.col("source").fill_null("?"),
        pl.col("drafter_id").fill_null("unknown drafter"),
    )


def _groups(rows: pl.DataFrame, by: str) -> dict[str, dict[str, int]]:
    g = group_acceptance(rows, by).sort(by)
    keys = ("rows", "completion_tokens", "spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts")
    return {str(r[by]): {k: int(r[k] or 0) for k in (*keys, "left_out")} for r in g.iter_rows(named=True)}


def _histogram(rows: pl.DataFrame) -> list[int]:
    out: list[int] = []
    for h in rows["spec_correct_drafts_histogram"].drop_nulls().to_list():
        out += [0] * (len(h) - len(out))
        for k, n in enumerate(h):
            out[k] += int(n)
    return out


def acceptance_summary(rows: pl.DataFrame, *, weakest: int = 10) -> dict[str, Any] | None:
    """The shard's figures, grouped (sums of the trusted rows; the flagged ones counted in `left_out`); None
    when no row carries any and none was left out."""
    if not rows.height:
        return None
    per_row = rows.with_columns(
        (pl.col("spec_num_correct_drafts") / pl.col("spec_num_proposed_drafts")).alias("rate")
    ).filter(pl.col("rate").is_not_null() & pl.col("rate").is_finite())
    weak = per_row.sort(["rate", "sample_id"]).head(weakest)
    whole = GroupAcceptance.of(rows)
    return {
        "all": _groups(rows.with_columns(pl.lit("all").alias("_all")), "_all").get("all", {}),
        "left_out_by_check": dict(whole.left_out_by_check),
        "by_source": _groups(rows, "source"),
        "by_turn": _groups(rows, "turn"),
        "by_length": _groups(rows, "length"),
        "by_tools": _groups(rows, "tools"),
        "by_drafter": _groups(rows, "drafter_id"),
        "histogram": _histogram(rows),
        "weakest_prompts": [
            {
                "sample_id": r["sample_id"],
                "prompt_id": r["prompt_id"],
                "source": r["source"],
                "turn": r["turn"],
                "accept_rate": r["rate"],
            }
            for r in weak.iter_rows(named=True)
        ],
    }


def summary_group(summary: dict[str, Any] | None) -> GroupAcceptance:
    """The whole shard's group of a stored summary (its `all` sums and what was left out, by check)."""
    if not summary:
        return GroupAcceptance()
    return GroupAcceptance.from_sums(
        {**(summary.get("all") or {}), "left_out_by_check": summary.get("left_out_by_check")}
    )


def acceptance_metadata(summary: dict[str, Any] | None) -> dict[str, float]:
    """Float metadata for the generations asset (plotted across materializations); empty without figures.
    `spec_rows_left_out`: rows whose figures failed their checks (left out of the two ratios)."""
    if not summary or not summary.get("all"):
        return {}
    g = summary_group(summary)
    out = {"spec_rows": float(g.rows), "spec_rows_left_out": float(g.left_out)}
    for name, v in (("spec_accept_length", g.accept_length), ("spec_accept_rate", g.accept_rate)):
        if v is not None:
            out[name] = float(v)
    return out


def write_acceptance(gen_dir: DataPath, summary: dict[str, Any] | None) -> None:
    f = gen_dir / ACCEPTANCE_FILE
    if summary is None:
        f.unlink(missing_ok=True)
        return
    f.write_text(json.dumps(summary, indent=1, sort_keys=True))


def collect_acceptance(data: DataPath, shards: Iterable[int]) -> dict[str, dict[str, Any]]:
    return read_shard_json(data, "generations", shards, ACCEPTANCE_FILE)


def merge_groups(summaries: Iterable[dict[str, Any]], key: str) -> dict[str, GroupAcceptance]:
    """One group table summed over shards (their sums add up; their ratios would not)."""
    out: dict[str, GroupAcceptance] = {}
    for s in summaries:
        for name, g in (s.get(key) or {}).items():
            out[name] = out.get(name, GroupAcceptance()) + GroupAcceptance.from_sums(g)
    return out


def shard_acceptance(
    gen_dir: DataPath, active: pl.Series, features: pl.DataFrame, turns: pl.DataFrame | None, *, batch_rows: int = 512
) -> dict[str, Any] | None:
    """The shard's summary from its current samples (`active`) and conversation turns, written beside them
    (acceptance.json; removed when no row carries figures)."""
    gens: Iterator[pl.DataFrame] = iter_generations(gen_dir, only=active, batch_rows=batch_rows, columns=READ_COLUMNS)
    has_turns = turns is not None and turns.height > 0
    if turns is not None and has_turns:
        gens = itertools.chain(gens, [turns.select([c for c in READ_COLUMNS if c in turns.columns])])
    turn_index = turns.select("sample_id", "turn_index") if turns is not None and has_turns else None
    summary = acceptance_summary(acceptance_rows(gens, features, turn_index))
    write_acceptance(gen_dir, summary)
    return summary
