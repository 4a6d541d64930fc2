"""A stop requested while the snapshot is being assembled (what SIGTERM on `eagle3 demo` does in the
publish step) is honoured before LATEST moves: the publish run fails naming it, the outcome is STOPPED,
the demo's last line says nothing was published, and the next run publishes that snapshot (a real
Dagster instance and simulator; the stop is requested from inside the publish, in-process)."""

from __future__ import annotations

import dagster as dg
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts

from eagle3_dagster import stopping
from eagle3_dagster.app.stop import stopped_line
from eagle3_dagster.definitions import defs
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.publish import snapshot
from eagle3_dagster.publish.snapshot import read_latest, unpublished_versions
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration


def test_a_stop_during_publish_keeps_latest_and_says_so(tmp_path, kimi_profile, monkeypatch):
    data = tmp_path / "data"
    assemble = snapshot._assemble

    def stop_mid_publish(*a, **k):
        stopping.request_stop("SIGTERM received")  # the demo's signal handler does exactly this
        return assemble(*a, **k)

    stopping.reset()
    try:
        with dg.instance_for_test() as instance, start_simulator() as sim:
            res = graph_resources(data, kimi_profile.tokenizer, sim.url)
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)
            monkeypatch.setattr(snapshot, "_assemble", stop_mid_publish)
            out = materialize_graph(
                defs,
                instance,
                scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
                resources=res,
                should_stop=stopping.stop_requested,
            )
            assert out.stopped and out.publish_success is False and not out.success
            assert read_latest(data / "snapshots") is None  # LATEST never moved
            (pending,) = unpublished_versions(data / "snapshots")
            line = stopped_line(out)
            assert line.startswith("[demo] stopped during publish, nothing published:"), line
            assert f"snapshot {pending} is complete but NOT published" in line and "rerun" in line
            monkeypatch.setattr(snapshot, "_assemble", assemble)
            stopping.reset()
            again = materialize_graph(
                defs,
                instance,
                scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
                resources=res,
            )
            assert again.success and again.snapshot_version == pending
            assert read_latest(data / "snapshots") == pending and unpublished_versions(data / "snapshots") == set()
    finally:
        stopping.reset()
