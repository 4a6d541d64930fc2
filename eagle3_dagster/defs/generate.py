"""Generation wiring: `generations[shard]` through SGLang's native /generate, and its gate."""


import dagster as dg
import polars as pl

from ..generate import GenerationConfig, generate_shard, read_generations
from ..quality import generation_features, run_gate, write_gate_result
from ..storage import parse_shard_key, read_parquet_dir, shard_dir, write_frame_atomic
from ..schemas import TOKENIZED_PROMPTS
from .gates import HeadlineCheck, gate_check_results, gate_check_specs
from .metadata import to_metadata
from .partitions import shard_partitions
from .resources import PipelineSettings, SGLangFleet, cached_renderer

GROUP = "generate"
GENERATION_HEADLINES = (
    HeadlineCheck(
        "think_end_present",
        "think_end_present",
        "The profile's think-end id (163607 `</think>` for Kimi-K2.5) appears in output_ids. A systematic miss is "
        "the stripped-</think> bug this product exists to catch.",
    ),
)


@dg.asset(
    name="generations",
    group_name=GROUP,
    deps=["tokenized_prompts"],
    partitions_def=shard_partitions,
    pool="sglang",  # limits how many shard steps hit the fleet at once (instance concurrency pools)
    retry_policy=dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL),
    check_specs=gate_check_specs("generations", "generations", GENERATION_HEADLINES),
    description="Raw output_ids from SGLang POST /generate with input_ids (never the OpenAI chat endpoint), stored "
    "as received with finish_reason and meta_info. Resumable and incremental: only new cache keys hit the server.",
    kinds={"parquet"},
    tags={"eagle3/stage": "generate"},
)
def generations(
    context: dg.AssetExecutionContext, pipeline: PipelineSettings, sglang: SGLangFleet
) -> dg.MaterializeResult:
    shard = parse_shard_key(context.partition_key)
    data = pipeline.data_path
    profile = pipeline.profile()
    tokenized = read_parquet_dir(shard_dir(data, "tokenized_prompts", shard), schema=TOKENIZED_PROMPTS)
    overrides = {}
    if pipeline.max_new_tokens:
        overrides["max_new_tokens"] = pipeline.max_new_tokens
    if sglang.max_in_flight:
        overrides["max_in_flight"] = sglang.max_in_flight
    if sglang.model_revision:
        overrides["model_revision"] = sglang.model_revision
    if sglang.regen_seed is not None:
        overrides["regen_seed"] = sglang.regen_seed
    config = GenerationConfig.from_profile(profile, sglang.endpoints(), **overrides)
    out = shard_dir(data, "generations", shard)

    def progress(p) -> None:
        context.log.info(f"shard {shard}: {p}")

    report = generate_shard(tokenized, out, config, progress=progress)
    context.log.info(f"shard {shard}: done {report}")
    gens = read_generations(out)
    # Only this run's cache keys count: a changed config leaves older samples on disk, unused.
    if report.model_revision:
        gens = gens.filter(pl.col("model_revision") == report.model_revision)
    renderer = cached_renderer(profile)
    features = generation_features(gens, tokenized, profile, tokenizer=renderer.tokenizer)
    gate = run_gate("generations", features, expectations_dir=pipeline.expectations_path, context_dir=data / "gx", profile=profile)
    write_gate_result(data, "generations", shard, gate)
    write_frame_atomic(gate.row_failures, out / "quarantine.parquet")
    return dg.MaterializeResult(
        metadata={
            **to_metadata(report),
            "stored_samples": gens.height,
            "quarantined": gate.row_failures.height,
            "path": dg.MetadataValue.path(str(out)),
        },
        check_results=gate_check_results("generations", gate, GENERATION_HEADLINES),
    )
