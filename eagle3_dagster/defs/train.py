"""Training wiring: `training_samples[shard]`, consuming only shards whose gates passed."""

import itertools
import json
from collections.abc import Iterable
from typing import cast

import dagster as dg
import polars as pl

from ..config import apply_tokenizers_parallelism
from ..generate.active import ActiveSamplesMissingError, read_active_samples
from ..generate.multiturn import current_turns, turn_generations
from ..generate.store import iter_generations
from ..orchestration.gates import gate_check_specs
from ..orchestration.metadata import to_metadata
from ..orchestration.partitions import shard_partitions
from ..orchestration.resources import PipelineSettings, cached_renderer
from ..orchestration.stage import gated_result
from ..quality import GateFailedError, require_gate_passed
from ..quality.features import available_source_shares, with_training_table_features
from ..schemas import GENERATIONS, TOKENIZED_PROMPTS, TRAINING_SAMPLES, TRAINING_SAMPLES_TURNS
from ..storage import parquet_num_rows, parse_shard_key, read_parquet, read_parquet_dir, shard_dir
from ..train.multiturn import rows_by_turn, with_turns
from ..train.shard import build_training_shard
from ..train.summary import SUMMARY_FILE, headline, summarize

GROUP = "train"
GENERATION_BATCH_ROWS = 512  # generations parsed and built at a time (train/shard.py streams the shard)


@dg.asset(
    name="training_samples",
    group_name=GROUP,
    deps=["generations", "tokenized_prompts"],
    partitions_def=shard_partitions,
    check_specs=gate_check_specs("training_samples", "training_samples", ()),
    description="input_ids = prompt ids + output ids (exactly as generated), loss_mask 0 over the prompt and 1 over "
    "the output; only rows that passed every critical gate expectation; lineage on every row; text_exact = false "
    "flags rows whose text re-encodes to other ids (kept: non-canonical tokenization is valid model output).",
    kinds={"parquet"},
    tags={"eagle3/stage": "train"},
)
def training_samples(context: dg.AssetExecutionContext, pipeline: PipelineSettings) -> dg.MaterializeResult:
    shard = parse_shard_key(context.partition_key)
    data = pipeline.data_path
    profile = pipeline.profile()
    try:  # cross-run gating: a shard whose gate failed (in any earlier run) is never consumed
        gates = {g: require_gate_passed(data, g, shard) for g in ("prompts", "generations")}
    except GateFailedError as e:
        raise dg.Failure(description=f"{e}; refusing to build training samples from it") from None
    tokenized = read_parquet_dir(shard_dir(data, "tokenized_prompts", shard), schema=TOKENIZED_PROMPTS)
    gen_dir = shard_dir(data, "generations", shard)
    try:  # only the samples of the latest generations materialization (the current cache keys), streamed
        active_samples = read_active_samples(gen_dir)
    except ActiveSamplesMissingError as e:
        raise dg.Failure(f"shard {shard:04d}: {e}") from None
    active = active_samples["sample_id"]
    errors_path = gen_dir / "errors.parquet"
    prompts = read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == shard)
    apply_tokenizers_parallelism()  # the batch decode/encode of the round trip on every core
    renderer = cached_renderer(profile)
    bad_prompts = set(gates["prompts"].row_failures["row_id"].to_list())
    # the turns of all_turns conversations: one row each, built like any sample (train/multiturn.py)
    turns = current_turns(gen_dir, active_samples)
    wt = with_turns(
        cast(pl.DataFrame, pl.from_arrow(GENERATIONS.empty_table())),  # the generations come streamed below
        tokenized,
        prompts,
        turns,
        profile_name=profile.name,
        tokenizer_fingerprint=renderer.tokenizer_fingerprint,
        bad_prompt_ids=bad_prompts,
    )
    batches: Iterable[pl.DataFrame] = iter_generations(gen_dir, only=active, batch_rows=GENERATION_BATCH_ROWS)
    if turns.height:
        batches = itertools.chain(batches, [turn_generations(turns)])
    out = shard_dir(data, "training_samples", shard)
    built = build_training_shard(
        batches,
        active,
        wt.tokenized,
        wt.prompts,
        profile,
        renderer.tokenizer,
        bad_sample_ids=set(gates["generations"].row_failures["row_id"].to_list()) | wt.exclude_sample_ids,
        bad_prompt_ids=bad_prompts,
        out_path=out / "part-0000.parquet",
        quarantine_path=out / "quarantine.parquet",
        max_total_len=profile.max_train_len,
        spill_dir=pipeline.work_path,
        lineage=wt.lineage,
        schema=TRAINING_SAMPLES if wt.lineage is None else TRAINING_SAMPLES_TURNS,
    )
    counts, parse_counts = built.counts, built.parse_counts
    rt_rate = parse_counts["round_trip_ok"] / parse_counts["parsed"] if parse_counts["parsed"] else 1.0
    features = with_training_table_features(built.row_features, available_source_shares(wt.source_tokenized))
    # the shard's distribution summary, for the report's per-shard charts (train/summary.py)
    summary = summarize(built.stats)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str))
    context.log.info(
        f"training_samples shard {shard:04d}: "
        + " · ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in dict(counts).items())
    )
    if parse_counts["text_exact_false"]:
        context.log.warning(
            f"shard {shard}: {parse_counts['text_exact_false']} of {counts['samples']} rows are not text-exact "
            "(non-canonical tokenization: their text re-encodes to other ids); kept in training_samples and "
            "specforge_prompts.jsonl, flagged in conversations.jsonl, left out of specforge_preformatted.jsonl"
        )
    _, result = gated_result(
        context,
        pipeline,
        "training_samples",
        shard,
        features,
        profile,
        metadata={
            **to_metadata(counts),
            **to_metadata(parse_counts),
            "round_trip_rate": rt_rate,
            "text_exact_rows": built.text_exact_rows,
            "generation_errors": parquet_num_rows(errors_path) if errors_path.exists() else 0,
            **(
                {"turn_rows": dg.MetadataValue.json(rows_by_turn(built.lineage_rows))} if wt.lineage is not None else {}
            ),
            "supervised_tokens": built.supervised_tokens,
            **{f"summary/{k}": v for k, v in headline(summary).items() if k != "rows"},
            "path": dg.MetadataValue.path(str(out / "part-0000.parquet")),
        },
    )
    return result


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[training_samples])
