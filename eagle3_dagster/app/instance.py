"""What a local run stands on: the Dagster instance in DAGSTER_HOME (its dagster.yaml and storage, created
once) and the SGLang endpoint (the configured fleet, or a simulator started for the run).

`eagle3 check` writes the instance sized from the fleet; `eagle3 demo` and `eagle3 ui` open it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ..config import Settings
from ..orchestration.pools import DEFAULT_OVERLAP, RUNS_PER_POOL_SLOT

INSTANCE_HEADER = "# Written by eagle3-dagster: a local instance (SQLite under this folder)."


def instance_yaml(pool_limit: int = 1 + DEFAULT_OVERLAP, max_concurrent_runs: int | None = None) -> str:
    """The project's dagster.yaml: `pool_limit` shard steps generate at once (pool "sglang"), and the run
    queue admits `max_concurrent_runs` runs (default pool_limit x RUNS_PER_POOL_SLOT: per generating
    shard one training behind and one tokenizing ahead). `eagle3 check` sizes both from the fleet
    (orchestration/pools.py)."""
    runs = pool_limit * RUNS_PER_POOL_SLOT if max_concurrent_runs is None else max_concurrent_runs
    return f"""\
{INSTANCE_HEADER}
telemetry:
  enabled: false
nux:
  enabled: false     # no "Join the Dagster community" pop-up over the UI
concurrency:
  pools:
    default_limit: {pool_limit}   # shard steps talking to the SGLang fleet at once (pool "sglang"; docs/fleet.md)
  runs:
    max_concurrent_runs: {runs}   # runs the daemon's queue starts at once (backfills, nights)
python_logs:
  python_log_level: INFO   # a run's console log (what `eagle3 ui` prints) without every DEBUG engine event
"""


INSTANCE_YAML = instance_yaml()  # before `eagle3 check` has probed a fleet


INSTANCE_LOCK = ".eagle3-instance.lock"


def ensure_dagster_home(home: Path, instance_config: str | None = None) -> Path:
    """DAGSTER_HOME (`s.dagster.home`, default ./.dagster_home) with its dagster.yaml and its storage created, once.

    Under an exclusive file lock in the folder: two first uses at the same time (two `eagle3 demo`
    on a fresh folder) would otherwise both create the SQLite tables and one would crash with
    `table run_tags already exists`. The second waits, then finds everything in place.

    `instance_config` (instance_yaml(...) sized by `eagle3 check`) replaces a dagster.yaml this
    project wrote; a user's own dagster.yaml is never touched.
    """
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / INSTANCE_LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cfg = home / "dagster.yaml"
        ours = cfg.exists() and cfg.read_text().startswith(INSTANCE_HEADER)
        wanted = instance_config or INSTANCE_YAML
        if (
            not cfg.exists()
            or _our_outdated_instance_yaml(cfg)
            or (ours and instance_config and cfg.read_text() != wanted)
        ):
            tmp = cfg.with_name(f".dagster.yaml.{os.getpid()}.tmp")
            tmp.write_text(wanted)
            tmp.replace(cfg)
        _create_instance_storage(home)
    return home


def _our_outdated_instance_yaml(cfg: Path) -> bool:
    """An instance this project wrote before the UI's pop-up was switched off or its runs' console log
    was set to INFO (never a user's own file)."""
    text = cfg.read_text()
    return text.startswith(INSTANCE_HEADER) and ("\nnux:" not in text or "\npython_logs:" not in text)


def _create_instance_storage(home: Path) -> None:
    """Open the instance once and touch each storage, so their tables exist before any run."""
    import dagster as dg

    from ..orchestration.run import prime_pools

    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)  # run storage
        instance.fetch_materializations(dg.AssetKey("eagle3_instance_probe"), limit=1)  # event log storage
        instance.all_instigator_state()  # schedule/sensor storage
        prime_pools(instance)  # the pools' limit rows, before runs race to create them


@contextlib.contextmanager
def sglang_endpoint(s: Settings, extra_sim_args: list[str] | None = None) -> Iterator[str]:
    """Yield the SGLang URL(s) to use: EAGLE3_SGLANG_URL if set, else a simulator we start and stop.

    The caller hands the URL over explicitly (the `sglang` resource, a child's environment).
    """
    if s.urls_configured:
        yield ",".join(s.fleet.urls)
        return
    from ..sim.process import start_simulator

    # A short drain: on a stop the client has already aborted its requests.
    sim = start_simulator(extra_args=["--drain-timeout", "3", *(extra_sim_args or [])])
    try:
        print(f"[demo] simulator (eagle3-sim) at {sim.url}, pid {sim.pid}", flush=True)
        yield sim.url
    finally:
        sim.stop(timeout=5)
