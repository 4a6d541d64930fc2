"""Training wiring: `training_samples[shard]`, consuming only shards whose gates passed."""

import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any, cast

import dagster as dg
import polars as pl

from ..config import apply_tokenizers_parallelism, settings
from ..generate.active import ActiveSamplesMissingError, read_active_samples
from ..generate.inputs import iter_batches
from ..generate.multiturn import current_turns, turn_generations, turn_prompt_rows, turn_tokenized
from ..generate.probes import without_probes
from ..generate.store import iter_generations
from ..ingest.spec import probe_source_names
from ..orchestration.gate_step import gated_result
from ..orchestration.gates import gate_check_specs
from ..orchestration.metadata import to_metadata
from ..orchestration.partitions import shard_partitions
from ..orchestration.resources import PipelineSettings, cached_renderer
from ..quality import GateFailedError, require_gate_passed
from ..quality.features import available_source_shares, with_training_table_features
from ..schemas import GENERATIONS, TRAINING_SAMPLES, TRAINING_SAMPLES_TURNS
from ..storage import KeyedRows, parquet_file, parquet_num_rows, parse_shard_key, shard_dir
from ..train.multiturn import rows_by_turn, with_turns
from ..train.samples import ACCEPTANCE_COLUMNS, TRAINING_INPUT_COLUMNS, with_acceptance
from ..train.shard import build_training_shard
from ..train.summary import SUMMARY_FILE, headline, summarize
from .common import ASSET_GROUP, STAGE_TAG
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


@dg.asset(
    name="training_samples",
    group_name=ASSET_GROUP,
    deps=["generations", "tokenized_prompts"],
    partitions_def=shard_partitions,
    check_specs=gate_check_specs("training_samples", "training_samples", ()),
    description="input_ids = prompt ids + output ids (exactly as generated), loss_mask 0 over the prompt and 1 over "
    "the output; only rows that passed every critical gate expectation; lineage on every row; text_exact = false "
    "flags rows whose text re-encodes to other ids (kept: non-canonical tokenization is valid model output).",
    kinds={"parquet"},
    tags={STAGE_TAG: STAGE},
)
def training_samples(context: dg.AssetExecutionContext, pipeline: PipelineSettings) -> dg.MaterializeResult:
    shard = parse_shard_key(context.partition_key)
    data = pipeline.data_path
    profile = pipeline.profile()
    try:  # cross-run gating: a shard whose gate failed (in any earlier run) is never consumed
        gates = {g: require_gate_passed(data, g, shard) for g in ("prompts", "generations")}
    except GateFailedError as e:
        raise dg.Failure(description=f"{e}; refusing to build training samples from it") from None
    tok_src = tokenized_source(data, shard)  # a folder, streamed: the shard's prompt ids are never held whole
    gen_dir = shard_dir(data, "generations", shard)
    try:  # only the samples of the latest generations materialization (the current cache keys), streamed
        active_samples = read_active_samples(gen_dir)
    except ActiveSamplesMissingError as e:
        raise dg.Failure(f"shard {shard:04d}: {e}") from None
    source_of = pl.concat(list(iter_batches(tok_src, ["prompt_id", "source"])) or [_NO_SOURCES])
    probe_sources = probe_source_names(settings().sources_dir)
    training_only = without_probes(active_samples, source_of, probe_sources)  # probe sets: never trained on
    if training_only.height != active_samples.height:
        context.log.info(
            f"shard {shard:04d}: {active_samples.height - training_only.height:,} probe sample(s) of "
            f"{', '.join(probe_sources)} left out of training (role: probe)"
        )
    active_samples = training_only
    active = active_samples["sample_id"]
    errors_path = gen_dir / "errors.parquet"
    prompts_path = data / "prompts" / "prompts.parquet"
    apply_tokenizers_parallelism()  # the batch decode/encode of the round trip on every core
    renderer = cached_renderer(profile)
    bad_prompts = set(gates["prompts"].row_failures["row_id"].to_list())
    # the turns of all_turns conversations: one row each, built like any sample (train/multiturn.py)
    turns = current_turns(gen_dir, active_samples)
    wt = with_turns(  # per-row scalars only here: the prompts' ids and messages are looked up per batch below
        cast(pl.DataFrame, pl.from_arrow(GENERATIONS.empty_table())),  # the generations come streamed below
        source_of,
        pl.DataFrame(schema=PROMPT_ROWS),
        turns,
        profile_name=profile.name,
        tokenizer_fingerprint=renderer.tokenizer_fingerprint,
        bad_prompt_ids=bad_prompts,
    )
    extra_tok: list[pl.DataFrame] = []
    extra_prompts: list[pl.DataFrame] = []
    if turns.height:  # each turn's exact prompt ids and messages, looked up like the prompts'
        tt = turn_tokenized(turns, profile_name=profile.name, tokenizer_fingerprint=renderer.tokenizer_fingerprint)
        extra_tok, extra_prompts = [tt], [turn_prompt_rows(turns)]
    acceptance = settings().train_acceptance  # EAGLE3_TRAIN_ACCEPTANCE: the per-row acceptance columns
    batches: Iterable[pl.DataFrame] = iter_generations(
        gen_dir,
        only=active,
        batch_rows=GENERATION_BATCH_ROWS,
        columns=(*TRAINING_INPUT_COLUMNS, *(ACCEPTANCE_COLUMNS if acceptance else ())),
    )
    if turns.height:
        batches = itertools.chain(batches, [turn_generations(turns)])
    out = shard_dir(data, "training_samples", shard)
    with (
        KeyedRows(
            itertools.chain(iter_batches(tok_src, list(TOKEN_ROWS)), extra_tok),
            "prompt_id",
            TOKEN_ROWS,
            spill_dir=pipeline.work_path,
        ) as tokenized,
        KeyedRows(
            itertools.chain(shard_prompt_batches(prompts_path, shard), extra_prompts),
            "prompt_id",
            PROMPT_ROWS,
            spill_dir=pipeline.work_path,
        ) as prompts,
    ):
        built = build_training_shard(
            batches,
            active,
            tokenized,
            prompts,
            profile,
            renderer.tokenizer,
            bad_sample_ids=set(gates["generations"].row_failures["row_id"].to_list()) | wt.exclude_sample_ids,
            bad_prompt_ids=bad_prompts,
            out_path=out / "part-0000.parquet",
            quarantine_path=out / "quarantine.parquet",
            max_total_len=profile.max_train_len,
            spill_dir=pipeline.work_path,
            lineage=wt.lineage,
            schema=_table_schema(wt.lineage is not None, acceptance),
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
