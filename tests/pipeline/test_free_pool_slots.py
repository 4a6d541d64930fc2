"""`orchestration.run.free_pool_slots` is the one call into Dagster's storage layer (no public method frees a dead
run's pool slots in Dagster 1.13; the daemon's run monitoring and the UI's GraphQL mutation make the same call).
This checks it against the installed Dagster, on a real SQLite instance: a Dagster upgrade that changes it fails
here, not as a pool that silently stalls after a killed run (tests/reliability/test_fault_matrix.py, end to end)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from eagle3_dagster.orchestration.run import free_pool_slots


def test_free_pool_slots_gives_back_only_the_dead_runs_slots(tmp_path: Path) -> None:
    with dg.DagsterInstance.local_temp(str(tmp_path)) as instance:
        storage = instance.event_log_storage
        storage.set_concurrency_slots("sglang", 2)
        for run_id in ("dead-run", "live-run"):
            assert storage.claim_concurrency_slot("sglang", run_id, "generations").is_claimed
        assert storage.get_concurrency_info("sglang").active_run_ids == {"dead-run", "live-run"}

        free_pool_slots(instance, "dead-run")

        info = storage.get_concurrency_info("sglang")
        assert info.active_run_ids == {"live-run"} and info.slot_count == 2  # the limit itself is unchanged
        assert storage.claim_concurrency_slot("sglang", "next-run", "generations").is_claimed  # the slot is free
