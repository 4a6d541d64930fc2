"""Training wiring: `training_samples[shard]`, consuming only shards whose gates passed."""

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import dagster as dg
import polars as pl

from ..config import Settings, StageSettings, apply_tokenizers_parallelism
from ..generate.active import ActiveSamplesMissingError, read_active_samples
from ..generate.inputs import iter_batches
from ..generate.multiturn import current_turns, turn_generations, turn_prompt_rows, turn_tokenized
from ..generate.probes import without_probes
from ..generate.store import iter_generations
from ..ingest.spec import probe_source_names
from ..orchestration.asset_names import AssetName
from ..orchestration.metadata import to_metadata
from ..orchestration.partitions import shard_partitions
from ..orchestration.resources import cached_renderer
from ..orchestration.shard_asset import GatedShard, ShardAssetSpec, ShardStep, gated_shard_asset
from ..quality import GateFailedError, require_gate_passed
from ..quality.features import available_source_shares, with_training_table_features
from ..schemas import GENERATIONS, TRAINING_SAMPLES, TRAINING_SAMPLES_TURNS
from ..storage import KeyedRows, parquet_file, parquet_num_rows
from ..train.multiturn import rows_by_turn, with_turns
from ..train.samples import ACCEPTANCE_INPUT_COLUMNS, TRAINING_INPUT_COLUMNS, with_acceptance
from ..train.shard import build_training_shard
from ..train.summary import SUMMARY_FILE, headline, summarize
from .generate import tokenized_source

STAGE = "train"
GENERATION_BATCH_ROWS = 512  # generations parsed and built at a time (train/shard.py streams the shard)


TOKEN_ROWS = {
    "prompt_id": pl.String,
    "input_ids": pl.List(pl.Int32),
    "tokenizer_fingerprint": pl.String,
    "control_text_in_content": pl.Boolean,  # as_served control text: carried onto the training rows
}
PROMPT_ROWS = {"prompt_id": pl.String, "messages": pl.String, "tools": pl.String}
_NO_SOURCES = pl.DataFrame(schema={"prompt_id": pl.String, "source": pl.String})


def _table_schema(turns: bool, acceptance: bool) -> Any:
    schema = TRAINING_SAMPLES_TURNS if turns else TRAINING_SAMPLES
    return with_acceptance(schema) if acceptance else schema


def shard_prompt_batches(prompts_path, shard: int) -> Iterator[pl.DataFrame]:
    """prompt_id, messages, tools of the shard's rows of prompts.parquet, streamed in batches."""
    pf = parquet_file(prompts_path)
    for rb in pf.iter_batches(batch_size=1024, columns=["prompt_id", "shard", "messages", "tools"]):
        b = cast(pl.DataFrame, pl.from_arrow(rb)).filter(pl.col("shard") == shard)
        if b.height:
            yield b.select(list(PROMPT_ROWS)).cast(cast(Any, PROMPT_ROWS))


TRAIN = ShardAssetSpec(
    name=AssetName.TRAINING_SAMPLES,
    gate="training_samples",
    stage=STAGE,
    deps=(AssetName.GENERATIONS, AssetName.TOKENIZED_PROMPTS),
    description="input_ids = prompt ids + output ids (exactly as generated), loss_mask 0 over the prompt and 1 over "
    "the output; only rows that passed every critical gate expectation; lineage on every row; text_exact = false "
    "flags rows whose text re-encodes to other ids (kept: non-canonical tokenization is valid model output).",
)


def passed_gates(data: Any, shard: int) -> dict[str, Any]:
    """Cross-run gating: a shard whose prompts or generations gate failed (in any earlier run) is never consumed."""
    try:
        return {g: require_gate_passed(data, g, shard) for g in ("prompts", "generations")}
    except GateFailedError as e:
        raise dg.Failure(description=f"{e}; refusing to build training samples from it") from None


def training_candidates(step: ShardStep, gen_dir: Any, source_of: pl.DataFrame) -> pl.DataFrame:
    """The samples of the latest generations materialization (the current cache keys), without probe samples."""
    try:
        active_samples = read_active_samples(gen_dir)
    except ActiveSamplesMissingError as e:
        raise dg.Failure(f"shard {step.key}: {e}") from None
    probe_sources = probe_source_names(step.pipeline.sources_path)
    training_only = without_probes(active_samples, source_of, probe_sources)  # probe sets: never trained on
    if training_only.height != active_samples.height:
        step.log.info(
            f"shard {step.key}: {active_samples.height - training_only.height:,} probe sample(s) of "
            f"{', '.join(probe_sources)} left out of training (role: probe)"
        )
    return training_only


