"""Which stored samples are the shard's current ones.

A shard folder keeps every sample ever generated (a config change never deletes work). The samples
of the latest `generations` materialization are exactly the current cache keys of its prompts:
`active.parquet` lists them, and `training_samples` reads only those.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from ..storage import PathLike, as_data_path, read_parquet, write_frame_atomic
from .config import sample_key
from .probes import ProbeKeys
from .store import read_generations

ACTIVE_FILE = "active.parquet"


class ActiveSamplesMissingError(FileNotFoundError):
    """The shard has no active.parquet: `generations` was never materialized for it."""


def active_sample_ids(
    tokenized: pl.DataFrame,
    model_revision: str,
    sampling_hash: str,
    regen_seed: int | None,
    row_hash: Callable[[int], str] | None = None,
    probes: ProbeKeys | None = None,
) -> pl.DataFrame:
    """(sample_id, prompt_id) of the current cache key of every tokenized prompt (`row_hash`: the sampling
    hash by prompt length, context_fit.ContextBudget.hash_for; needs a prompt_len or input_ids column)."""
    if row_hash is None:
        hashes = [sampling_hash] * tokenized.height
    else:
        lens = tokenized["prompt_len"] if "prompt_len" in tokenized.columns else tokenized["input_ids"].list.len()
        hashes = [row_hash(int(n or 0)) for n in lens]
    srcs = tokenized["source"].to_list() if probes is not None and "source" in tokenized.columns else None
    tags = [probes.tag(s) for s in srcs] if probes is not None and srcs is not None else [None] * tokenized.height
    return pl.DataFrame(
        {
            "sample_id": [
                sample_key(r["prompt_id"], model_revision, r["template_hash"] or "", h, regen_seed, tag)
                for r, h, tag in zip(tokenized.select("prompt_id", "template_hash").iter_rows(named=True), hashes, tags)
            ],
            "prompt_id": tokenized["prompt_id"].to_list(),
        },
        schema={"sample_id": pl.String, "prompt_id": pl.String},
    )


def write_active_samples(gen_dir: PathLike, active: pl.DataFrame) -> None:
    write_frame_atomic(active, as_data_path(gen_dir) / ACTIVE_FILE)


def read_active_samples(gen_dir: PathLike) -> pl.DataFrame:
    """active.parquet: the sample ids (and, for all_turns conversations, the turn ids) of the latest
    materialization of the shard's generations."""
    path = as_data_path(gen_dir) / ACTIVE_FILE
    if not path.exists():
        raise ActiveSamplesMissingError(f"{path} is missing; materialize `generations` first")
    return read_parquet(path)


def read_active_generations(gen_dir: PathLike) -> pl.DataFrame:
    """The stored samples of the latest materialization (schemas.GENERATIONS rows in active.parquet)."""
    active = read_active_samples(gen_dir).select("sample_id")
    return read_generations(as_data_path(gen_dir)).join(active, on="sample_id", how="semi")
