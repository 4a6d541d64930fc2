"""Real fleets going wrong, as a user meets them: the shard graph on a real Dagster instance against a
real simulator process (issue 14). Dead / wrong URLs: named in the step's log within 10 s, one bounded
wait (no step retry), the failure names every endpoint. 200 answers that are not results: error rows,
never generations, and after recovery the counts (and the demo summary) show exactly the prompts.
"""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts
from sim_ctl import Sim

from eagle3_dagster.app.demo import current_generations, summarize
from eagle3_dagster.config import settings
from eagle3_dagster.definitions import defs
from eagle3_dagster.generate import read_generation_errors, read_generations
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.sim.process import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = Sim(log_path=tmp_path_factory.mktemp("sim") / "sim.log")
    yield s
    s.kill()


def _step_events(instance: dg.DagsterInstance, run_id: str, step: str) -> list:
    return [r for r in instance.all_logs(run_id) if r.step_key == step]


def test_dead_and_html_endpoints_are_named_within_seconds_and_waited_for_once(tmp_path, kimi_profile, sim):
    data = tmp_path / "data"
    sim.faults(clear=True, html=True)  # a web server answering 200 text/html, not SGLang
    dead = f"http://127.0.0.1:{free_port()}"
    res = graph_resources(data, kimi_profile.tokenizer, f"{dead},{sim.url}", wait_for_endpoint_s=6.0)
    try:
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)
            sh = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            assert not sh.success and "generations" in sh.skipped_or_failed
            events = _step_events(instance, sh.run_id, "generations")
            types = [e.dagster_event.event_type_value for e in events if e.dagster_event]
            assert types.count("STEP_START") == 1 and "STEP_UP_FOR_RETRY" not in types, types  # one wait
            start = next(
                e.timestamp for e in events if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"
            )
            lines = [(e.timestamp - start, e.user_message) for e in events if not e.dagster_event]
            named = [
                (t, m)
                for t, m in lines
                if f"{dead}: connection refused" in m
                and f"{sim.url}: not an SGLang server: /model_info answered text/html" in m
            ]
            assert named and named[0][0] < 10.0, lines  # within 10 s, both endpoints and their errors
            failure = next(e for e in events if e.dagster_event and e.dagster_event.event_type_value == "STEP_FAILURE")
            text = failure.dagster_event.step_failure_data.error.message
            assert (
                "no routable SGLang endpoint after 6s" in text and "connection refused" in text and "text/html" in text
            )
    finally:
        sim.faults(clear=True)


def test_error_bodies_are_errors_and_counts_are_right_after_recovery(tmp_path, kimi_profile, sim):
    data = tmp_path / "data"
    sim.faults(clear=True, error_body=10_000)  # every answer: HTTP 200 {"error": {"message": ...}}
    res = graph_resources(data, kimi_profile.tokenizer, sim.url)
    with dg.instance_for_test() as instance:
        assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
        shard = shard_with_most_prompts(data)
        n = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == int(shard)).height
        gen_dir = data / "generations" / f"shard={shard}"
        bad = materialize_graph(defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res)
        assert not bad.shards[0].success
        errs = read_generation_errors(gen_dir)
        assert errs.height == n and set(errs["reason"]) == {"server_error_body"}
        assert read_generations(gen_dir).height == 0 and current_generations(gen_dir) == 0
        logs = [r.user_message for r in instance.all_logs(bad.shards[0].run_id) if not r.dagster_event]
        assert any("answered 200 without a result" in m and "detokenizer timeout" in m for m in logs)

        sim.faults(clear=True)  # the server recovers; the same graph run again
        good = materialize_graph(defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res)
        sh = good.shards[0]
        assert sh.success, sh
        meta = instance.get_latest_materialization_event(dg.AssetKey("generations")).asset_materialization.metadata
        assert meta["succeeded"].value == n and meta["failed"].value == 0 and meta["reconciles"].value is True
        assert read_generations(gen_dir).height == n == current_generations(gen_dir)
        summary = summarize(good, data, settings())
        row = next(line for line in summary.splitlines() if line.strip().startswith(shard))
        assert row.split()[1:3] == [str(n), str(n)], row  # tokenized == generated: nothing counted twice


def test_router_without_workers_then_a_nan_finish(tmp_path, kimi_profile, sim):
    """Behind an sglang-router that has no worker yet: the step names it within 10 s and waits without
    spending retries; once a worker joins, the shard is generated; the one `NaN happened` finish is
    stored, flagged and quarantined by the gate (which fails the shard: 1 of ~9 rows is above 1%)."""
    import subprocess
    import sys
    import threading
    import time
    from pathlib import Path

    import httpx

    data = tmp_path / "data"
    sim.faults(clear=True, nan_finish=1)
    port = free_port()
    router = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "generate" / "mini_router.py"),
            "--port",
            str(port),
            "--worker",
            sim.url,
            "--start-empty",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                httpx.get(url + "/liveness", timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        res = graph_resources(data, kimi_profile.tokenizer, url, max_retries=0)
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)

            def add_worker() -> None:  # 3 s into the generations step (its shard folder appears first)
                while not (data / "generations" / f"shard={shard}").exists():
                    time.sleep(0.05)
                time.sleep(3.0)
                httpx.post(url + "/_router/workers", json={"urls": [sim.url]}, timeout=5)

            t = threading.Thread(target=add_worker, daemon=True)
            t.start()
            sh = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            t.join(5)
            events = _step_events(instance, sh.run_id, "generations")
            start = next(
                e.timestamp for e in events if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"
            )
            named = [
                e.timestamp - start
                for e in events
                if not e.dagster_event and f"{url}: router has no ready worker (/readiness 503)" in e.user_message
            ]
            assert named and named[0] < 10.0
            meta = instance.get_latest_materialization_event(dg.AssetKey("generations")).asset_materialization.metadata
            assert meta["failed"].value == 0 and meta["succeeded"].value == meta["requested"].value  # no retries spent
            assert meta["nan_finishes"].value == 1 and meta["integrity_violations"].value == 1
            assert meta["quarantined"].value == 1
            assert sh.checks["generations:generations_gate"] is False and "training_samples" in sh.skipped_or_failed
    finally:
        router.kill()
        router.wait()
        sim.faults(clear=True)
    gens = read_generations(data / "generations" / f"shard={shard}")
    assert gens.filter(pl.col("integrity_violations").list.contains("nan_happened")).height == 1
