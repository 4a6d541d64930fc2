"""Generation wiring: `generations[shard]` through SGLang's native /generate, and its gate."""


import dagster as dg
import polars as pl

from ..generate import GenerationConfig, generate_shard, read_generations, sample_key
from ..quality import generation_features, histograms_markdown, run_gate, sample_preview_markdown, write_gate_result
from ..storage import parse_shard_key, read_parquet_dir, shard_dir, write_frame_atomic
from ..schemas import TOKENIZED_PROMPTS
from .gates import HeadlineCheck, gate_check_results, gate_check_specs
from .metadata import to_metadata
from .partitions import shard_partitions
from .resources import PipelineSettings, SGLangFleet, cached_renderer

GROUP = "generate"
ACTIVE_FILE = "active.parquet"


def active_sample_ids(tokenized: pl.DataFrame, model_revision: str, sampling_hash: str, regen_seed) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "sample_id": [
                sample_key(r["prompt_id"], model_revision, r["template_hash"] or "", sampling_hash, regen_seed)
                for r in tokenized.select("prompt_id", "template_hash").iter_rows(named=True)
            ],
            "prompt_id": tokenized["prompt_id"].to_list(),
        },
        schema={"sample_id": pl.String, "prompt_id": pl.String},
    )
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
    if sglang.read_timeout_s is not None:
        overrides["read_timeout_s"] = sglang.read_timeout_s
    if sglang.max_retries is not None:
        overrides["max_retries"] = sglang.max_retries
    config = GenerationConfig.from_profile(profile, sglang.endpoints(), **overrides)
    out = shard_dir(data, "generations", shard)

    def progress(p) -> None:
        context.log.info(f"shard {shard}: {p}")

    report = generate_shard(tokenized, out, config, progress=progress, lock_dir=pipeline.work_path / "locks")
    context.log.info(f"shard {shard}: done {report}")
    # The shard folder keeps every sample ever generated (a config change never deletes work);
    # this materialization's samples are exactly the current cache keys of its prompts.
    active = active_sample_ids(tokenized, report.model_revision, report.sampling_hash, config.regen_seed)
    write_frame_atomic(active, out / ACTIVE_FILE)
    gens = read_generations(out).join(active.select("sample_id"), on="sample_id", how="semi")
    renderer = cached_renderer(profile)
    features = generation_features(gens, tokenized, profile, tokenizer=renderer.tokenizer)
    gate = run_gate("generations", features, expectations_dir=pipeline.expectations_path, context_dir=pipeline.gx_context_dir, profile=profile)
    write_gate_result(data, "generations", shard, gate)
    write_frame_atomic(gate.row_failures, out / "quarantine.parquet")
    return dg.MaterializeResult(
        metadata={
            **to_metadata(report),
            "stored_samples": gens.height,
            "quarantined": gate.row_failures.height,
            "sample_preview": dg.MetadataValue.md(
                sample_preview_markdown(gens, tokenized, renderer.tokenizer, profile, n=3)
            ),
            "histograms": dg.MetadataValue.md(
                histograms_markdown(features, ["reasoning_len", "answer_len", "think_end_pos", "output_len"])
            ),
            "path": dg.MetadataValue.path(str(out)),
        },
        check_results=gate_check_results("generations", gate, GENERATION_HEADLINES),
    )
