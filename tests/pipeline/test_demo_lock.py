"""Two `eagle3 demo` on one data dir, as a user starts them: the second is refused at once, in one
line naming the running demo (pid, host) and the lock file, and writes nothing; the first is unharmed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from proc_helpers import EAGLE3, command_env, start_demo, wait_for_log

from eagle3_dagster.config import PROJECT_ROOT

pytestmark = pytest.mark.integration


def test_a_second_demo_on_the_same_data_dir_is_refused_naming_the_first(tmp_path: Path):
    env = command_env(tmp_path)
    log = tmp_path / "first.log"
    with log.open("wb") as out:
        first = start_demo("0000", out, env)
        try:
            wait_for_log(log, r"simulator \(eagle3-sim\) at \S+", first, 120)  # the first demo holds its lock
            before = sorted(p.name for p in (tmp_path / "data").rglob("*"))
            second = subprocess.run(
                [EAGLE3, "demo", "--shards", "0000"],
                cwd=PROJECT_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert first.poll() is None  # still running
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGINT)
            try:
                first.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait(10)
    assert second.returncode == 1, second.stdout + second.stderr
    lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
    lock = tmp_path / "data" / ".eagle3-demo.lock"
    assert lines == [
        f"[demo] refused: eagle3 demo: data dir {tmp_path / 'data'} is locked by pid {first.pid} on host "
        f"{socket.gethostname()}, eagle3 demo, since {lines[0].split('since ')[1].split(' (lock')[0]} "
        f"(lock {lock}); wait for it to finish, or set another EAGLE3_DATA_DIR"
    ], second.stderr
    assert "simulator" not in second.stdout  # nothing was started
    after = sorted(p.name for p in (tmp_path / "data").rglob("*"))
    assert set(after) >= set(before)  # the second demo removed nothing of the first's
