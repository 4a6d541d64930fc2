"""The pipeline runs without the simulator's server stack: aiohttp comes only with the `sim` extra.

A user who points EAGLE3_SGLANG_URL at a real SGLang server installs `eagle3-dagster` without `[sim]`;
loading the definitions and the CLI must not need aiohttp, and asking for the simulator anyway must say
which extra to install instead of dying on an ImportError in a child process.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from eagle3_dagster.config import PROJECT_ROOT

# Run in a fresh interpreter where `import aiohttp` fails as if it were not installed
# (a None entry in sys.modules: ImportError on import, find_spec() -> None).
WITHOUT_AIOHTTP = """
import sys
sys.modules["aiohttp"] = None

import eagle3_dagster.app.cli
import eagle3_dagster.definitions as d

repo = d.defs.get_repository_def()
assert repo.assets_defs_by_key, "no assets loaded"
loaded = sorted(m for m, mod in sys.modules.items() if m.split(".")[0] == "aiohttp" and mod is not None)
assert not loaded, f"aiohttp imported on the runtime path: {loaded}"

from eagle3_dagster.sim import SimulatorError, start_simulator
try:
    start_simulator()
except SimulatorError as e:
    print("SIMULATOR:", e)
else:
    raise SystemExit("the simulator started without aiohttp")
print("ASSETS:", len(repo.assets_defs_by_key))
"""


def test_runtime_requirements_leave_the_simulator_stack_to_the_sim_extra():
    reqs = [Requirement(r) for r in importlib.metadata.requires("eagle3-dagster") or []]
    runtime = {r.name.lower() for r in reqs if r.marker is None}
    sim = {
        r.name.lower()
        for r in reqs
        if r.marker is not None and r.marker.evaluate({"extra": "sim"}) and not r.marker.evaluate({"extra": ""})
    }
    assert "aiohttp" not in runtime
    assert "aiohttp" in sim
    assert {"dagster", "httpx", "transformers"} <= runtime  # the pipeline's own stack stays in the runtime set


@pytest.mark.integration
def test_definitions_and_cli_load_without_aiohttp_and_the_simulator_names_its_extra():
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_AIOHTTP], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "ASSETS:" in r.stdout
    sim_line = next(line for line in r.stdout.splitlines() if line.startswith("SIMULATOR:"))
    assert "eagle3-dagster[sim]" in sim_line and "EAGLE3_SGLANG_URL" in sim_line
