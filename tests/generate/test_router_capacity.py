"""`eagle3 check` and `eagle3 plan` count the workers behind the REAL sglang-router (docs/fleet.md).

The router's own /server_info is a stub (docs/sglang-router.md), so the pool limit and the plan's servers
come from the workers it lists in /workers, each one's own /server_info, as the generate client sizes
its window: a dead worker counts as the mean of the live ones, and the printed line says so.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import httpx
import polars as pl
import pytest
from gen_helpers import Sim
from real_router import start_real_router

from eagle3_dagster.config import PROJECT_ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("sglang_router") is None,
        reason="sglang_router is not installed (pip install -e '.[router]'): the real router cannot be started",
    ),
]

SLOTS = (4, 8, 12)  # each worker's --max-running-requests
PROMPTS, SHARDS = 20, 4  # the last ingest: 5 prompts per shard, fewer than the fleet's slots


@pytest.fixture
def fleet(tmp_path: Path, start_sim: Callable[..., Sim]) -> Iterator[tuple[str, list[Sim]]]:
    sims = [start_sim("--max-running-requests", str(n)) for n in SLOTS]
    p, url = start_real_router([s.url for s in sims], tmp_path / "router.log")
    yield url, sims
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _eagle3(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_", "PYTEST")) or k == "EAGLE3_TOKENIZER"}
    env.update(
        DAGSTER_HOME=str(tmp_path / "home"),
        EAGLE3_DATA_DIR=str(tmp_path / "data"),
        EAGLE3_SGLANG_URL=url,
        EAGLE3_N_SHARDS=str(SHARDS),
        HF_HUB_OFFLINE="1",
    )
    return subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.app.cli", *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _check(tmp_path: Path, url: str) -> tuple[str, str, int]:
    """(the router's line, the pool line, the pool default the written instance holds)."""
    r = _eagle3(tmp_path, url, "check")
    assert r.returncode == 0, r.stdout + r.stderr
    [router_line] = [ln for ln in r.stdout.splitlines() if ln.startswith(f"eagle3 check: router {url}")]
    [pool_line] = [ln for ln in r.stdout.splitlines() if ln.startswith("eagle3 check: pool sglang")]
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        return router_line, pool_line, instance.global_op_concurrency_default_limit


def _limit(slots: int) -> int:
    per_shard = PROMPTS // SHARDS
    return math.ceil(slots / per_shard) + 1  # docs/fleet.md: ceil(slots / min(window, prompts per shard)) + 1


def test_check_sizes_the_pool_from_the_routers_workers_a_dead_one_as_the_mean(fleet, tmp_path: Path) -> None:
    url, sims = fleet
    prompts = tmp_path / "data" / "prompts" / "prompts.parquet"
    prompts.parent.mkdir(parents=True)
    pl.DataFrame({"sample_id": [f"s{i}" for i in range(PROMPTS)]}).write_parquet(prompts)
    # what the workers themselves report (the router's /server_info is 404, its /get_server_info a stub)
    own = [httpx.get(s.url + "/server_info", timeout=5).json()["max_running_requests"] for s in sims]
    assert own == list(SLOTS)

    router_line, pool_line, limit = _check(tmp_path, url)
    assert router_line == f"eagle3 check: router {url}: 3 workers, {sum(own)} slots"
    assert limit == _limit(sum(own)) == 6  # not the "capacity unknown" fallback of 2
    assert f"{limit} shard(s) generating at once" in pool_line and f"{sum(own)} slots" in pool_line

    # the 12-slot worker SIGKILLed: it counts as the mean of the live ones (4 + 8, mean 6), not as 0
    dead = sims[2]
    dead.kill()
    router_line, pool_line, limit = _check(tmp_path, url)
    slots = own[0] + own[1] + math.ceil((own[0] + own[1]) / 2)
    assert router_line == (
        f"eagle3 check: router {url}: 3 workers, {slots} slots (1 worker unreachable, counted as the mean: {dead.url})"
    )
    assert limit == _limit(slots) == 5 and f"{slots} slots" in pool_line

    # every worker dead: the capacity is unknown, said on both lines, and one shard is assumed to fill the fleet
    for s in sims[:2]:
        s.kill()
    router_line, pool_line, limit = _check(tmp_path, url)
    assert router_line.startswith(f"eagle3 check: router {url}: 3 workers, capacity unknown (no worker told")
    assert all(s.url in router_line for s in sims)
    assert f"capacity of 1 endpoint(s) unknown ({url}): assumed one shard fills the fleet" in pool_line
    assert limit == 2


def test_plan_counts_the_routers_workers_as_servers(fleet, tmp_path: Path) -> None:
    url, sims = fleet
    r = _eagle3(
        tmp_path, url, "plan", "--max-new-tokens", "64", "--probe-requests", "2", "--json", str(tmp_path / "p.json")
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["fleet"]["servers"] == 3  # not one server per endpoint
    [probe] = plan["probe"]
    assert (probe["servers"], probe["requests"]) == (3, 6)  # 2 requests per worker, through the router
    assert plan["fleet"]["tokens_per_s_per_server"] == pytest.approx(probe["tokens_per_s"] / 3)
    assert sum(s.requests() for s in sims) >= 6
    assert any(f"router {url}: 3 workers, {sum(SLOTS)} slots" in a for a in plan["assumptions"])
