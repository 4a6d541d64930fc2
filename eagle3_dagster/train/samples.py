"""Training samples: prompt ids + generated ids, with a loss mask over what the model produced.

Loss-mask convention: every id the model generated is supervised (reasoning, `</think>`, the
answer, tool-call sections and the end-of-turn token); every prompt id, including the template's
prefilled `<think>`, is not. Ids are concatenated exactly as stored, never re-encoded: a row whose
text does not re-encode to its ids (`text_exact = false`) is kept like any other.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from ..generate.group_acceptance import LEFT_OUT, trusted_figures
from ..schemas import TRAINING_SAMPLES
from .conversations import CONVERSATIONS_SCHEMA

LINEAGE_FROM_GENERATIONS = (
    "model_revision",
    "template_hash",
    "sampling_hash",
    "endpoint",
    "finish_reason",
    "generated_at",
)
# the tokenized prompt's flag for control-token text of its data encoded as special ids (as_served),
# carried onto its training rows and into the snapshot's exports
CONTROL_FLAG = "control_text_in_content"
# who served the row (the SGLang server that generated it and its release), copied from the generation row;
# null where it has none, and where a generations batch has no such column (rows stored before it existed)
SERVED_BY_COLUMNS = ("worker", "sglang_version")
# the generations columns a training row is built from (the training step reads only these)
TRAINING_INPUT_COLUMNS = (
    "sample_id",
    "prompt_id",
    "source",
    "output_ids",
    *LINEAGE_FROM_GENERATIONS,
    *SERVED_BY_COLUMNS,
)
# EAGLE3_TRAIN_ACCEPTANCE: the drafter's acceptance on the row as the speculating server reported it when the
# row was generated (generations table, generate/drafter.py; null when it did not speculate), so a trainer
# can weight or oversample the rows the current drafter finds hard. Null too where the figures failed their
# checks (spec_metrics_inconsistent: generate/group_acceptance.py), and `spec_left_out` names those checks.
# Off by default: the tables and exports keep their columns.
ACCEPTANCE_COLUMNS = ("spec_accept_rate", "spec_accept_length")
# what the training step reads from the generations for them (the flags decide which figures are trusted)
ACCEPTANCE_INPUT_COLUMNS = (*ACCEPTANCE_COLUMNS, "integrity_violations")


def with_acceptance(schema: pa.Schema) -> pa.Schema:
    """A training table schema with the acceptance columns appended (EAGLE3_TRAIN_ACCEPTANCE)."""
    fields = [*(pa.field(c, pa.float64()) for c in ACCEPTANCE_COLUMNS), pa.field(LEFT_OUT, pa.string())]
    return pa.schema([*schema, *fields], metadata=schema.metadata)


def build_training_samples(
    generations: pl.DataFrame,
    tokenized: pl.DataFrame,
    *,
    exclude_sample_ids: set[str] | frozenset[str] = frozenset(),
    exclude_prompt_ids: set[str] | frozenset[str] = frozenset(),
    conversations: pl.DataFrame | None = None,
    acceptance: bool = False,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """Join generations to their prompts and build `input_ids` + `loss_mask`.

    Returns the TRAINING_SAMPLES frame and counts that reconcile:
    generations = samples + excluded + missing_prompt.
    """
    counts = {"generations": generations.height}
    gens = trusted_figures(generations) if acceptance else generations  # flagged figures feed no export
    if exclude_sample_ids:
        gens = gens.filter(~pl.col("sample_id").is_in(list(exclude_sample_ids)))
    if exclude_prompt_ids:
        gens = gens.filter(~pl.col("prompt_id").is_in(list(exclude_prompt_ids)))
    counts["excluded"] = generations.height - gens.height

    control = (
        pl.col(CONTROL_FLAG)
        if CONTROL_FLAG in tokenized.columns
        else pl.lit(None, dtype=pl.Boolean).alias(CONTROL_FLAG)
    )
    prompts = tokenized.select("prompt_id", pl.col("input_ids").alias("prompt_ids"), "tokenizer_fingerprint", control)
    joined = gens.join(prompts, on="prompt_id", how="inner")
    counts["missing_prompt"] = gens.height - joined.height
    if conversations is None:
        conversations = pl.DataFrame(schema=CONVERSATIONS_SCHEMA)
    for col, dtype in CONVERSATIONS_SCHEMA.items():
        if col not in conversations.columns:
            conversations = conversations.with_columns(pl.lit(None, dtype=dtype).alias(col))
    joined = joined.join(conversations.select(list(CONVERSATIONS_SCHEMA)), on="sample_id", how="left")

    out = joined.select(
        "sample_id",
        "prompt_id",
        "source",
        pl.concat_list("prompt_ids", "output_ids").cast(pl.List(pl.Int32)).alias("input_ids"),
        pl.concat_list(
            pl.col("prompt_ids").list.eval(pl.lit(0, dtype=pl.Int8)),
            pl.col("output_ids").list.eval(pl.lit(1, dtype=pl.Int8)),
        ).alias("loss_mask"),
        pl.col("prompt_ids").list.len().cast(pl.Int32).alias("prompt_len"),
        pl.col("output_ids").list.len().cast(pl.Int32).alias("output_len"),
        (pl.col("prompt_ids").list.len() + pl.col("output_ids").list.len()).cast(pl.Int32).alias("total_len"),
        "model_revision",
        "template_hash",
        "tokenizer_fingerprint",
        "sampling_hash",
        "endpoint",
        "finish_reason",
        "generated_at",
        "conversation",
        "tools",
        "text_exact",
        pl.col("text_mismatch_pos").cast(pl.Int32),
        pl.col(CONTROL_FLAG).cast(pl.Boolean),
        *((pl.col(c) if c in joined.columns else pl.lit(None)).cast(pl.String).alias(c) for c in SERVED_BY_COLUMNS),
        *(_acceptance_exprs(joined.columns) if acceptance else ()),
    ).sort("sample_id")
    counts["samples"] = out.height
    if acceptance:  # rows whose acceptance figures failed their checks: null in the table and the exports
        counts["acceptance_left_out"] = int(out.get_column(LEFT_OUT).is_not_null().sum())
    assert counts["generations"] == counts["samples"] + counts["excluded"] + counts["missing_prompt"]
    return out.select(with_acceptance(TRAINING_SAMPLES).names if acceptance else TRAINING_SAMPLES.names), counts


def _acceptance_exprs(columns: list[str]) -> list[pl.Expr]:
    """The acceptance columns from the generations (null where a generations batch does not have them), and
    which figure checks a row failed (its figures then null)."""
    figures = [(pl.col(c) if c in columns else pl.lit(None)).cast(pl.Float64).alias(c) for c in ACCEPTANCE_COLUMNS]
    return [*figures, pl.col(LEFT_OUT).cast(pl.String)]
