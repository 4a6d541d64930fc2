"""Tokenize wiring: `tokenized_prompts[shard]` and its blocking prompt gate."""

from typing import Any, cast

import dagster as dg
import polars as pl

from ..config import Settings
from ..ingest.pipeline import PROMPTS_FILE
from ..ingest.prompts_table import shard_prompts
from ..ingest.spec import source_control_text
from ..orchestration.asset_names import AssetName
from ..orchestration.gates import HeadlineCheck
from ..orchestration.partitions import shard_partitions
from ..orchestration.resources import cached_renderer
from ..orchestration.shard_asset import GatedShard, ShardAssetSpec, ShardStep, gated_shard_asset
from ..quality import prompt_features
from ..report.previews import histograms_markdown
from ..tokenize.shard import TokenizedShard, tokenize_shard

STAGE = "tokenize"
PROMPT_SLICE_ROWS = 4096  # prompts tokenized and written at a time (the step never holds the shard)


PROMPT_HEADLINES = (
    HeadlineCheck(
        "thinking_token_ends_prompt",
        "thinking_token_ends_prompt",
        "Every prompt's last id is the profile's think-start id (163606 `<think>` for Kimi-K2.5), where the profile's "
        "template prefills it.",
    ),
)


TOKENIZE = ShardAssetSpec(
    name=AssetName.TOKENIZED_PROMPTS,
    gate="prompts",
    stage=STAGE,
    deps=(AssetName.PROMPTS,),
    headlines=PROMPT_HEADLINES,
    description="Each prompt rendered with the model's chat template (generation prompt on, thinking on) and "
    "encoded exactly as the served model sees it; input_ids as list<int32>. Over-length prompts are quarantined, "
    "not truncated.",
)


def tokenize_metadata(step: ShardStep, done: TokenizedShard, renderer: Any, out: Any) -> dict[str, Any]:
    lens = done.features["prompt_len"] if done.features.height else pl.Series([0])
    rejects = done.rejects
    return {
        "prompts_in": done.prompts_in,
        "tokenized": done.tokenized,
        "rejected": rejects.height,
        "rejects_by_reason": dg.MetadataValue.json(
            dict(rejects.group_by("reason").len().iter_rows()) if rejects.height else {}
        ),
        "prompt_len_mean": float(cast(float, lens.mean()) or 0),  # an integer column: numbers or None
        "prompt_len_max": int(cast(int, lens.max()) or 0),
        "profile": step.profile.name,
        "tokenizer": step.profile.tokenizer,
        "tokenizer_fingerprint": renderer.tokenizer_fingerprint,
        "template_hash": renderer.template_hash,
        "path": dg.MetadataValue.path(str(out)),
        "histograms": dg.MetadataValue.md(histograms_markdown(done.features, ["prompt_len"])),
    }


def tokenize_step(step: ShardStep) -> GatedShard:
    renderer = cached_renderer(step.profile)
    out = step.folder("tokenized_prompts")
    done = tokenize_shard(
        shard_prompts(step.data / "prompts" / PROMPTS_FILE, step.shard, batch_rows=PROMPT_SLICE_ROWS),
        renderer,
        out,
        max_new_tokens=step.profile.max_new_tokens_for(step.pipeline.max_new_tokens),
        control_text=source_control_text(step.pipeline.sources_path),
        features=lambda tokenized: prompt_features(tokenized, step.profile),
    )
    step.log.info(
        f"shard {step.shard}: {done.prompts_in} prompts -> {done.tokenized} tokenized, {done.rejects.height} rejected"
    )
    return GatedShard(done.features, tokenize_metadata(step, done, renderer, out))


def tokenized_prompts(s: Settings) -> dg.AssetsDefinition:
    """`tokenized_prompts` over the shard partitions of `s`."""
    return gated_shard_asset(TOKENIZE, shard_partitions(s.shards.n_shards))(tokenize_step)


def build_defs(s: Settings) -> dg.Definitions:
    return dg.Definitions(assets=[tokenized_prompts(s)])
