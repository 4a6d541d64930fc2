"""The domain packages load without Dagster: a stage, a gate or the storage layer imported on its own (by the
CLI, a bench, a worker process) must not pull in the orchestration framework. Each check runs in a fresh
interpreter, so what another test imported earlier cannot hide an import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eagle3_dagster.config import PROJECT_ROOT

pytestmark = pytest.mark.integration

DOMAIN_PACKAGES = ["ingest", "tokenize", "generate", "train", "publish", "plan", "drafters", "storage"]

# quality/ holds the gates and the report; the report may draw with anything, the gates may not
GATE_MODULES = [
    "features",
    "suites",
    "gate",
    "gx_context",
    "gx_docs",
    "acceptance",
    "acceptance_drift",
    "request_failures",
    "retention",
]

# imports every module of a package (or one module), then names the dagster modules loaded, if any
PROBE = """
import importlib, pkgutil, sys
mod = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(getattr(mod, "__path__", []), mod.__name__ + "."):
    importlib.import_module(info.name)
print(sorted(m for m in sys.modules if m == "dagster" or m.startswith("dagster.")))
"""


def _dagster_modules_loaded_by(module: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"importing {module} failed:\n{proc.stderr[-2000:]}"
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("package", DOMAIN_PACKAGES)
def test_domain_package_does_not_import_dagster(package: str) -> None:
    assert _dagster_modules_loaded_by(f"eagle3_dagster.{package}") == "[]"


@pytest.mark.parametrize("module", GATE_MODULES)
def test_gate_module_does_not_import_dagster(module: str) -> None:
    assert _dagster_modules_loaded_by(f"eagle3_dagster.quality.{module}") == "[]"
