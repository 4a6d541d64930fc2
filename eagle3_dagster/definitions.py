"""The one Dagster entry point: `dagster dev -w workspace.yaml` and `dg` both load `defs`."""

from __future__ import annotations

import dagster as dg

from .defs.automation import JOBS, SCHEDULES, SENSORS, freshness_checks
from .defs.executors import executor_from_env
from .defs.generate import generations
from .defs.ingest import build_ingest_assets
from .defs.publish import training_dataset
from .defs.resources import PipelineSettings, SGLangFleet
from .defs.tokenize import tokenized_prompts
from .defs.train import training_samples

all_assets = [*build_ingest_assets(), tokenized_prompts, generations, training_samples, training_dataset]

# Jobs, the nightly schedule, the sensors and the snapshot freshness check: defs/automation.py.
defs = dg.Definitions(
    assets=all_assets,
    asset_checks=freshness_checks,
    jobs=JOBS,
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources={"pipeline": PipelineSettings(), "sglang": SGLangFleet()},
    executor=executor_from_env(),  # EAGLE3_EXECUTOR: multiprocess (default), in_process, k8s
)
