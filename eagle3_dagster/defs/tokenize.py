"""Tokenize wiring: `tokenized_prompts[shard]` and its blocking prompt gate."""

from typing import cast

import dagster as dg
import polars as pl

from ..orchestration.gates import HeadlineCheck, gate_check_results, gate_check_specs, store_gate_result
from ..orchestration.partitions import shard_partitions
from ..orchestration.resources import PipelineSettings, cached_renderer
from ..quality import histograms_markdown, prompt_features, run_gate
from ..schemas import TOKENIZE_REJECTS, TOKENIZED_PROMPTS
from ..storage import parse_shard_key, read_parquet, shard_dir, write_frame_atomic
from ..tokenize import tokenize_prompts

GROUP = "tokenize"
PROMPT_HEADLINES = (
    HeadlineCheck(
        "thinking_token_ends_prompt",
        "thinking_token_ends_prompt",
        "Every prompt's last id is the profile's think-start id (163606 `<think>` for Kimi-K2.5), where the profile's "
        "template prefills it.",
    ),
)


@dg.asset(
    name="tokenized_prompts",
    group_name=GROUP,
    deps=["prompts"],
    partitions_def=shard_partitions,
    check_specs=gate_check_specs("tokenized_prompts", "prompts", PROMPT_HEADLINES),
    description="Each prompt rendered with the model's chat template (generation prompt on, thinking on) and encoded "
    "exactly as the served model sees it; input_ids as list<int32>. Over-length prompts are quarantined, not truncated.",
    kinds={"parquet"},
    tags={"eagle3/stage": "tokenize"},
)
def tokenized_prompts(context: dg.AssetExecutionContext, pipeline: PipelineSettings) -> dg.MaterializeResult:
    shard = parse_shard_key(context.partition_key)
    data = pipeline.data_path
    profile = pipeline.profile()
    prompts = read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == shard)
    renderer = cached_renderer(profile)
    max_new = profile.max_new_tokens_for(pipeline.max_new_tokens)
    tokenized, rejects = tokenize_prompts(prompts, renderer, max_new_tokens=max_new)
    out = shard_dir(data, "tokenized_prompts", shard)
    write_frame_atomic(tokenized, out / "part-0000.parquet", schema=TOKENIZED_PROMPTS)
    write_frame_atomic(rejects, out / "rejects.parquet", schema=TOKENIZE_REJECTS)
    context.log.info(
        f"shard {shard}: {prompts.height} prompts -> {tokenized.height} tokenized, {rejects.height} rejected"
    )

    features = prompt_features(tokenized, profile)
    gate = run_gate(
        "prompts",
        features,
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
        profile=profile,
        keep_validations=pipeline.gx_keep_validations,
    )
    report_meta = store_gate_result(context, pipeline, "prompts", shard, gate, profile.name)
    lens = tokenized["prompt_len"] if tokenized.height else pl.Series([0])
    return dg.MaterializeResult(
        metadata={
            "prompts_in": prompts.height,
            "tokenized": tokenized.height,
            "rejected": rejects.height,
            "rejects_by_reason": dg.MetadataValue.json(
                dict(rejects.group_by("reason").len().iter_rows()) if rejects.height else {}
            ),
            "prompt_len_mean": float(cast(float, lens.mean()) or 0),  # an integer column: numbers or None
            "prompt_len_max": int(cast(int, lens.max()) or 0),
            "profile": profile.name,
            "tokenizer": profile.tokenizer,
            "tokenizer_fingerprint": renderer.tokenizer_fingerprint,
            "template_hash": renderer.template_hash,
            "path": dg.MetadataValue.path(str(out)),
            **report_meta,
            "histograms": dg.MetadataValue.md(histograms_markdown(features, ["prompt_len"])),
        },
        check_results=gate_check_results("prompts", gate, PROMPT_HEADLINES),
    )


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[tokenized_prompts])
