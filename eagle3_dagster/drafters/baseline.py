"""Production's side of a comparison: a drafter's stored probe results, read, never written.

The baseline's rows are its probe results (`<data>/probes/results/`, generate/probe_results.py): one per
probe prompt (a probe conversation regenerated turn by turn: one per turn), the latest when it was
measured more than once (a bumped probe seed). Its figures are the result's own (the sums, null where they
failed their checks, with `spec_left_out` naming them: what the report's probe tables add up). Each is
completed from the production generations row it names (`sample_id`; a turn's from the shard's turns
store): the drafter's draft budget, the target revision, the sampling hash and the row's integrity flags.

The default baseline is the production fleet's current drafter: the one it ran on the probe sets most
recently (the newest `last_seen`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from ..generate.drafter import DrafterIdentity, redact_draft_path
from ..generate.multiturn import read_turn_rows
from ..generate.probe_results import PROBES_DIR, RESULT_COLUMNS, conform_results
from ..generate.store import iter_generations
from ..storage import PathLike, as_data_path, read_parquet, shard_dir

# completed from the generations row (schemas.GENERATIONS names); never its figures: a result's are
# trusted_figures' (a result stored without the sums feeds no figure, as in the report)
FROM_GENERATIONS = [
    "sample_id",
    "spec_num_draft_tokens",
    "integrity_violations",
    "model_revision",
    "sampling_hash",
    "spec_algorithm",
    "spec_num_steps",
    "spec_eagle_topk",
]


class BaselineError(ValueError):
    """No baseline to compare with: the line says why and what to do."""


def results_by_shard(data: PathLike) -> list[tuple[int, pl.DataFrame]]:
    """(shard, its probe results) for every shard that has some."""
    folder = as_data_path(data) / PROBES_DIR / "results"
    out = []
    for f in sorted(folder.glob("shard=*.parquet") if folder.is_dir() else []):
        shard = int(f.stem.split("=", 1)[1])
        out.append((shard, conform_results(read_parquet(f))))
    return out


def production_drafter(results: pl.DataFrame) -> str:
    """The drafter the production fleet ran on the probe sets most recently; BaselineError when there is none
    or the newest run measured several (a mixed fleet: name one with --baseline)."""
    measured = results.filter(pl.col("drafter_id").is_not_null())
    if measured.height == 0:
        raise BaselineError(
            "no probe results of a production drafter yet: a role: probe source must be generated on a speculating "
            "fleet first (docs/probes.md), then compare"
        )
    newest = measured.filter(pl.col("last_seen") == pl.col("last_seen").max())
    ids = sorted(set(newest["drafter_id"].to_list()))
    if len(ids) > 1:
        raise BaselineError(
            f"the fleet's newest probe results come from several drafters ({', '.join(ids)}): name the baseline "
            "with --baseline DRAFTER_ID"
        )
    return str(ids[0])


def _completed(shard: int, rows: pl.DataFrame, data: PathLike) -> pl.DataFrame:
    """The shard's probe result rows with their generations row's counts, flags, revision and sampling hash
    (null where the generations row is gone)."""
    gen_dir = shard_dir(data, "generations", shard)
    singles = rows.filter(pl.col("turn_index").is_null())["sample_id"]
    parts = list(iter_generations(gen_dir, only=singles, columns=FROM_GENERATIONS)) if singles.len() else []
    if rows["turn_index"].is_not_null().any():  # a probe conversation's turns: from the shard's turns store
        turns = read_turn_rows(gen_dir, FROM_GENERATIONS)
        parts.append(turns.filter(pl.col("sample_id").is_in(rows["sample_id"].implode())))
    empty = pl.DataFrame(schema=dict.fromkeys(FROM_GENERATIONS, pl.String))
    extra = pl.concat(parts, how="vertical_relaxed") if parts else empty
    extra = extra.unique("sample_id", keep="last")
    return rows.join(extra.with_columns(pl.col("sample_id").cast(pl.String)), on="sample_id", how="left")


@dataclass(frozen=True)
class Baseline:
    drafter_id: str
    identity: DrafterIdentity | None  # None: its generations rows are gone (only path and revision are known)
    draft_model_path: str | None
    draft_model_revision: str | None
    rows: pl.DataFrame  # probe results completed from generations (units.ROW_COLUMNS among them), one per prompt
    without_generation_row: int  # rows whose generations row is gone (their flags could not be read)

    @property
    def num_draft_tokens(self) -> int | None:
        return self.identity.num_draft_tokens if self.identity is not None else None

    def as_json(self) -> dict[str, Any]:
        """The identity as a comparison stores it; a path stored before drafter paths were redacted is redacted
        here (its drafter_id stays the one its rows carry)."""
        if self.identity is not None:
            out = self.identity.columns()
        else:
            out = {
                "drafter_id": self.drafter_id,
                "spec_draft_model_path": self.draft_model_path,
                "spec_draft_model_revision": self.draft_model_revision,
            }
        return {**out, "spec_draft_model_path": redact_draft_path(out["spec_draft_model_path"])}


def _int(v: Any) -> int | None:
    return int(v) if v is not None else None


def _identity(rows: pl.DataFrame, drafter_id: str) -> DrafterIdentity | None:
    """The baseline drafter's identity from its generations rows (the most common whose id is `drafter_id`)."""
    cols = ["spec_algorithm", "spec_draft_model_path", "spec_draft_model_revision", "spec_num_steps", "spec_eagle_topk",
            "spec_num_draft_tokens"]  # fmt: skip
    known = rows.filter(pl.col("spec_algorithm").is_not_null())
    for top in known.group_by(cols).len().sort("len", descending=True).iter_rows(named=True):
        ident = DrafterIdentity(
            str(top["spec_algorithm"]),
            top["spec_draft_model_path"],
            top["spec_draft_model_revision"],
            _int(top["spec_num_steps"]),
            _int(top["spec_eagle_topk"]),
            _int(top["spec_num_draft_tokens"]),
        )
        if ident.drafter_id == drafter_id:
            return ident
    return None


def load_baseline(data: PathLike, drafter_id: str | None, probe_sources: Iterable[str]) -> Baseline:
    """The baseline drafter's rows on the current probe sources (`drafter_id` None: production's current one)."""
    per_shard = results_by_shard(data)
    everything = pl.concat([r for _, r in per_shard]) if per_shard else pl.DataFrame(schema=RESULT_COLUMNS)
    chosen = drafter_id or production_drafter(everything)
    names = sorted(set(probe_sources))
    parts = []
    for shard, rows in per_shard:
        mine = rows.filter((pl.col("drafter_id") == chosen) & pl.col("source").is_in(names))
        if mine.height:
            mine = mine.sort("last_seen", "generated_at", nulls_last=False)
            mine = mine.unique(["prompt_id", "turn_index"], keep="last")
            parts.append(_completed(shard, mine, data).with_columns(pl.lit(shard, dtype=pl.Int32).alias("shard")))
    if not parts:
        known = sorted(set(everything["drafter_id"].drop_nulls().to_list()))
        raise BaselineError(
            f"no probe results of drafter {chosen} on the probe sources {', '.join(names) or '(none)'}"
            + (f"; drafters with probe results: {', '.join(known)}" if known else "")
        )
    rows = pl.concat(parts, how="diagonal_relaxed").sort("last_seen", "prompt_id")
    missing = rows.filter(pl.col("model_revision").is_null()).height
    first = rows.row(0, named=True)
    return Baseline(
        chosen,
        _identity(rows, chosen),
        first["spec_draft_model_path"],
        first["spec_draft_model_revision"],
        rows,
        missing,
    )
