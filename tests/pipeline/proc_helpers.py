"""Shared by the tests that run `eagle3 demo` / `eagle3 ui` as real processes (test_demo_stop.py,
test_demo_lock.py, test_stopping_and_versions.py): the `eagle3` command, their environment and waiting
for a line in their log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

# the venv's `eagle3` (the console script beside this interpreter), as a user runs it
EAGLE3 = str(Path(sys.executable).with_name("eagle3"))


def command_env(tmp_path: Path) -> dict[str, str]:
    """A private instance and data dir; no EAGLE3_SGLANG_URL, so the command starts its own simulator."""
    env = dict(os.environ)
    env.pop("EAGLE3_SGLANG_URL", None)
    env.update(
        DAGSTER_HOME=str(tmp_path / "home"),
        EAGLE3_DATA_DIR=str(tmp_path / "data"),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def wait_for_log(path: Path, pattern: str, proc: subprocess.Popen, timeout: float) -> re.Match:
    """The first match of `pattern` in the log file, failing early (with the log) if the process ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text(errors="replace"))
        if m:
            return m
        assert proc.poll() is None, path.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not seen in {timeout}s:\n{path.read_text()[-3000:]}")


def start_demo(shards: str, log_file, env: dict[str, str]) -> subprocess.Popen:
    """`eagle3 demo --shards S` in its own session, slowed (30 ms a token) so a test can act mid-run."""
    from eagle3_dagster.config import PROJECT_ROOT

    return subprocess.Popen(
        [
            EAGLE3,
            "demo",
            "--shards",
            shards,
            "--sim-arg=--token-latency-ms",
            "--sim-arg=30",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
