"""Where a candidate's answers and the comparisons are kept, apart from production's.

    <data>/probes/candidates/generations/shard=NNNN/   the candidate's probe generations (a generations store:
                                                       chunks, errors.parquet, lock), every candidate's
    <data>/probes/candidates/results/shard=NNNN.parquet  one row per candidate probe sample, keyed like probe
                                                       results: sample_id = the prompt's cache key with the
                                                       candidate's drafter and the probe seed in it
    <data>/probes/comparisons/<UTC time>-<candidate drafter_id>.json   one per comparison (the history)

Nothing here writes production's rows (generations/), its probe results (probes/results/), snapshots or
LATEST. A rerun finds the candidate's stored samples by their keys and sends nothing again.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime
from typing import Any

import polars as pl

from ..generate.store import iter_generations
from ..storage import DataPath, PathLike, as_data_path, read_parquet, write_frame_atomic
from .units import ROW_COLUMNS

log = logging.getLogger(__name__)

CANDIDATES_DIR = ("probes", "candidates")
COMPARISONS_DIR = ("probes", "comparisons")
# a candidate result: the unit's row (units.ROW_COLUMNS) with its drafter lineage, the probe seed and when seen
RESULT_COLUMNS: dict[str, Any] = {
    **ROW_COLUMNS,
    "drafter_key": pl.String,
    "spec_draft_model_path": pl.String,
    "spec_draft_model_revision": pl.String,
    "probe_seed": pl.Int64,
    "generated_at": pl.Datetime("us", "UTC"),
    "first_seen": pl.Datetime("us", "UTC"),
    "last_seen": pl.Datetime("us", "UTC"),
}
# what is read from the candidate's generations store (schemas.GENERATIONS names)
GENERATION_COLUMNS = [
    c for c in RESULT_COLUMNS if c not in ("turn_index", "drafter_key", "probe_seed", "first_seen", "last_seen")
]


def candidate_generations_dir(data: PathLike, shard: int) -> DataPath:
    return as_data_path(data).joinpath(*CANDIDATES_DIR, "generations", f"shard={shard:04d}")


def candidate_results_path(data: PathLike, shard: int) -> DataPath:
    return as_data_path(data).joinpath(*CANDIDATES_DIR, "results", f"shard={shard:04d}.parquet")


def _typed(df: pl.DataFrame) -> pl.DataFrame:
    return df.select(
        [(pl.col(c) if c in df.columns else pl.lit(None)).cast(t).alias(c) for c, t in RESULT_COLUMNS.items()]
    )


def _current_rows(gen_dir: DataPath, sample_ids: pl.Series, turns: pl.DataFrame | None) -> pl.DataFrame:
    """The candidate's current single-prompt rows (its generations store) and conversation turns (`turns`:
    multiturn.current_turns rows; a turn's prompt_id is its conversation's, with its turn_index)."""
    parts = [_typed(p) for p in iter_generations(gen_dir, only=sample_ids, columns=GENERATION_COLUMNS)]
    if turns is not None and turns.height:
        parts.append(_typed(turns.with_columns(pl.col("conversation_id").alias("prompt_id"))))
    return pl.concat(parts) if parts else _typed(pl.DataFrame())


def record_candidate_results(
    data: PathLike,
    shard: int,
    sample_ids: pl.Series,
    *,
    turns: pl.DataFrame | None = None,
    drafter_key: str,
    probe_seed: int | None,
    now: datetime,
) -> pl.DataFrame:
    """Upsert the candidate's current probe samples (`sample_ids`, read from its generations store, and the
    turns of its probe conversations) into the shard's results file (first_seen kept, last_seen = now);
    returns the current samples' rows."""
    current = _current_rows(candidate_generations_dir(data, shard), sample_ids, turns).with_columns(
        pl.lit(drafter_key).alias("drafter_key"),
        pl.lit(probe_seed, dtype=pl.Int64).alias("probe_seed"),
        pl.lit(now).cast(RESULT_COLUMNS["first_seen"]).alias("first_seen"),
        pl.lit(now).cast(RESULT_COLUMNS["last_seen"]).alias("last_seen"),
    )
    path = candidate_results_path(data, shard)
    old = _typed(read_parquet(path)) if path.exists() else _typed(pl.DataFrame())
    seen = old.filter(pl.col("sample_id").is_in(current["sample_id"].implode())).select("sample_id", "first_seen")
    current = (
        current.drop("first_seen")
        .join(seen, on="sample_id", how="left")
        .with_columns(pl.col("first_seen").fill_null(pl.lit(now).cast(RESULT_COLUMNS["first_seen"])))
    )
    current = current.select(list(RESULT_COLUMNS))
    if current.height:
        kept = old.filter(~pl.col("sample_id").is_in(current["sample_id"].implode()))
        write_frame_atomic(pl.concat([kept, current]).sort("sample_id"), path)
    return current


def read_candidate_results(data: PathLike) -> pl.DataFrame:
    """Every shard's candidate results (empty, with the columns, when there are none)."""
    folder = as_data_path(data).joinpath(*CANDIDATES_DIR, "results")
    files = folder.glob("shard=*.parquet") if folder.is_dir() else []
    parts = [_typed(read_parquet(f)) for f in files]
    return pl.concat(parts) if parts else _typed(pl.DataFrame())


def _comparisons_dir(data: PathLike) -> DataPath:
    return as_data_path(data).joinpath(*COMPARISONS_DIR)


def write_comparison(data: PathLike, doc: dict[str, Any]) -> DataPath:
    """Store one comparison (its JSON document) in the history; returns where."""
    stamp = re.sub(r"[^0-9A-Za-z]", "", str(doc.get("compared_at", "")))[:20] or "unknown"
    name = re.sub(r"[^0-9A-Za-z_.-]", "_", str((doc.get("candidate") or {}).get("drafter_id") or "unknown"))
    folder = _comparisons_dir(data)
    folder.mkdir()
    path = folder / f"{stamp}-{name}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")  # atomic (DataPath.write_bytes)
    return path


def read_comparisons(data: PathLike) -> list[dict[str, Any]]:
    """Every stored comparison, newest first (an unreadable file is named in a warning and skipped: the others
    still show)."""
    folder = _comparisons_dir(data)
    out: list[dict[str, Any]] = []
    for f in folder.glob("*.json") if folder.is_dir() else []:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            log.warning("stored drafter comparison %s cannot be read (left out): %s", f, e)
            continue
        if isinstance(doc, dict):
            out.append({**doc, "path": str(f)})
        else:
            log.warning("stored drafter comparison %s is not a JSON object (left out)", f)
    return sorted(out, key=lambda d: str(d.get("compared_at", "")), reverse=True)
