"""`eagle3 backfill` (what `make backfill` runs): the whole graph against the configured server, in the order
and by the publish rule every graph run follows (orchestration/sequence.py), the quality report last, and a
summary; refused in one line without a server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest
from proc_helpers import EAGLE3, command_env

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration


def test_backfill_runs_every_shard_then_the_snapshot_then_the_report(tmp_path: Path):
    env = {**command_env(tmp_path), "EAGLE3_N_SHARDS": "2"}
    with start_simulator() as sim:
        r = subprocess.run(
            [EAGLE3, "backfill"],
            cwd=PROJECT_ROOT,
            env={**env, "EAGLE3_SGLANG_URL": sim.url},
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "eagle3-dagster backfill summary" in r.stdout and "result:     SUCCESS" in r.stdout
    assert "report:     " + str(tmp_path / "data" / "reports" / "index.html") in r.stdout
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        runs = list(reversed(instance.get_runs()))  # oldest first
    assert [(run.job_name, run.tags.get("dagster/partition")) for run in runs] == [
        ("ingest", None),
        ("shard_pipeline", "0000"),
        ("shard_pipeline", "0001"),
        ("publish", None),
        ("report", None),
    ]
    assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
    latest = (tmp_path / "data" / "snapshots" / "LATEST").read_text().strip()
    assert f"snapshot:   {tmp_path / 'data' / 'snapshots' / latest}" in r.stdout


def test_backfill_without_a_server_is_refused_in_one_line(tmp_path: Path):
    r = subprocess.run(
        [EAGLE3, "backfill"], cwd=PROJECT_ROOT, env=command_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "eagle3 backfill: error: EAGLE3_SGLANG_URL is not set: a backfill generates through a real SGLang server "
        "or router (for a try-out with a simulator, `eagle3 demo`)"
    ]
    assert not (tmp_path / "data").exists() and not (tmp_path / "home").exists()


def test_make_backfill_is_eagle3_backfill():
    env = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    }  # as typed, not under make test
    r = subprocess.run(
        ["make", "--no-print-directory", "-n", "backfill", "ARGS=--allow-partial"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == ".venv/bin/eagle3 backfill --allow-partial"
