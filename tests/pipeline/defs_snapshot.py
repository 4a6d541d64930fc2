"""What the code location defines, as plain JSON: asset keys, deps, checks, partitions, pools, jobs,
schedules, sensors, resources, executor and the instance's pool limit.

Run as a script by tests/pipeline/test_defs_snapshot.py in a clean environment (every setting at its
default), so the snapshot does not depend on the machine: no paths, ports or timestamps in it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import dagster as dg
import yaml


def _partitions(pdef: dg.PartitionsDefinition | None) -> dict[str, Any] | None:
    if pdef is None:
        return None
    keys = list(pdef.get_partition_keys())
    return {"type": type(pdef).__name__, "count": len(keys), "keys": keys}


def _retry(policy: dg.RetryPolicy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    return {"max_retries": policy.max_retries, "delay": policy.delay, "backoff": getattr(policy.backoff, "value", None)}


def definitions_snapshot(defs: dg.Definitions) -> dict[str, Any]:
    graph = defs.resolve_asset_graph()
    assets: dict[str, Any] = {}
    for spec in sorted(defs.resolve_all_asset_specs(), key=lambda s: s.key.to_user_string()):
        key = spec.key.to_user_string()
        ad = defs.resolve_assets_def(spec.key)
        assets[key] = {
            "group": spec.group_name,
            "deps": sorted(d.asset_key.to_user_string() for d in spec.deps),
            "partitions": _partitions(spec.partitions_def),
            "pool": ad.op.pool,
            "retry_policy": _retry(ad.op.retry_policy),
            "kinds": sorted(spec.kinds),
            "tags": dict(sorted((k, v) for k, v in spec.tags.items() if not k.startswith("dagster/kind/"))),
            "checks": {
                c.name: {"blocking": c.blocking}
                for c in sorted(ad.check_specs, key=lambda c: c.name)
                if c.asset_key == spec.key
            },
        }
    separate_checks = {
        f"{c.asset_key.to_user_string()}:{c.name}": {"blocking": c.blocking}
        for checks_def in defs.asset_checks or []
        for c in checks_def.check_specs
    }
    jobs = {
        j.name: {
            "assets": sorted(k.to_user_string() for k in j.selection.resolve(graph)),  # type: ignore[union-attr]
            "partitioned": defs.resolve_job_def(j.name).partitions_def is not None,
        }
        for j in sorted(defs.jobs or [], key=lambda j: j.name)
    }
    schedules = {
        s.name: {
            "cron": s.cron_schedule,
            "timezone": s.execution_timezone,
            "job": s.job_name,
            "default_status": s.default_status.value,
            "tags": dict(s.tags),
        }
        for s in sorted((defs.resolve_schedule_def(s.name) for s in defs.schedules or []), key=lambda s: s.name)
    }
    sensors = {
        s.name: {
            "type": s.sensor_type.value,
            "requests_job": s.job_name if s.has_jobs and len(s.jobs) == 1 else None,
            "minimum_interval_seconds": s.minimum_interval_seconds,
            "default_status": s.default_status.value,
        }
        for s in sorted((defs.resolve_sensor_def(s.name) for s in defs.sensors or []), key=lambda s: s.name)
    }
    resources = {
        name: {"type": type(r).__name__, "fields": sorted(type(r).model_fields)}
        for name, r in sorted((defs.resources or {}).items())
    }
    from eagle3_dagster.app.instance import INSTANCE_YAML

    return {
        "assets": assets,
        "asset_checks": separate_checks,
        "jobs": jobs,
        "schedules": schedules,
        "sensors": sensors,
        "resources": resources,
        "executor": defs.executor.name if isinstance(defs.executor, dg.ExecutorDefinition) else None,
        "instance_concurrency": yaml.safe_load(INSTANCE_YAML)["concurrency"],
    }


if __name__ == "__main__":
    from eagle3_dagster.definitions import defs

    json.dump(definitions_snapshot(defs), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
