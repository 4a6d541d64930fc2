"""The one Dagster entry point: `dagster dev -w workspace.yaml` and `dg` both load `defs`."""

from __future__ import annotations

import dagster as dg

from .defs.executors import executor_from_env
from .defs.generate import generations
from .defs.ingest import build_ingest_assets
from .defs.publish import ingest_job, nightly_fanout, nightly_regeneration, prompt_source_sensor, training_dataset
from .defs.resources import PipelineSettings, SGLangFleet
from .defs.tokenize import tokenized_prompts
from .defs.train import training_samples

all_assets = [*build_ingest_assets(), tokenized_prompts, generations, training_samples, training_dataset]

shard_pipeline_job = dg.define_asset_job(
    "shard_pipeline",
    selection=dg.AssetSelection.assets("tokenized_prompts", "generations", "training_samples"),
    description="tokenize -> generate -> train for one shard (a partition); backfill it for all shards.",
)
defs = dg.Definitions(
    assets=all_assets,
    jobs=[ingest_job, shard_pipeline_job],
    schedules=[nightly_regeneration],
    sensors=[nightly_fanout, prompt_source_sensor],
    resources={"pipeline": PipelineSettings(), "sglang": SGLangFleet()},
    executor=executor_from_env(),  # EAGLE3_EXECUTOR: multiprocess (default), in_process, k8s
)
