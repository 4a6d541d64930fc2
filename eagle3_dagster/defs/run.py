"""Materialize the graph on a Dagster instance from Python: ingest once, then each shard.

Used by `eagle3 demo` and by the end-to-end tests, so what they exercise is the real graph,
its real checks and a real instance (runs show up in the UI afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from .partitions import shard_partitions

SHARD_ASSETS = ("tokenized_prompts", "generations", "training_samples")
# Dagster's console logger defaults to DEBUG (every engine event); progress and results are INFO.
QUIET = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


@dataclass
class ShardOutcome:
    shard: str
    success: bool
    checks: dict[str, bool] = field(default_factory=dict)  # "asset:check" -> passed
    materialized: list[str] = field(default_factory=list)
    skipped_or_failed: list[str] = field(default_factory=list)
    run_id: str = ""


@dataclass
class GraphOutcome:
    ingest_success: bool
    ingest_run_id: str
    shards: list[ShardOutcome]
    publish_success: bool | None = None  # None: not attempted
    snapshot_version: str | None = None

    @property
    def success(self) -> bool:
        return self.ingest_success and all(s.success for s in self.shards) and self.publish_success is not False


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for ev in result.get_asset_check_evaluations():
        out[f"{ev.asset_key.to_user_string()}:{ev.check_name}"] = bool(ev.passed)
    return out


def materialize_graph(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    shards: list[str] | None = None,
    resources: dict[str, Any] | None = None,
    run_ingest: bool = True,
    run_publish: bool = False,
    run_config: dict[str, Any] | None = None,
) -> GraphOutcome:
    """Ingest, then each shard's tokenize -> generate -> train run, then (optionally) the snapshot.

    A failed shard does not stop the others, and the snapshot step still runs: it records which
    shards it left out and why.
    """
    assets = list(defs.assets or [])
    res = dict(defs.resources or {})
    res.update(resources or {})
    ingest_ok, ingest_run = True, ""
    if run_ingest:
        r = dg.materialize(
            assets, selection=dg.AssetSelection.groups("ingest"), instance=instance, resources=res,
            raise_on_error=False, run_config=run_config or QUIET,
        )
        ingest_ok, ingest_run = r.success, r.run_id
        if not r.success:
            return GraphOutcome(False, r.run_id, [])
    outcomes = []
    for key in shards if shards is not None else shard_partitions.get_partition_keys():
        r = dg.materialize(
            assets,
            selection=dg.AssetSelection.assets(*SHARD_ASSETS),
            partition_key=key,
            instance=instance,
            resources=res,
            raise_on_error=False,
            run_config=run_config or QUIET,
        )
        done = sorted({e.asset_key.to_user_string() for e in r.get_asset_materialization_events()})
        outcomes.append(
            ShardOutcome(
                shard=key,
                success=r.success,
                checks=_checks(r),
                materialized=done,
                skipped_or_failed=[a for a in SHARD_ASSETS if a not in done],
                run_id=r.run_id,
            )
        )
    outcome = GraphOutcome(ingest_ok, ingest_run, outcomes)
    if run_publish:
        r = dg.materialize(
            assets, selection=["training_dataset"], instance=instance, resources=res, raise_on_error=False,
            run_config=run_config or QUIET,
        )
        outcome.publish_success = r.success
        for ev in r.get_asset_materialization_events():
            version = ev.materialization.metadata.get("version")
            outcome.snapshot_version = getattr(version, "value", None)
    return outcome
