"""Sizing the `sglang` pool from the fleet (orchestration/pools.py) and writing it into the instance."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from eagle3_dagster.app.instance import INSTANCE_YAML, ensure_dagster_home, instance_yaml
from eagle3_dagster.orchestration.pools import generate_pool_limit, size_pools


def test_the_default_window_fills_any_fleet_so_one_more_shard_covers_the_tail() -> None:
    # the default in-flight window is Σ (max_running_requests + headroom): one shard covers every slot
    assert generate_pool_limit([64]) == 2
    assert generate_pool_limit([256] * 8) == 2


def test_a_window_or_a_shard_smaller_than_the_fleet_needs_more_shards_at_once() -> None:
    # 4 servers x 64 slots, each step capped at 64 in flight: 4 shards fill it, a 5th covers the tails
    assert generate_pool_limit([64, 64, 64, 64], shard_window=64) == 5
    # shards of 100 prompts cannot fill 256 slots: ceil(2.56) = 3 of them, + 1
    assert generate_pool_limit([64] * 4, shard_requests=100) == 4
    # the smaller of window and shard size decides; overlap is the user's margin
    assert generate_pool_limit([64] * 4, shard_window=200, shard_requests=32, overlap=2) == 10
    assert generate_pool_limit([8, 8], shard_requests=48, overlap=0) == 1


@pytest.mark.parametrize(
    "slots, kw",
    [([], {}), ([64, 0], {}), ([64], {"shard_window": 0}), ([64], {"shard_requests": -1}), ([64], {"overlap": -1})],
)
def test_impossible_fleets_are_refused(slots: list[int], kw: dict) -> None:
    with pytest.raises(ValueError):
        generate_pool_limit(slots, **kw)


def test_unknown_capacity_is_named_and_assumes_one_shard_fills_the_fleet() -> None:
    s = size_pools({"http://a:30000": 32, "http://b:30000": None, "http://c:30000": 32}, shard_requests=16)
    assert (s.pool_limit, s.fleet_slots, s.unknown) == (5, 64, ("http://b:30000",))  # ceil(64/16) + 1
    assert s.max_concurrent_runs == 15  # per generating shard: one training behind, one tokenizing ahead
    assert "http://b:30000" in s.describe() and "64 slots" in s.describe()
    none = size_pools({"http://a:30000": None})
    assert none.pool_limit == 2 and none.fleet_slots is None and "unknown" in none.describe()


def test_the_sized_instance_yaml_sets_the_pool_default_and_the_run_queue(tmp_path: Path) -> None:
    home = ensure_dagster_home(tmp_path / "home", instance_config=instance_yaml(5, 7))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.global_op_concurrency_default_limit == 5
        assert instance.get_concurrency_config().run_queue_config.max_concurrent_runs == 7
    # a later `eagle3 check` with another fleet rewrites our own file ...
    ensure_dagster_home(home, instance_config=instance_yaml(3))
    assert (home / "dagster.yaml").read_text() == instance_yaml(3, 9)
    # ... a plain `eagle3 demo` (no sizing) keeps it, and a user's own dagster.yaml is never touched
    ensure_dagster_home(home)
    assert (home / "dagster.yaml").read_text() == instance_yaml(3, 9)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    ensure_dagster_home(theirs, instance_config=instance_yaml(9))
    assert (theirs / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"
    assert instance_yaml(2, 6) == INSTANCE_YAML  # before any fleet was probed
