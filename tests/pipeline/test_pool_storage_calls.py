"""`orchestration.run.free_pool_slots` and `prime_pools` are the two calls into Dagster's storage layer (no public
method frees a dead run's pool slots or creates a pool's limit row in Dagster 1.13; the daemon's run monitoring, the
UI's GraphQL mutation and the first slot claim make the same calls). This checks them against the installed Dagster
on real SQLite instances: a Dagster upgrade that changes them fails here, not as a pool that silently stalls after
a killed run (tests/reliability/test_fault_matrix.py) or a shard run that fails on a fresh PostgreSQL instance
(tests/reliability/test_postgres_pool.py)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from eagle3_dagster.app.instance import ensure_dagster_home, instance_yaml
from eagle3_dagster.orchestration.pools import GENERATE_POOL
from eagle3_dagster.orchestration.run import free_pool_slots, prime_pools


def _instance(tmp_path: Path, default_limit: int | None) -> dg.DagsterInstance:
    pools = {"concurrency": {"pools": {"default_limit": default_limit}}} if default_limit else None
    tmp_path.mkdir(exist_ok=True)
    return dg.DagsterInstance.local_temp(str(tmp_path), overrides=pools)


def test_free_pool_slots_gives_back_only_the_dead_runs_slots(tmp_path: Path) -> None:
    with _instance(tmp_path, None) as instance:
        storage = instance.event_log_storage
        storage.set_concurrency_slots("sglang", 2)
        for run_id in ("dead-run", "live-run"):
            assert storage.claim_concurrency_slot("sglang", run_id, "generations").is_claimed
        assert storage.get_concurrency_info("sglang").active_run_ids == {"dead-run", "live-run"}

        free_pool_slots(instance, "dead-run")

        info = storage.get_concurrency_info("sglang")
        assert info.active_run_ids == {"live-run"} and info.slot_count == 2  # the limit itself is unchanged
        assert storage.claim_concurrency_slot("sglang", "next-run", "generations").is_claimed  # the slot is free


def test_prime_pools_creates_the_default_limit_row_a_first_claim_would(tmp_path: Path) -> None:
    with _instance(tmp_path, 3) as instance:
        storage = instance.event_log_storage
        assert GENERATE_POOL not in storage.get_concurrency_keys()

        assert prime_pools(instance) == [GENERATE_POOL]

        info = storage.get_concurrency_info(GENERATE_POOL)
        assert info.slot_count == 3 and info.limit == 3 and info.using_default_limit
        assert prime_pools(instance) == []  # once
        assert storage.claim_concurrency_slot(GENERATE_POOL, "a-run", "generations").is_claimed


def test_prime_pools_leaves_a_limit_someone_set_and_does_nothing_without_a_default(tmp_path: Path) -> None:
    with _instance(tmp_path / "set", 3) as instance:
        instance.event_log_storage.set_concurrency_slots(GENERATE_POOL, 5)  # `dagster instance concurrency set`
        assert prime_pools(instance) == []
        info = instance.event_log_storage.get_concurrency_info(GENERATE_POOL)
        assert info.slot_count == 5 and not info.using_default_limit
    with _instance(tmp_path / "none", None) as instance:
        assert prime_pools(instance) == [] and instance.event_log_storage.get_concurrency_keys() == set()


def test_the_instance_set_up_creates_the_pool_row_before_any_run(tmp_path: Path) -> None:
    """`eagle3 check` / demo / ui set the instance up: the `sglang` pool's row is there before a run claims it."""
    home = ensure_dagster_home(tmp_path / "home", instance_config=instance_yaml(3))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        info = instance.event_log_storage.get_concurrency_info(GENERATE_POOL)
        assert GENERATE_POOL in instance.event_log_storage.get_concurrency_keys()
        assert info.slot_count == 3 and info.using_default_limit


def test_a_pool_row_that_cannot_be_created_ahead_is_named_in_a_warning(tmp_path: Path, monkeypatch, caplog) -> None:
    with _instance(tmp_path, 2) as instance:
        storage = instance.event_log_storage

        def refuse(pool: str) -> bool:
            raise RuntimeError("duplicate key value violates unique constraint")

        monkeypatch.setattr(storage, "initialize_concurrency_limit_to_default", refuse)
        with caplog.at_level("WARNING"):
            assert prime_pools(instance) == []
        assert f"pool {GENERATE_POOL}: its limit row was not created ahead of the runs" in caplog.text
        assert "duplicate key value" in caplog.text
