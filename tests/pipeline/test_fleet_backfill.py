"""A backfill of shard partitions through the REAL daemon overlaps its shard runs within the pool limit.

`bench/fleet.py --only backfill` (small: 4 shards, 2 simulator workers with per-token latency) does
what a user does: `eagle3 check` sizes the `sglang` pool from the workers' /server_info into
dagster.yaml, `dagster-daemon run`, the ingest job through the run queue, then the UI's
launchPartitionBackfill mutation. This test then reads the instance it left: run start/end times
and the event log's step times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from eagle3_dagster.config import PROJECT_ROOT

# Minutes of a real daemon running four shard runs: `make test-full`. The pool sizing and limits are tested in
# `make test` (tests/pipeline/test_fleet_pools.py, tests/generate/test_router_capacity.py).
pytestmark = [pytest.mark.integration, pytest.mark.full]


def _steps(instance: dg.DagsterInstance, run_id: str) -> dict[str, tuple[float, float]]:
    kinds = {dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS}
    starts: dict[str, float] = {}
    out: dict[str, tuple[float, float]] = {}
    for rec in instance.all_logs(run_id, of_type=kinds):
        if rec.step_key is None or rec.dagster_event is None:
            continue
        if rec.dagster_event.event_type == dg.DagsterEventType.STEP_START:
            starts[rec.step_key] = rec.timestamp
        else:
            out[rec.step_key] = (starts[rec.step_key], rec.timestamp)
    return out


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    return max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals)


def test_a_four_shard_backfill_overlaps_runs_and_keeps_generation_within_the_pool(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(PROJECT_ROOT / "bench" / "fleet.py"),
        "--only",
        "backfill",
        "--shards",
        "4",
        "--workers",
        "2",
        "--prompts-per-shard",
        "24",
        "--max-running",
        "8",
        "--token-latency-ms",
        "10",
        "--work",
        str(tmp_path),
        "--timeout",
        "480",
    ]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    result = out["backfill"]
    assert result["failed_shards"] == [] and result["requests"] >= 4 * 10

    home = tmp_path / "dagster_home"
    cfg = yaml.safe_load((home / "dagster.yaml").read_text())
    # 2 workers x 8 slots, the default window covers them: 1 shard fills the fleet, + 1 for the tail
    limit = cfg["concurrency"]["pools"]["default_limit"]
    assert limit == 2 and "2 endpoint(s), 16 slots" in out["pool"]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        recs = [
            rec
            for rec in instance.get_run_records()
            if rec.dagster_run.tags.get("dagster/backfill") and rec.dagster_run.status == dg.DagsterRunStatus.SUCCESS
        ]
        assert sorted(rec.dagster_run.tags["dagster/partition"] for rec in recs) == ["0000", "0001", "0002", "0003"]
        runs = [(rec.start_time, rec.end_time) for rec in recs]
        assert all(s is not None and e is not None for s, e in runs)
        assert _most_at_once(runs) >= 2, runs  # the daemon ran shard runs side by side, not one after another
        steps = {rec.dagster_run.run_id: _steps(instance, rec.dagster_run.run_id) for rec in recs}
        gens = [s["generations"] for s in steps.values()]
        assert _most_at_once(gens) <= limit, gens  # never more shards at the fleet than the pool allows
        assert _most_at_once(gens) == limit, gens  # and the pool was used: two shards generated at once
        # a later shard tokenized while another shard was generating (the tokenize step is in no pool)
        overlaps = [
            (a, b)
            for a, sa in steps.items()
            for b, sb in steps.items()
            if a != b
            and sa["tokenized_prompts"][0] < sb["generations"][1]
            and sb["generations"][0] < sa["tokenized_prompts"][1]
        ]
        assert overlaps, steps
