"""One shard's training samples, streamed: generations in batches -> parse + round trip -> ids + loss mask.

The same rows, columns and order as building the whole shard at once (parse_generations +
build_training_samples over every generation, sorted by sample_id): each batch of generations is
parsed and built on its own, the rows go through a SortedSpill (storage/spill.py) and are written
bucket by bucket in sample_id order. Kept for the whole shard: the parse failures (row id + reasons,
the quarantine file) and per-row scalars only (the gate's feature columns, the summary's statistics).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import polars as pl
import pyarrow as pa

from ..profiles import ModelProfile
from ..quality.features import training_row_features
from ..schemas import TRAINING_SAMPLES
from ..storage import (
    ONE_ROW_GROUP_BYTES,
    KeyedRows,
    ParquetSink,
    PathLike,
    SortedSpill,
    arrow_batch,
    detached,
    write_frame_atomic,
)
from .conversations import CONVERSATION_FAILURES_SCHEMA, parse_generations
from .samples import ACCEPTANCE_COLUMNS, build_training_samples
from .summary import sample_stats


@dataclass
class TrainingShard:
    counts: dict[str, int] = field(default_factory=dict)  # generations = samples + excluded + missing_prompt
    parse_counts: dict[str, int] = field(default_factory=dict)  # parsed = ok + parse_failures
    row_features: pl.DataFrame = field(default_factory=pl.DataFrame)  # training_row_features of every row
    stats: pl.DataFrame = field(default_factory=pl.DataFrame)  # summary.sample_stats of every row
    text_exact_rows: int = 0
    lineage_rows: pl.DataFrame = field(default_factory=pl.DataFrame)  # sample_id, conversation_id, turn_index
    supervised_tokens: int = 0
    row_groups: int = 0  # 1: the table is byte for byte the whole-shard write; more: streamed (bucket by bucket)


@dataclass(frozen=True)
class SampleSources:
    """What each batch of generations is built against: the prompt rows (`tokenized`: ids; `prompts`:
    messages and tools) as frames, or as KeyedRows by prompt_id from which a batch reads only its own; the
    model and its tokenizer; the samples and prompts a gate quarantined (left out)."""

    tokenized: pl.DataFrame | KeyedRows
    prompts: pl.DataFrame | KeyedRows
    profile: ModelProfile
    tokenizer: Any
    bad_sample_ids: set[str] = field(default_factory=set)
    bad_prompt_ids: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class ShardOutput:
    """Where a shard's training table goes (`out_path`), its parse quarantine (`quarantine_path`), the
    table's schema (TRAINING_SAMPLES_TURNS with lineage), the folder the sorted spill uses (None: temp)."""

    out_path: PathLike
    quarantine_path: PathLike
    schema: pa.Schema = TRAINING_SAMPLES
    spill_dir: Path | None = None


def _add(total: dict[str, int], part: dict[str, int]) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0) + int(v)


def _prompt_rows(table: pl.DataFrame | KeyedRows, gens: pl.DataFrame) -> pl.DataFrame:
    """The prompt rows a batch of generations joins: the whole frame, or only theirs from a KeyedRows."""
    return table if isinstance(table, pl.DataFrame) else table.rows(gens.get_column("prompt_id"))


