"""Probe results: every drafter version's acceptance on the probe prompts, kept per shard.

`<data>/probes/results/shard=NNNN.parquet` holds one row per probe sample (one probe prompt x one
drafter x one probe seed; for a probe conversation regenerated turn by turn, one per turn: `prompt_id`
is the conversation's, `turn_index` the turn, null for a single prompt): its source, drafter, the server's
acceptance figures as stored in the generations table (null, with `spec_left_out` naming the failed checks,
where they failed their checks: generate/group_acceptance.py), and when the fleet was first and last seen
running that drafter on it. A run
upserts the shard's current probe samples (first_seen kept, last_seen = now); the rows of other
drafters are never touched, so a drafter's results outlive its replacement.
`drafter_versions` aggregates all shards into the table the report shows (docs/probes.md), by the one
definition of a group's acceptance (Σ tokens / Σ verify steps, Σ correct / Σ proposed). Results written
before the sums were kept read them as null: those rows count as probe prompts without figures.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from ..storage import DataPath, PathLike, as_data_path, read_parquet, write_frame_atomic
from .group_acceptance import LEFT_OUT, group_acceptance, trusted_figures
from .probes import ProbeKeys, probe_prompt_ids
from .store import iter_generations

PROBES_DIR = "probes"
RESULT_COLUMNS: dict[str, Any] = {
    "sample_id": pl.String,
    "prompt_id": pl.String,
    "source": pl.String,
    "turn_index": pl.Int32,  # a probe conversation's turn (1-based); null: a single prompt
    "drafter_key": pl.String,  # the fleet's drafter ids (probes.fleet_drafter_key), as in the cache key
    "drafter_id": pl.String,  # the serving endpoint's drafter (null: it did not speculate)
    "spec_draft_model_path": pl.String,
    "spec_draft_model_revision": pl.String,
    "spec_accept_length": pl.Float64,
    "spec_accept_rate": pl.Float64,
    "completion_tokens": pl.Int32,
    # the sums a group's acceptance is made of (generate/group_acceptance.py)
    "spec_verify_ct": pl.Int64,
    "spec_num_correct_drafts": pl.Int64,
    "spec_num_proposed_drafts": pl.Int64,
    LEFT_OUT: pl.String,  # the figure checks the row failed (its figures are null); null: trusted or none
    "generated_at": pl.Datetime("us", "UTC"),
    "first_seen": pl.Datetime("us", "UTC"),
    "last_seen": pl.Datetime("us", "UTC"),
}
# a result row from its generations row (after trusted_figures)
GENERATION_COLUMNS = [c for c in RESULT_COLUMNS if c not in ("turn_index", "drafter_key", "first_seen", "last_seen")]
READ_COLUMNS = [*(c for c in GENERATION_COLUMNS if c != LEFT_OUT), "integrity_violations"]


def conform_results(df: pl.DataFrame) -> pl.DataFrame:
    """RESULT_COLUMNS, cast; a column a file was written without (turn_index, the sums, spec_left_out: files
    from before them) is null."""
    return df.select(
        [(pl.col(c) if c in df.columns else pl.lit(None)).cast(t).alias(c) for c, t in RESULT_COLUMNS.items()]
    )


def results_path(data: PathLike, shard: int) -> PathLike:
    return as_data_path(data) / PROBES_DIR / "results" / f"shard={shard:04d}.parquet"


def merge_results(old: pl.DataFrame | None, current: pl.DataFrame, drafter_key: str, now: datetime) -> pl.DataFrame:
    """`old` with this run's probe samples (`current`: generations rows, a conversation turn's with its
    turn_index; figures that failed their checks are kept out, trusted_figures) upserted by sample_id."""
    trusted = current if LEFT_OUT in current.columns else trusted_figures(current)
    turn = [pl.col("turn_index")] if "turn_index" in trusted.columns else []
    cur = trusted.select(*GENERATION_COLUMNS, *turn).with_columns(
        pl.lit(drafter_key).alias("drafter_key"),
        pl.lit(now).cast(RESULT_COLUMNS["first_seen"]).alias("first_seen"),
        pl.lit(now).cast(RESULT_COLUMNS["last_seen"]).alias("last_seen"),
    )
    cur = conform_results(cur)
    if old is None or old.height == 0:
        return cur.sort("sample_id")
    old = conform_results(old)
    seen = old.filter(pl.col("sample_id").is_in(cur["sample_id"].implode())).select("sample_id", "first_seen")
    cur = (
        cur.drop("first_seen")
        .join(seen, on="sample_id", how="left")
        .with_columns(pl.col("first_seen").fill_null(pl.lit(now).cast(RESULT_COLUMNS["first_seen"])))
    )
    kept = old.filter(~pl.col("sample_id").is_in(cur["sample_id"].implode()))
    return pl.concat([kept, cur.select(list(RESULT_COLUMNS))]).sort("sample_id")


def update_shard_results(
    data: PathLike, shard: int, current: pl.DataFrame, drafter_key: str, now: datetime
) -> pl.DataFrame:
    """Upsert the shard's current probe samples into its results file; returns the whole file."""
    path = as_data_path(results_path(data, shard))
    old = read_parquet(path) if path.exists() else None
    merged = merge_results(old, current, drafter_key, now)
    write_frame_atomic(merged, path)
    return merged


def read_all_results(data: PathLike) -> pl.DataFrame:
    """Every shard's probe results (empty, with the columns, when there are none)."""
    folder = as_data_path(data) / PROBES_DIR / "results"
    files = folder.glob("shard=*.parquet") if folder.is_dir() else []
    parts = [conform_results(read_parquet(f)) for f in files]
    return pl.concat(parts) if parts else pl.DataFrame(schema=RESULT_COLUMNS)


