"""Ctrl-C on `eagle3 demo` as a user does it: SIGINT to the demo's process group while a shard is
generating. Every process (the demo, Dagster's helpers, the simulator it started) is gone within
30 s, the interrupted run is CANCELED, no further shard run started, and a rerun completes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest
from proc_helpers import EAGLE3, command_env, start_demo, wait_for_log

from eagle3_dagster.config import PROJECT_ROOT

pytestmark = pytest.mark.integration


def test_sigint_stops_the_demo_and_everything_it_started_then_a_rerun_completes(tmp_path: Path):
    env = command_env(tmp_path)
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = start_demo("0000,0001", out, env)
        try:
            sim_pid = int(wait_for_log(log, r"simulator \(eagle3-sim\) at \S+, pid (\d+)", proc, 120).group(1))
            wait_for_log(log, r"generations shard 0000: \d+/\d+ .* in flight", proc, 180)  # requests in flight
            # the demo's helpers (Dagster's compute-log tails and their watchers) and the simulator,
            # which runs in its own session; the demo itself is waited for by Popen (its exit code)
            others = [p for p in psutil.process_iter() if _pgid(p.pid) == proc.pid and p.pid != proc.pid]
            others.append(psutil.Process(sim_pid))
            t0 = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
            proc.wait(30)
            _, alive = psutil.wait_procs(others, timeout=max(0.1, 30 - (time.monotonic() - t0)))
            took = time.monotonic() - t0
            assert not alive, f"still running 30 s after SIGINT: {alive}\n{log.read_text()[-3000:]}"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    text = log.read_text(errors="replace")
    print(f"every process gone {took:.1f}s after SIGINT (demo exit {proc.returncode})")
    assert proc.returncode == 130, text[-3000:]
    assert "[demo] SIGINT: stopping" in text and "RUN_CANCELED" in text
    assert "generations shard 0001" not in text and "shard 1:" not in text  # no further shard started

    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        runs = instance.get_runs()
        shard_runs = [r for r in runs if r.tags.get("dagster/partition")]
        assert [r.tags["dagster/partition"] for r in shard_runs] == ["0000"], [r.tags for r in runs]
        assert shard_runs[0].status == dg.DagsterRunStatus.CANCELED

    # the rerun resumes and completes (the simulator at full speed this time)
    rerun = subprocess.run(
        [EAGLE3, "demo", "--shards", "0000"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "result:     SUCCESS" in rerun.stdout


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
