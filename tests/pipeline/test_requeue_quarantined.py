"""Fix the cause, then rerun: answers the generations gate quarantined for a server fault are sent again by
the next run (the shard graph on a real Dagster instance against a real simulator process)."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts
from sim_ctl import Sim

from eagle3_dagster.definitions import defs
from eagle3_dagster.generate import read_generations
from eagle3_dagster.generate.store import SUPERSEDED_PREFIX
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.storage import read_parquet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = Sim(log_path=tmp_path_factory.mktemp("sim") / "sim.log")
    yield s
    s.kill()


def _meta(instance: dg.DagsterInstance) -> dict:
    ev = instance.get_latest_materialization_event(dg.AssetKey("generations"))
    return {k: v.value for k, v in ev.asset_materialization.metadata.items()}


def test_quarantined_server_faults_are_regenerated_after_the_fix(tmp_path, kimi_profile, sim):
    data = tmp_path / "data"
    res = graph_resources(data, kimi_profile.tokenizer, sim.url, max_retries=0)
    sim.faults(clear=True, nan_finish=2)  # two answers "NaN happened": stored, flagged, quarantined
    try:
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)
            out = data / "generations" / f"shard={shard}"
            first = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            assert first.checks["generations:generations_gate"] is False
            m1 = _meta(instance)
            assert m1["quarantined"] == 2 and m1["quarantined_retried"] == 0
            bad = set(
                read_generations(out).filter(pl.col("integrity_violations").list.contains("nan_happened"))["sample_id"]
            )
            assert len(bad) == 2

            sim.faults(clear=True)  # the server is fixed
            second = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            m2 = _meta(instance)
            assert m2["quarantined_retried"] == 2
            assert m2["succeeded"] == 2 and m2["skipped_cached"] == m2["requested"] - 2  # exactly those rows
            assert m2["previous_failures"]["quarantined_integrity"]["came_back"] == 2
            assert m2["quarantined"] == 0 and second.checks["generations:generations_gate"] is True
    finally:
        sim.faults(clear=True)
    gens = read_generations(out)
    assert gens.height == m2["requested"] and gens.filter(pl.col("integrity_violations").list.len() > 0).height == 0
    archive = [p for p in out.iterdir() if p.name.startswith(SUPERSEDED_PREFIX)]
    old = read_parquet(archive[0])
    assert set(old["sample_id"]) == bad  # the old answers are kept, not lost
