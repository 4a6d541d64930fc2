"""Four shard runs at once on a PostgreSQL-backed Dagster instance share a pool limit of 2.

Real parts only: a private PostgreSQL cluster from the OS packages (127.0.0.1, free port), the
documented docs/dagster.yaml.postgres (dagster-postgres run/event/schedule storage, `concurrency:
pools: default_limit: 2`) as the instance config, one simulator process with per-token latency, and four separate Python
processes each materializing one shard (tokenize -> generate -> train) like `eagle3 demo` does.

How Dagster 1.13 enforces it: `generations` declares `pool="sglang"`. With no explicit
`granularity`, pools are enforced per op/asset step: before a step starts, the executor of its run
(in-process here; also multiprocess and step-delegating executors such as k8s) claims a slot for
the pool in the instance's event-log storage (`claim_concurrency_slot`, a row lock in Postgres),
and frees it after the step's success/failure event is written. An unconfigured pool gets
`default_limit` on first use (here by the ingest run's graph call, `orchestration.run.prime_pools`: four first
claims at once race on creating it in PostgreSQL). So STEP_START of a `generations` step is written only while holding
a slot and STEP_SUCCESS before releasing it: the event log shows the true overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster import DagsterEventType
from rel_helpers import PYTHON, ROOT, child_env, postgres_cluster

from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration

WORKER = str(Path(__file__).with_name("shard_worker.py"))
SHARDS = ["0000", "0001", "0002", "0003"]
POOL = "sglang"


@pytest.fixture(scope="module")
def pg():
    with postgres_cluster() as cluster:
        yield cluster


def _spans(instance: dg.DagsterInstance, run_id: str) -> dict[str, tuple[float, float]]:
    """step key -> (STEP_START timestamp, STEP_SUCCESS timestamp) from the instance's event log."""
    starts, ends = {}, {}
    for rec in instance.all_logs(run_id):
        ev = rec.dagster_event
        if ev is None or not ev.step_key:
            continue
        if ev.event_type == DagsterEventType.STEP_START:
            starts[ev.step_key] = rec.timestamp
        elif ev.event_type == DagsterEventType.STEP_SUCCESS:
            ends[ev.step_key] = rec.timestamp
    return {k: (starts[k], ends[k]) for k in starts if k in ends}


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])  # end before start on ties
    cur = best = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def test_four_parallel_shard_runs_respect_pool_limit(pg, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    # the documented example, as is: its storage and pool settings are what is under test
    example = (ROOT / "docs" / "dagster.yaml.postgres").read_text()
    assert "default_limit: 2" in example
    (home / "dagster.yaml").write_text(example)
    data = tmp_path / "data"

    with start_simulator(extra_args=["--token-latency-ms", "8"], log_dir=tmp_path) as sim:
        env = child_env(
            DAGSTER_HOME=str(home), DAGSTER_PG_URL=pg.url, EAGLE3_DATA_DIR=str(data), EAGLE3_SGLANG_URL=sim.url
        )
        ingest = subprocess.run(
            [PYTHON, WORKER, "--ingest"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
        )
        assert ingest.returncode == 0, ingest.stdout + ingest.stderr[-3000:]
        assert json.loads(ingest.stdout.strip().splitlines()[-1])["storage"] == "PostgresEventLogStorage"

        go = tmp_path / "go"
        procs = []
        for key in SHARDS:
            ready = tmp_path / f"ready-{key}"
            procs.append(
                (
                    key,
                    ready,
                    subprocess.Popen(
                        [PYTHON, WORKER, "--shard", key, "--ready", str(ready), "--go", str(go)],
                        env=env,
                        cwd=ROOT,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    ),
                )
            )
        try:
            deadline = time.monotonic() + 120
            while not all(r.exists() for _, r, _ in procs):
                assert all(p.poll() is None for _, _, p in procs), "a worker died before starting its run"
                assert time.monotonic() < deadline, "workers not ready in time"
                time.sleep(0.1)
            go.touch()  # all four runs start now
            results = {}
            for key, _, p in procs:
                out, err = p.communicate(timeout=240)
                assert p.returncode == 0, f"shard {key} run failed:\n{out}\n{err[-4000:]}"
                results[key] = json.loads(out.strip().splitlines()[-1])
        finally:
            for _, _, p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        sim_stats = sim_stats_json(sim.url)

    # every run succeeded, with its gates passing
    for key in SHARDS:
        sh = results[key]["shards"][0]
        assert sh["success"], sh
        assert sh["materialized"] == ["generations", "tokenized_prompts", "training_samples"], sh
        assert sh["checks"]["generations:think_end_present"] is True
        assert (data / "training_samples" / f"shard={key}" / "part-0000.parquet").exists()
    assert sim_stats["requests"] > 0

    # the runs and their events are in PostgreSQL, and the pool holds the configured limit
    os.environ["DAGSTER_PG_URL"] = pg.url
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            run_ids = [results[k]["shards"][0]["run_id"] for k in SHARDS]
            runs = {r.run_id: r for r in instance.get_runs()}
            assert all(runs[r].status == dg.DagsterRunStatus.SUCCESS for r in run_ids)
            pool_slots = instance.event_log_storage.get_concurrency_info(POOL).slot_count

            spans = {rid: _spans(instance, rid) for rid in run_ids}
    finally:
        os.environ.pop("DAGSTER_PG_URL", None)
    # ingest + four shards (+ the quality report after each shard), written by five processes
    assert int(pg.psql("select count(*) from runs where pipeline_name <> 'report'")) == 5

    t0 = min(v[0] for s in spans.values() for v in s.values())
    timeline = "\n".join(
        f"run {rid[:8]}: " + ", ".join(f"{k} {a - t0:.1f}s..{b - t0:.1f}s" for k, (a, b) in s.items())
        for rid, s in spans.items()
    )
    print(timeline)
    gen = [s["generations"] for s in spans.values()]
    tok_done = [s["tokenized_prompts"][1] for s in spans.values()]
    # at most two generation steps ever ran at once ...
    assert _max_overlap(gen) == 2, timeline
    # ... although more were ready: at some moment >= 3 runs had finished tokenizing and not yet
    # finished generating, so the third and fourth waited for a slot rather than running alongside.
    waiting = max(
        sum(1 for td, (_, ge) in zip(tok_done, gen) if td <= t < ge) for t in [*tok_done, *(s for s, _ in gen)]
    )
    assert waiting >= 3, timeline
    # and the waiting was real: the last generation started only after an earlier one had ended
    assert max(s for s, _ in gen) >= min(e for _, e in gen), timeline
    assert pool_slots == 2  # created from default_limit by the ingest run's process, before the four runs raced


def sim_stats_json(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/_sim/stats", timeout=10).json()
