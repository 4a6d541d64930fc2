"""Training wiring: `training_samples[shard]`, consuming only shards whose gates passed."""

import json
from typing import Any

import dagster as dg

from ..config import Settings, StageSettings, apply_tokenizers_parallelism
from ..generate.active import ActiveSamplesMissingError
from ..ingest.spec import probe_source_names
from ..orchestration.asset_names import AssetName
from ..orchestration.metadata import to_metadata
from ..orchestration.partitions import shard_partitions
from ..orchestration.resources import cached_renderer
from ..orchestration.shard_asset import GatedShard, ShardAssetSpec, ShardStep, gated_shard_asset
from ..quality import GateFailedError
from ..quality.features import available_source_shares, with_training_table_features
from ..storage import parquet_num_rows
from ..train.inputs import TrainingInputs, build_from_inputs, training_inputs
from ..train.multiturn import rows_by_turn
from ..train.summary import SUMMARY_FILE, Summary, headline, summarize

STAGE = "train"


TRAIN = ShardAssetSpec(
    name=AssetName.TRAINING_SAMPLES,
    gate="training_samples",
    stage=STAGE,
    deps=(AssetName.GENERATIONS, AssetName.TOKENIZED_PROMPTS),
    description="input_ids = prompt ids + output ids (exactly as generated), loss_mask 0 over the prompt and 1 over "
    "the output; only rows that passed every critical gate expectation; lineage on every row; text_exact = false "
    "flags rows whose text re-encodes to other ids (kept: non-canonical tokenization is valid model output).",
)


def shard_inputs(step: ShardStep, tokenizer_fingerprint: str, acceptance: bool) -> TrainingInputs:
    """The shard's training inputs (`acceptance`: with the per-row acceptance columns); a failed gate or missing active samples fail the step, naming the shard."""
    probe_sources = probe_source_names(step.pipeline.sources_path)
    try:
        inputs = training_inputs(
            step.data,
            step.shard,
            profile_name=step.profile.name,
            tokenizer_fingerprint=tokenizer_fingerprint,
            probe_sources=probe_sources,
            acceptance=acceptance,
        )
    except GateFailedError as e:  # a shard whose prompts or generations gate failed (in any earlier run)
        raise dg.Failure(description=f"{e}; refusing to build training samples from it") from None
    except ActiveSamplesMissingError as e:
        raise dg.Failure(f"shard {step.key}: {e}") from None
    if inputs.probe_samples_left_out:
        step.log.info(
            f"shard {step.key}: {inputs.probe_samples_left_out:,} probe sample(s) of "
            f"{', '.join(probe_sources)} left out of training (role: probe)"
        )
    return inputs


def log_counts(step: ShardStep, built: Any) -> None:
    counts, parse_counts = built.counts, built.parse_counts
    step.log.info(
        f"training_samples shard {step.key}: "
        + " · ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in dict(counts).items())
    )
    if parse_counts["text_exact_false"]:
        step.log.warning(
            f"shard {step.shard}: {parse_counts['text_exact_false']} of {counts['samples']} rows are not text-exact "
            "(non-canonical tokenization: their text re-encodes to other ids); kept in training_samples and "
            "specforge_prompts.jsonl, flagged in conversations.jsonl, left out of specforge_preformatted.jsonl"
        )


def training_metadata(step: ShardStep, built: Any, summary: Summary, lineage: bool, out: Any) -> dict[str, Any]:
    parse_counts = built.parse_counts
    rt_rate = parse_counts["round_trip_ok"] / parse_counts["parsed"] if parse_counts["parsed"] else 1.0
    errors_path = step.folder("generations") / "errors.parquet"
    return {
        **to_metadata(built.counts),
        **to_metadata(parse_counts),
        "round_trip_rate": rt_rate,
        "text_exact_rows": built.text_exact_rows,
        "generation_errors": parquet_num_rows(errors_path) if errors_path.exists() else 0,
        **({"turn_rows": dg.MetadataValue.json(rows_by_turn(built.lineage_rows))} if lineage else {}),
        "supervised_tokens": built.supervised_tokens,
        **{f"summary/{k}": v for k, v in headline(summary).items() if k != "rows"},
        "path": dg.MetadataValue.path(str(out / "part-0000.parquet")),
    }


def train_step(step: ShardStep, stages: StageSettings) -> GatedShard:
    """Build the shard's training samples (`stages`: the settings the definitions were built from)."""
    apply_tokenizers_parallelism(stages.tokenizers_parallelism)  # the round trip's batch decode/encode on every core
    renderer = cached_renderer(step.profile)
    inputs = shard_inputs(step, renderer.tokenizer_fingerprint, stages.train_acceptance)
    out = step.folder("training_samples")
    built = build_from_inputs(inputs, step.profile, renderer.tokenizer, out, spill_dir=step.pipeline.work_path)
    features = with_training_table_features(built.row_features, available_source_shares(inputs.turns.source_tokenized))
    summary = summarize(built.stats)  # the shard's distribution summary, for the report's per-shard charts
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str))
    log_counts(step, built)
    return GatedShard(features, training_metadata(step, built, summary, inputs.turns.lineage is not None, out))


def training_samples(s: Settings) -> dg.AssetsDefinition:
    """`training_samples` over the shard partitions of `s`, its steps handed the stage settings of `s`."""

    def step_of_s(step: ShardStep) -> GatedShard:
        return train_step(step, s.stages)

    return gated_shard_asset(TRAIN, shard_partitions(s.shards.n_shards))(step_of_s)


def build_defs(s: Settings) -> dg.Definitions:
    return dg.Definitions(assets=[training_samples(s)])
