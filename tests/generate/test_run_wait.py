"""One endpoint wait per graph run (generate/run_wait.py): shards of one run share the failed wait's line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from eagle3_dagster.generate.endpoint_info import NoEndpointError
from eagle3_dagster.generate.endpoints import EndpointPool, EndpointWatch
from eagle3_dagster.generate.run_wait import EndpointWaitRecord, endpoint_wait_record
from eagle3_dagster.orchestration.run import GRAPH_RUN_TAG, graph_run_key
from eagle3_dagster.sim.process import free_port


def test_the_first_failed_wait_is_on_record_and_never_overwritten(tmp_path: Path):
    rec = endpoint_wait_record(tmp_path, "run/1 x")
    assert rec.path == tmp_path / "runs" / "run_1_x" / "endpoint-wait.txt"
    assert rec.failed_wait() is None
    assert (
        rec.record("no routable SGLang endpoint after 4s:\n a: refused")
        == "no routable SGLang endpoint after 4s: a: refused"
    )
    assert rec.record("a later line") == "no routable SGLang endpoint after 4s: a: refused"
    assert rec.failed_wait() == "no routable SGLang endpoint after 4s: a: refused"
    assert [p.name for p in rec.path.parent.iterdir()] == ["endpoint-wait.txt"]  # no temp file left


def test_graph_run_key_groups_a_graph_run_then_a_backfill_then_one_run():
    assert graph_run_key({GRAPH_RUN_TAG: "g1", "dagster/backfill": "b1"}, "r1") == "g1"
    assert graph_run_key({"dagster/backfill": "b1"}, "r1") == "b1"
    assert graph_run_key({}, "r1") == "r1"
    # a re-execution inherits its parent's tags, yet is a new attempt: it waits on its own
    assert graph_run_key({GRAPH_RUN_TAG: "g1", "dagster/parent_run_id": "r0"}, "r2") == "r2"


async def _pool_start(url: str, record: EndpointWaitRecord | None, wait_s: float) -> tuple[float, str]:
    """How long one shard's endpoint pool took to give up on `url`, and its line."""
    async with httpx.AsyncClient() as client:
        pool = EndpointPool(
            (url,),
            client,
            {},
            EndpointWatch(
                health_timeout_s=1.0,
                health_interval_s=1.0,
                probe_interval_s=0.1,
                breaker_threshold=5,
                wait_for_endpoint_s=wait_s,
            ),
            wait_record=record,
        )
        t0 = time.monotonic()
        try:
            with pytest.raises(NoEndpointError) as e:
                await pool.start(configured_revision=None)
        finally:
            await pool.stop()
        return time.monotonic() - t0, str(e.value)


def test_shards_waiting_side_by_side_end_with_the_first_ones_line(tmp_path: Path):
    """Two shards of one run wait at once (pool limit 2): the one that started later does not wait its own period."""
    dead = f"http://127.0.0.1:{free_port()}"
    record = endpoint_wait_record(tmp_path, "g")

    async def both() -> list[tuple[float, str]]:
        first = asyncio.create_task(_pool_start(dead, record, 1.5))
        await asyncio.sleep(0.5)
        second = asyncio.create_task(_pool_start(dead, record, 30.0))
        return [await first, await second]

    (t1, m1), (t2, m2) = asyncio.run(both())
    assert m1.startswith("no routable SGLang endpoint after 2s") and f"{dead}: connection refused" in m1, m1
    assert t1 >= 1.5
    assert m2.startswith(m1) and "not waited again" in m2 and str(record.path) in m2, m2
    assert t2 < 3.0  # ended with the first one's wait, not after its own 30 s
    # a shard started after that fails before probing anything
    t3, m3 = asyncio.run(_pool_start(dead, record, 30.0))
    assert t3 < 0.5 and m3 == m2


def test_without_a_record_each_pool_waits_on_its_own(tmp_path: Path):
    took, _ = asyncio.run(_pool_start(f"http://127.0.0.1:{free_port()}", None, 0.5))
    assert took >= 0.5