@dataclass(frozen=True)
class TrainingInputs:
    """What one shard's training build reads: the current samples, their generations (streamed), the lookups'
    sources (the tokenized prompts and the prompts, plus the turns of all_turns conversations) and the gates."""

    active: pl.Series
    batches: Iterable[pl.DataFrame]
    token_rows: Iterable[pl.DataFrame]
    prompt_rows: Iterable[pl.DataFrame]
    turns: Any  # with_turns(...): lineage, excluded samples, per-source tokenized counts
    bad_sample_ids: set[str]
    bad_prompt_ids: set[str]
    acceptance: bool


def training_inputs(step: ShardStep, renderer: Any, acceptance: bool) -> TrainingInputs:
    """The shard's training inputs, streamed; `acceptance` (EAGLE3_TRAIN_ACCEPTANCE): with the per-row acceptance
    columns."""
    gates = passed_gates(step.data, step.shard)
    tok_src = tokenized_source(step.data, step.shard)  # a folder, streamed: the prompt ids are never held whole
    gen_dir = step.folder("generations")
    source_of = pl.concat(list(iter_batches(tok_src, ["prompt_id", "source"])) or [_NO_SOURCES])
    active_samples = training_candidates(step, gen_dir, source_of)
    bad_prompts = set(gates["prompts"].row_failures["row_id"].to_list())
    # the turns of all_turns conversations: one row each, built like any sample (train/multiturn.py)
    turns = current_turns(gen_dir, active_samples)
    fingerprint = renderer.tokenizer_fingerprint
    wt = with_turns(  # per-row scalars only here: the prompts' ids and messages are looked up per batch
        cast(pl.DataFrame, pl.from_arrow(GENERATIONS.empty_table())),  # the generations come streamed
        source_of,
        pl.DataFrame(schema=PROMPT_ROWS),
        turns,
        profile_name=step.profile.name,
        tokenizer_fingerprint=fingerprint,
        bad_prompt_ids=bad_prompts,
    )
    extra_tok: list[pl.DataFrame] = []
    extra_prompts: list[pl.DataFrame] = []
    if turns.height:  # each turn's exact prompt ids and messages, looked up like the prompts'
        extra_tok = [turn_tokenized(turns, profile_name=step.profile.name, tokenizer_fingerprint=fingerprint)]
        extra_prompts = [turn_prompt_rows(turns)]
    active = active_samples["sample_id"]
    batches: Iterable[pl.DataFrame] = iter_generations(
        gen_dir,
        only=active,
        batch_rows=GENERATION_BATCH_ROWS,
        columns=(*TRAINING_INPUT_COLUMNS, *(ACCEPTANCE_INPUT_COLUMNS if acceptance else ())),
    )
    if turns.height:
        batches = itertools.chain(batches, [turn_generations(turns)])
    return TrainingInputs(
        active=active,
        batches=batches,
        token_rows=itertools.chain(iter_batches(tok_src, list(TOKEN_ROWS)), extra_tok),
        prompt_rows=itertools.chain(
            shard_prompt_batches(step.data / "prompts" / "prompts.parquet", step.shard), extra_prompts
        ),
        turns=wt,
        bad_sample_ids=set(gates["generations"].row_failures["row_id"].to_list()) | wt.exclude_sample_ids,
        bad_prompt_ids=bad_prompts,
        acceptance=acceptance,
    )


def build_shard(step: ShardStep, inputs: TrainingInputs, tokenizer: Any, out: Any) -> Any:
    """Build the shard's training table from its inputs, the lookups spilled to disk (bounded memory)."""
    spill = step.pipeline.work_path
    with (
        KeyedRows(inputs.token_rows, "prompt_id", TOKEN_ROWS, spill_dir=spill) as tokenized,
        KeyedRows(inputs.prompt_rows, "prompt_id", PROMPT_ROWS, spill_dir=spill) as prompts,
    ):
        return build_training_shard(
            inputs.batches,
            inputs.active,
            tokenized,
            prompts,
            step.profile,
            tokenizer,
            bad_sample_ids=inputs.bad_sample_ids,
            bad_prompt_ids=inputs.bad_prompt_ids,
            out_path=out / "part-0000.parquet",
            quarantine_path=out / "quarantine.parquet",
            max_total_len=step.profile.max_train_len,
            spill_dir=spill,
            lineage=inputs.turns.lineage,
            schema=_table_schema(inputs.turns.lineage is not None, inputs.acceptance),
        )


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


def training_metadata(step: ShardStep, built: Any, summary: dict[str, Any], lineage: bool, out: Any) -> dict[str, Any]:
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
    inputs = training_inputs(step, renderer, stages.train_acceptance)
    out = step.folder("training_samples")
    built = build_shard(step, inputs, renderer.tokenizer, out)
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
