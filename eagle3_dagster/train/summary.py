"""What a training set looks like, as numbers: distribution summaries.

`sample_stats(samples, profile)` computes one row of scalar statistics per training sample with the
same definitions as the generations gate (eagle3_dagster.quality.features.output_lengths, the lengths
generation_features reports, on the output part of `input_ids`): reasoning = tokens before the profile's think-end id, answer = tokens after it
up to a tool call or the end-of-turn id, tool call = the profile's call-begin id present.
`summarize(stats)` turns them into the JSON stored with every snapshot (manifest `summary`) and
beside every shard's training table (`training_samples/shard=NNNN/summary.json`):

    rows, sources {name: rows}, source_mix {name: share}, model_revisions / sampling_hashes {value: rows},
    model_revision / sampling_hash (the most common one), finish_reasons {reason: rows},
    think_end_rate, length_finish_rate, tool_call_rate,
    lengths {prompt_len|output_len|reasoning_len|answer_len: {n, mean, min, p5, p25, p50, p75, p95, max}},
    histograms {same columns: {edges, counts}}  (20 equal bins over [0, max]),
    same_answer_rows {k: rows}  (rows whose output ids are exactly those of k different prompts, k >= 2
                                 only: one answer sent for many prompts; the publish gate judges it)

The snapshot's content identity (ContentHasher) is publish/identity.py.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict, cast

import numpy as np
import polars as pl

from ..profiles import ModelProfile

SUMMARY_FILE = "summary.json"  # beside training_samples/shard=NNNN/part-0000.parquet
LENGTHS = ("prompt_len", "output_len", "reasoning_len", "answer_len")
QUANTILES = {"p5": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95}
HIST_BINS = 20
# the training_samples columns a summary needs
STAT_COLUMNS = (
    "sample_id",
    "prompt_id",
    "source",
    "input_ids",
    "prompt_len",
    "output_len",
    "finish_reason",
    "model_revision",
    "sampling_hash",
)


class LengthStats(TypedDict, total=False):
    """A length column's figures (`n` 0: no rows, and nothing else)."""

    n: int
    mean: float
    min: int
    p5: float
    p25: float
    p50: float
    p75: float
    p95: float
    max: int


class Histogram(TypedDict):
    edges: list[int]
    counts: list[int]


class Summary(TypedDict, total=False):
    """A distribution summary, as stored (JSON); one read from an older snapshot may lack later fields."""

    rows: int
    sources: dict[str, int]
    source_mix: dict[str, float]
    model_revisions: dict[str, int]
    model_revision: str | None
    sampling_hashes: dict[str, int]
    sampling_hash: str | None
    finish_reasons: dict[str, int]
    think_end_rate: float | None
    length_finish_rate: float | None
    tool_call_rate: float | None
    lengths: dict[str, LengthStats]
    histograms: dict[str, Histogram]
    same_answer_rows: dict[str, int]


def sample_stats(samples: pl.DataFrame, profile: ModelProfile) -> pl.DataFrame:
    """One row per training sample: source, finish_reason, model_revision, sampling_hash, the four
    lengths (reasoning/answer null when the output has no think-end), think_end, has_tool_call, and hashes of
    the prompt id and of the output ids (prompt_hash, output_hash: which prompts share one answer)."""
    from ..quality.features import output_lengths

    cols = {
        "source": pl.String,
        "finish_reason": pl.String,
        "model_revision": pl.String,
        "sampling_hash": pl.String,
        "prompt_len": pl.Int32,
        "output_len": pl.Int32,
        "reasoning_len": pl.Int32,
        "answer_len": pl.Int32,
        "think_end": pl.Boolean,
        "has_tool_call": pl.Boolean,
        "prompt_hash": pl.UInt64,
        "output_hash": pl.UInt64,
    }
    if samples.height == 0:
        return pl.DataFrame(schema=cols)
    out_ids = pl.col("input_ids").list.slice(pl.col("prompt_len"))
    return samples.select(
        pl.col("source").cast(pl.String),
        pl.col("finish_reason").cast(pl.String),
        pl.col("model_revision").cast(pl.String),
        pl.col("sampling_hash").cast(pl.String),
        pl.col("prompt_len").cast(pl.Int32),
        *output_lengths(out_ids, profile),
        pl.col("prompt_id").cast(pl.String).hash().alias("prompt_hash"),
        pl.when(out_ids.list.len() > 0).then(out_ids.hash()).otherwise(None).alias("output_hash"),
    ).cast(cols)  # type: ignore[arg-type]