def build_training_shard(
    generations: Iterable[pl.DataFrame],
    sample_ids: pl.Series,
    sources: SampleSources,
    output: ShardOutput,
    *,
    max_total_len: int,
    lineage: pl.DataFrame | None = None,
) -> TrainingShard:
    """Write the shard's training table and parse quarantine (`output`) from batches of its generations
    (`sample_ids`: every sample_id the batches may hold), each built against `sources`. Memory: a batch, a
    bucket, a few prompt blocks and the per-row scalars. `lineage` (sample_id, conversation_id, turn_index of
    the turns of all_turns conversations) is joined onto every row, null for final-turn rows; the output's
    schema is then TRAINING_SAMPLES_TURNS."""
    res = TrainingShard()
    failures: list[pl.DataFrame] = []
    features: list[pl.DataFrame] = []
    stats: list[pl.DataFrame] = []
    lineages: list[pl.DataFrame] = []
    schema, profile = output.schema, sources.profile
    spill = SortedSpill(sample_ids, "sample_id", spill_dir=output.spill_dir)
    sink = None
    try:
        for gens in generations:
            samples, parse_failures = _batch_samples(gens, sources, schema, res)
            failures.append(detached(parse_failures))
            spill.add(samples)
        sink = ParquetSink(output.out_path, schema, buffer_bytes=ONE_ROW_GROUP_BYTES)
        for batch in spill.sorted_batches():
            if lineage is not None:
                batch = batch.join(lineage, on="sample_id", how="left", maintain_order="left")
                lineages.append(detached(batch.select("sample_id", "conversation_id", "turn_index")))
            sink.write_table(arrow_batch(batch, schema))
            # kept for the whole shard: detached, or each would pin its bucket (storage/frames.py)
            features.append(detached(training_row_features(batch, max_total_len=max_total_len)))
            stats.append(detached(sample_stats(batch, profile)))
            res.text_exact_rows += int(batch["text_exact"].sum() or 0)
            res.supervised_tokens += int(batch["output_len"].sum() or 0)
        write_frame_atomic(
            pl.concat(failures).rechunk() if failures else pl.DataFrame(schema=CONVERSATION_FAILURES_SCHEMA),
            output.quarantine_path,
        )
        sink.commit()
        res.row_groups = sink.row_groups
    except BaseException:
        if sink is not None:
            sink.abort()
        spill.close()
        raise
    empty = cast(pl.DataFrame, pl.from_arrow(TRAINING_SAMPLES.empty_table()))
    res.row_features = pl.concat(features) if features else training_row_features(empty, max_total_len=max_total_len)
    res.stats = pl.concat(stats) if stats else sample_stats(empty, profile)
    if lineage is not None:
        res.lineage_rows = pl.concat(lineages) if lineages else lineage.clear()
    _reconcile(res, spill.rows)
    return res


def _batch_samples(
    gens: pl.DataFrame, sources: SampleSources, schema: pa.Schema, res: TrainingShard
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One batch of generations parsed and built into training samples (its counts added to `res`):
    (samples, parse failures)."""
    bad_sample_ids, bad_prompt_ids = sources.bad_sample_ids, sources.bad_prompt_ids
    candidates = gens.filter(
        ~pl.col("sample_id").is_in(list(bad_sample_ids)) & ~pl.col("prompt_id").is_in(list(bad_prompt_ids))
    )
    conversations, parse_failures, parse_counts = parse_generations(
        candidates, _prompt_rows(sources.prompts, candidates), sources.profile, sources.tokenizer
    )
    samples, counts = build_training_samples(
        gens,
        _prompt_rows(sources.tokenized, gens).select(
            "prompt_id", "input_ids", "tokenizer_fingerprint", pl.col("^control_text_in_content$")
        ),
        exclude_sample_ids=bad_sample_ids | set(parse_failures["row_id"].to_list()),
        exclude_prompt_ids=bad_prompt_ids,
        conversations=conversations,
        acceptance=ACCEPTANCE_COLUMNS[0] in schema.names,
    )
    _add(res.parse_counts, parse_counts)
    _add(res.counts, counts)
    return samples, parse_failures


def _reconcile(res: TrainingShard, spilled_rows: int) -> None:
    """Every count present; generations = samples + excluded + missing_prompt, and every sample written."""
    for k in ("generations", "excluded", "missing_prompt", "samples"):
        res.counts.setdefault(k, 0)
    for k in ("parsed", "round_trip_ok", "parse_failures", "text_exact_false"):
        res.parse_counts.setdefault(k, 0)
    assert res.counts["generations"] == res.counts["samples"] + res.counts["excluded"] + res.counts["missing_prompt"]
    assert res.counts["samples"] == spilled_rows
