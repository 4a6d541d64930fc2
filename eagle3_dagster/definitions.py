"""The one Dagster entry point: `dagster dev -w workspace.yaml`, `dg` and `dg launch` load `defs`.

`build_definitions(s)` assembles the code location from the defs folder, the way `dg` projects are
(`dg.load_from_defs_folder`), except that every module is handed the ONE settings object the whole
graph is built from: each module under eagle3_dagster/defs/ has a `build_defs(s: Settings) -> dg.Definitions`

    defs/ingest.py, tokenize.py, generate.py, train.py, publish.py   the assets of each stage (+ checks)
    defs/report.py                                                   the quality report asset
    defs/automation.py                                               jobs, schedule, sensors, freshness check
    defs/common/resources.py                                         resources and executor

so the shard partitions (`s.shards.n_shards`), the ingest assets (the source YAMLs of `s.storage.assets_dir`), the
resources, the executor, the schedule and the sensors all come from `s`. `defs` is built from the
environment's settings, read once here; `eagle3 demo --samples` builds its own from a changed copy
without touching the environment. Helpers that are not definitions (the gated-shard asset factory, run
driver, gate -> check results, metadata, partitions, resource types, executor choice) live in
eagle3_dagster/orchestration/. A new module under defs/ is picked up without touching this file (one
without `build_defs` fails the load, naming it); tests/pipeline/test_defs_snapshot.py shows what changed.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType

import dagster as dg

from . import defs as defs_package
from .config import Settings, settings

DefsBuilder = Callable[[Settings], dg.Definitions]


def _defs_modules(package: ModuleType) -> list[ModuleType]:
    """Every module under the defs folder (packages' own __init__ files hold no definitions)."""
    found = pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
    return [importlib.import_module(m.name) for m in sorted(found, key=lambda m: m.name) if not m.ispkg]


def _builder(module: ModuleType) -> DefsBuilder:
    builder = getattr(module, "build_defs", None)
    if not callable(builder):
        raise TypeError(
            f"{module.__name__} is under eagle3_dagster/defs/ but has no `build_defs(s: Settings) -> dg.Definitions`: "
            "its definitions would be left out of the code location"
        )
    return builder


def build_definitions(s: Settings) -> dg.Definitions:
    """The whole code location built from `s`: every defs module's `build_defs(s)`, merged."""
    return dg.Definitions.merge(*(_builder(m)(s) for m in _defs_modules(defs_package)))


defs = build_definitions(settings())