def _counts(s: pl.Series) -> dict[str, int]:
    vc = s.fill_null("(none)").value_counts(sort=True)
    return {str(k): int(v) for k, v in vc.iter_rows()}


def _rate(s: pl.Series, n: int) -> float | None:
    return round(float(s.sum()) / n, 6) if n else None


def _histogram(values: np.ndarray) -> Histogram:
    if values.size == 0:
        return {"edges": [], "counts": []}
    top = int(values.max())
    width = max(1, math.ceil((top + 1) / HIST_BINS))
    edges = [i * width for i in range(HIST_BINS + 1)]
    counts, _ = np.histogram(values, bins=edges)
    return {"edges": edges, "counts": [int(c) for c in counts]}


def length_stats(s: pl.Series) -> LengthStats:
    v = s.drop_nulls().cast(pl.Float64).to_numpy()
    if len(v) == 0:
        return {"n": 0}
    out: dict[str, Any] = {"n": len(v), "mean": round(float(v.mean()), 3), "min": int(v.min())}
    for name, q in QUANTILES.items():
        out[name] = float(np.quantile(v, q))  # linear interpolation, as polars' "linear"
    out["max"] = int(v.max())
    return cast(LengthStats, out)


def summarize(stats: pl.DataFrame) -> Summary:
    """The distribution summary of a stats frame (see the module docstring for its fields)."""
    n = stats.height
    sources = _counts(stats["source"]) if n else {}
    revisions = _counts(stats["model_revision"]) if n else {}
    samplings = _counts(stats["sampling_hash"]) if n else {}
    return {
        "rows": n,
        "sources": sources,
        "source_mix": {k: round(v / n, 6) for k, v in sources.items()},
        "model_revisions": revisions,
        "model_revision": next(iter(revisions), None),
        "sampling_hashes": samplings,
        "sampling_hash": next(iter(samplings), None),
        "finish_reasons": _counts(stats["finish_reason"]) if n else {},
        "think_end_rate": _rate(stats["think_end"], n),
        "length_finish_rate": _rate(stats["finish_reason"] == "length", n),
        "tool_call_rate": _rate(stats["has_tool_call"], n),
        "lengths": {c: length_stats(stats[c]) for c in LENGTHS},
        "histograms": {c: _histogram(stats[c].drop_nulls().to_numpy()) for c in LENGTHS},
        "same_answer_rows": same_answer_rows(stats),
    }


def same_answer_rows(stats: pl.DataFrame) -> dict[str, int]:
    """{k: rows} for the rows whose output ids are exactly those of k >= 2 different prompts (no output: not
    counted); {} when every answer is its prompt's own."""
    if stats.height == 0 or "output_hash" not in stats.columns:
        return {}
    shared = (
        stats.filter(pl.col("output_hash").is_not_null())
        .select(pl.col("prompt_hash").n_unique().over("output_hash").alias("k"))
        .filter(pl.col("k") > 1)
        .group_by("k")
        .len()
        .sort("k")
    )
    return {str(k): int(n) for k, n in shared.iter_rows()}


def summarize_samples(samples: pl.DataFrame, profile: ModelProfile) -> Summary:
    return summarize(sample_stats(samples, profile))


def headline(summary: Summary) -> dict[str, float]:
    """The numbers worth a trend line across nights (numeric Dagster metadata)."""
    out: dict[str, float] = {"rows": float(summary.get("rows") or 0)}
    lengths = summary.get("lengths") or {}
    for c in LENGTHS:
        st = lengths.get(c) or LengthStats()
        for name, value in (("p50", st.get("p50")), ("p95", st.get("p95"))):
            if value is not None:
                out[f"{c}_{name}"] = float(value)
    out.update({r: float(v) for r, v in rates(summary).items() if v is not None})
    return out


def rates(summary: Summary) -> dict[str, float | None]:
    """The summary's rates by name (None: not in the summary, or no rows)."""
    return {
        "think_end_rate": summary.get("think_end_rate"),
        "length_finish_rate": summary.get("length_finish_rate"),
        "tool_call_rate": summary.get("tool_call_rate"),
    }
