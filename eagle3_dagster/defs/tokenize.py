"""Tokenize wiring: `tokenized_prompts[shard]` and its blocking prompt gate."""

from collections.abc import Iterator
from typing import cast

import dagster as dg
import polars as pl

from ..config import settings
from ..ingest import load_source_specs
from ..orchestration.gates import HeadlineCheck, gate_check_results, gate_check_specs
from ..orchestration.partitions import shard_partitions
from ..orchestration.resources import PipelineSettings, cached_renderer
from ..orchestration.stage import arrow_batch, detached
from ..quality import prompt_features, run_gate, write_gate_result
from ..quality.report.previews import histograms_markdown
from ..schemas import TOKENIZE_REJECTS, TOKENIZED_PROMPTS
from ..storage import ONE_ROW_GROUP_BYTES, ParquetSink, parquet_file, parse_shard_key, shard_dir, write_frame_atomic
from ..tokenize import tokenize_prompts
from .common import ASSET_GROUP, STAGE_TAG

STAGE = "tokenize"
PROMPT_SLICE_ROWS = 4096  # prompts tokenized and written at a time (the step never holds the shard)


def source_control_text() -> dict[str, str]:
    """Source name -> its YAML's `control_text` policy (tokenize/control_text.py); {} without a sources folder
    (every source then gets the default, reject)."""
    sources_dir = settings().sources_dir
    if not sources_dir.is_dir():
        return {}
    return {spec.name: spec.control_text for spec in load_source_specs(sources_dir)}


def shard_prompts(prompts_path, shard: int) -> Iterator[pl.DataFrame]:
    """The shard's rows of prompts.parquet (every column, file order) in slices of PROMPT_SLICE_ROWS, streamed."""
    held: list[pl.DataFrame] = []
    n = 0
    for rb in parquet_file(prompts_path).iter_batches(batch_size=PROMPT_SLICE_ROWS):
        b = cast(pl.DataFrame, pl.from_arrow(rb)).filter(pl.col("shard") == shard)
        if b.height:
            held.append(b)
            n += b.height
        if n >= PROMPT_SLICE_ROWS:
            yield pl.concat(held)
            held, n = [], 0
    if held:
        yield pl.concat(held)


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
    group_name=ASSET_GROUP,
    deps=["prompts"],
    partitions_def=shard_partitions,
    check_specs=gate_check_specs("tokenized_prompts", "prompts", PROMPT_HEADLINES),
    description="Each prompt rendered with the model's chat template (generation prompt on, thinking on) and encoded "
    "exactly as the served model sees it; input_ids as list<int32>. Over-length prompts are quarantined, not truncated.",
    kinds={"parquet"},
    tags={STAGE_TAG: STAGE},
)
def tokenized_prompts(context: dg.AssetExecutionContext, pipeline: PipelineSettings) -> dg.MaterializeResult:
    shard = parse_shard_key(context.partition_key)
    data = pipeline.data_path
    profile = pipeline.profile()
    renderer = cached_renderer(profile)
    max_new = profile.max_new_tokens_for(pipeline.max_new_tokens)
    out = shard_dir(data, "tokenized_prompts", shard)
    # streamed: a slice of the shard's prompts at a time is tokenized and appended to the file; kept for
    # the whole shard: the rejects and the per-row gate features (scalars)
    n_in = n_ok = 0
    rejected: list[pl.DataFrame] = []
    feats: list[pl.DataFrame] = []
    control_text = source_control_text()
    sink = ParquetSink(out / "part-0000.parquet", TOKENIZED_PROMPTS, buffer_bytes=ONE_ROW_GROUP_BYTES)
    try:
        for prompts in shard_prompts(data / "prompts" / "prompts.parquet", shard):
            tokenized, rejects = tokenize_prompts(prompts, renderer, max_new_tokens=max_new, control_text=control_text)
            sink.write_table(arrow_batch(tokenized, TOKENIZED_PROMPTS))
            n_in, n_ok = n_in + prompts.height, n_ok + tokenized.height
            rejected.append(detached(rejects))  # kept for the shard: must not pin the slice (orchestration/stage.py)
            feats.append(detached(prompt_features(tokenized, profile)))
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    no_rejects = cast(pl.DataFrame, pl.from_arrow(TOKENIZE_REJECTS.empty_table()))
    rejects = pl.concat(rejected) if rejected else no_rejects
    write_frame_atomic(rejects, out / "rejects.parquet", schema=TOKENIZE_REJECTS)
    if n_in != n_ok + rejects.height:  # tokenize_prompts reconciles each slice; the sum must too
        raise RuntimeError(f"shard {shard}: {n_in} prompts in, {n_ok} tokenized + {rejects.height} rejected out")
    context.log.info(f"shard {shard}: {n_in} prompts -> {n_ok} tokenized, {rejects.height} rejected")

    empty = cast(pl.DataFrame, pl.from_arrow(TOKENIZED_PROMPTS.empty_table()))
    features = pl.concat(feats) if feats else prompt_features(empty, profile)
    gate = run_gate(
        "prompts",
        features,
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
        profile=profile,
        keep_validations=pipeline.gx_keep_validations,
    )
    write_gate_result(pipeline.data_path, "prompts", shard, gate)
    lens = features["prompt_len"] if features.height else pl.Series([0])
    return dg.MaterializeResult(
        metadata={
            "prompts_in": n_in,
            "tokenized": n_ok,
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
            "histograms": dg.MetadataValue.md(histograms_markdown(features, ["prompt_len"])),
        },
        check_results=gate_check_results("prompts", gate, PROMPT_HEADLINES),
    )


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[tokenized_prompts])
