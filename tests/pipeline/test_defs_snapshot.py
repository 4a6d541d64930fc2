"""The code location's shape, pinned: asset keys, deps, checks (blocking or not), partitions, pools,
retry policies, jobs, the schedule (cron, timezone), sensors, resources, executor and the instance's
pool limit, against the checked-in tests/pipeline/defs_snapshot.json (as dagster-open-platform's
dagster_open_platform_tests/test_defs.py pins its definitions).

A change to the graph (a renamed asset, a check that stops blocking, a lost dep, a new sensor) fails
here with a diff. When the change is intended, refresh the snapshot and commit it with the change:

    EAGLE3_UPDATE_SNAPSHOT=1 .venv/bin/python -m pytest -q tests/pipeline/test_defs_snapshot.py

The definitions are loaded in a fresh process with every EAGLE3_* setting at its default (as
`dg check defs` on a fresh clone), so the snapshot holds no path, port or timestamp and does not
depend on the machine's environment.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT

pytestmark = pytest.mark.integration  # loads the definitions in a child process

HERE = Path(__file__).parent
SNAPSHOT = HERE / "defs_snapshot.json"
UPDATE_ENV = "EAGLE3_UPDATE_SNAPSHOT"


def _current(tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, str(HERE / "defs_snapshot.py")],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"loading the definitions failed:\n{out.stderr[-4000:]}"
    json.loads(out.stdout)  # valid JSON, or the failure says so
    return out.stdout


def test_definitions_match_the_checked_in_snapshot(tmp_path: Path) -> None:
    current = _current(tmp_path)
    if os.environ.get(UPDATE_ENV) == "1":
        SNAPSHOT.write_text(current)
        pytest.skip(f"{SNAPSHOT.name} rewritten ({UPDATE_ENV}=1): review `git diff` and commit it")
    assert SNAPSHOT.exists(), f"no {SNAPSHOT}: create it with {UPDATE_ENV}=1 (see this module's docstring)"
    expected = SNAPSHOT.read_text()
    if current != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                current.splitlines(keepends=True),
                fromfile=f"{SNAPSHOT.name} (checked in)",
                tofile="definitions now",
            )
        )
        pytest.fail(
            f"the definitions changed against {SNAPSHOT.name}:\n{diff}\nIf intended: "
            f"{UPDATE_ENV}=1 .venv/bin/python -m pytest -q {Path(__file__).relative_to(PROJECT_ROOT)} "
            "and commit the snapshot with the change.",
            pytrace=False,
        )


def test_snapshot_is_deterministic_and_machine_free() -> None:
    """No absolute path, URL or port of this machine in the checked-in snapshot."""
    text = SNAPSHOT.read_text()
    for needle in (str(PROJECT_ROOT), "/tmp", "127.0.0.1", "http://", str(Path.home())):
        assert needle not in text, f"{needle!r} in {SNAPSHOT.name}: the snapshot must not depend on the machine"
    data = json.loads(text)
    assert set(data) >= {"assets", "asset_checks", "jobs", "schedules", "sensors", "resources", "executor"}
    assert data["assets"]["generations"]["pool"] == "sglang"