def stored_drafter_key(data: PathLike) -> str | None:
    """The fleet's drafter key of the newest stored probe results: what the last run that reached the fleet
    keyed the probe prompts with (None: no result stored). `eagle3 plan` and a run whose endpoints do not
    answer key the probe prompts with it, so the two agree on what is left to send."""
    stored = read_all_results(data).filter(pl.col("drafter_key").is_not_null() & (pl.col("drafter_key") != ""))
    if not stored.height:
        return None
    return str(stored.sort("last_seen", nulls_last=False).row(-1, named=True)["drafter_key"])


def _versions(results: pl.DataFrame, by: list[str], extra: list[pl.Expr]) -> pl.DataFrame:
    """Per group of `by` (rows with a drafter): `extra`, the probe prompts, and the group's acceptance (rows
    counted, the sums, left_out, accept_length, accept_rate: generate/group_acceptance.py)."""
    measured = results.filter(pl.col("drafter_id").is_not_null())
    info = measured.group_by(by).agg(*extra, pl.col("prompt_id").n_unique().alias("n_probe_prompts"))
    return info.join(group_acceptance(measured, *by), on=by, how="left", nulls_equal=True)


def drafter_versions(results: pl.DataFrame) -> pl.DataFrame:
    """One row per drafter version measured on the probe sets: first/last seen, how many probe prompts, its
    accept length and rate over them (Σ/Σ) and the rows left out (flagged figures); oldest first (rows
    without a drafter: none)."""
    extra = [
        pl.col("spec_draft_model_path").drop_nulls().first().alias("draft_model_path"),
        pl.col("spec_draft_model_revision").drop_nulls().first().alias("draft_model_revision"),
        pl.col("first_seen").min(),
        pl.col("last_seen").max(),
    ]
    return _versions(results, ["drafter_id"], extra).sort("first_seen", "drafter_id")


def drafter_versions_by_source(results: pl.DataFrame) -> pl.DataFrame:
    """The same figures per (drafter version, probe source)."""
    extra = [pl.col("first_seen").min()]
    return _versions(results, ["drafter_id", "source"], extra).sort("first_seen", "drafter_id", "source")


def probe_turn_rows(turns: pl.DataFrame | None, probe_ids: pl.Series) -> pl.DataFrame:
    """The current turns (multiturn.current_turns rows) of the probe conversations, as result rows: the
    conversation's prompt id and the turn index."""
    if turns is None or turns.height == 0:
        schema = {c: RESULT_COLUMNS[c] for c in READ_COLUMNS if c in RESULT_COLUMNS}
        return pl.DataFrame(schema={**schema, "integrity_violations": pl.List(pl.String), "turn_index": pl.Int32})
    mine = turns.filter(pl.col("conversation_id").is_in(probe_ids.implode()))
    return mine.with_columns(pl.col("conversation_id").alias("prompt_id")).select(
        *READ_COLUMNS, pl.col("turn_index").cast(pl.Int32)
    )


def record_probe_results(
    data: PathLike,
    shard: int,
    gen_dir: Path | str | DataPath,
    active: pl.DataFrame,
    prompts: pl.DataFrame,
    probes: ProbeKeys,
    turns: pl.DataFrame | None = None,
) -> int:
    """Upsert the shard's current probe samples (of `active`, by their prompts' source; and of `turns`, the
    current turns of all_turns conversations, the probe conversations' ones) into its results file; returns
    how many there were (0: no probe prompt in the shard, nothing written)."""
    ids = probe_prompt_ids(prompts, probes.sources)
    if ids.len() == 0:
        return 0
    sample_ids = active.filter(pl.col("prompt_id").is_in(ids.implode())).get_column("sample_id")
    parts = list(iter_generations(gen_dir, only=sample_ids, columns=READ_COLUMNS))
    parts = [p.with_columns(pl.lit(None, dtype=pl.Int32).alias("turn_index")) for p in parts]
    parts.append(probe_turn_rows(turns, ids))
    current = pl.concat([p.select(*READ_COLUMNS, "turn_index") for p in parts], how="vertical_relaxed")
    if current.height:
        update_shard_results(data, shard, current, probes.drafter_key, datetime.now(UTC))
    return current.height


NIGHT_FIGURES = (
    "completion_tokens",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
)


def new_training_rows(
    gen_dir: Path | str | DataPath,
    active: pl.DataFrame,
    prompts: pl.DataFrame,
    sources: frozenset[str],
    since: datetime,
) -> pl.DataFrame:
    """The rows this run generated (generated_at >= `since`) for the shard's training prompts (not probes):
    tonight's new prompts, for the acceptance drift check (quality/acceptance_drift.py); their figures as
    trusted_figures leaves them (flagged ones null, named in spec_left_out)."""
    ids = probe_prompt_ids(prompts, sources)
    current = active.filter(~pl.col("prompt_id").is_in(ids.implode())).get_column("sample_id")
    cols = ["sample_id", "generated_at", *NIGHT_FIGURES, "integrity_violations"]
    parts = [b.filter(pl.col("generated_at") >= since) for b in iter_generations(gen_dir, only=current, columns=cols)]
    parts = [p for p in parts if p.height]
    if not parts:
        empty = pl.DataFrame(schema={c: RESULT_COLUMNS[c] for c in ("sample_id", "generated_at", *NIGHT_FIGURES)})
        return trusted_figures(empty)
    return trusted_figures(pl.concat(parts, how="diagonal_relaxed")).drop("integrity_violations")
