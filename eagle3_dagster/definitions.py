"""The one Dagster entry point: `dagster dev -w workspace.yaml` and `dg` both load `defs`.

Assembled from the defs folder the way `dg` projects are (`dg.load_from_defs_folder`): every module
under eagle3_dagster/defs/ contributes its own `@dg.definitions` —

    defs/ingest.py, tokenize.py, generate.py, train.py, publish.py   the assets of each stage (+ checks)
    defs/automation.py                                               jobs, schedule, sensors, freshness check
    defs/common/__init__.py                                          asset names, group, stage tag
    defs/common/resources.py                                         resources and executor, bound from settings

Helpers that are not definitions (the gated-shard asset factory, run driver, gate -> check results,
metadata, partitions, resource types, executor choice) live in eagle3_dagster/orchestration/. A new
stage module is picked up without touching this file; tests/pipeline/test_defs_snapshot.py shows what
changed.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
