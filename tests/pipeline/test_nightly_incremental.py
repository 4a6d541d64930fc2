"""A second nightly run with unchanged inputs sends zero requests and republishes the identical snapshot;
a failed shard publishes nothing unless a partial snapshot is asked for, which names it; `dg launch` runs a shard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import httpx
import polars as pl
import pytest

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.definitions import defs
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration


def _generate_requests(url: str) -> int:
    return httpx.get(f"{url}/_sim/stats", timeout=10).json()["requests"]


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_second_nightly_run_is_free_and_identical(tmp_path, kimi_profile):
    data = tmp_path / "data"
    with start_simulator() as sim:
        res = {
            "pipeline": pipeline_resource(
                settings(), data_dir=str(data), tokenizer=kimi_profile.tokenizer, max_new_tokens=2048
            ),
            "sglang": SGLangFleet(urls=sim.url),
        }
        with dg.instance_for_test() as instance:
            first = materialize_graph(defs, instance, scope=GraphScope(run_publish=True), resources=res)
            assert first.success and first.snapshot_version
            sent = _generate_requests(sim.url)
            n_prompts = sum(1 for _ in open(PROJECT_ROOT / "assets/sources/data/demo_prompts.jsonl")) - 1  # one dup
            assert sent == n_prompts
            snap = data / "snapshots" / first.snapshot_version
            before = _tree_bytes(snap)

            second = materialize_graph(defs, instance, scope=GraphScope(run_publish=True), resources=res)
            assert second.success
            assert _generate_requests(sim.url) == sent, "an unchanged nightly run must not hit the server"
            assert second.snapshot_version == first.snapshot_version
            assert _tree_bytes(snap) == before
            manifest = json.loads((snap / "manifest.json").read_text())
            assert manifest["rows"] == n_prompts
            assert all(s["included"] for s in manifest["shards"])

            # A new regeneration seed is a new cache key for every prompt: everything is regenerated.
            res["sglang"] = SGLangFleet(urls=sim.url, regen_seed=7)
            third = materialize_graph(defs, instance, scope=GraphScope(shards=["0000"]), resources=res)
            assert third.success
            assert _generate_requests(sim.url) > sent


def test_a_failed_shard_publishes_nothing_unless_a_partial_snapshot_is_asked_for(tmp_path, kimi_profile):
    """The demo's graph run (materialize_graph + its summary) with one shard failing: no snapshot, and the
    summary says why; asked for explicitly, a partial one whose manifest and data card name the shard left out."""
    from eagle3_dagster.app.demo import summarize
    from eagle3_dagster.storage import data_root

    data = tmp_path / "data"
    with start_simulator() as sim, dg.instance_for_test() as instance:
        res = {
            "pipeline": pipeline_resource(
                settings(), data_dir=str(data), tokenizer=kimi_profile.tokenizer, max_new_tokens=2048
            ),
            "sglang": SGLangFleet(urls=sim.url),
        }
        assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
        prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
        first = prompts.filter(pl.col("shard") == 0).height
        # the first shard's answers carry no result (200 {"error": ...}, refused for good): only it fails
        httpx.post(f"{sim.url}/_sim/faults", json={"error_body": first}, timeout=10).raise_for_status()
        held = materialize_graph(defs, instance, scope=GraphScope(run_ingest=False, run_publish=True), resources=res)
        assert [sh.ok for sh in held.shards] == [False, True, True, True], held.shards
        assert held.publish_success is None and held.snapshot_version is None
        assert not (data / "snapshots" / "LATEST").exists(), "a shard failed: nothing may be published"
        assert held.not_published.startswith("not published: shard(s) 0000 did not pass")
        summary = summarize(held, data_root(data), settings())
        assert "publish:    not published: shard(s) 0000 did not pass" in summary and "--allow-partial" in summary
        assert "snapshot:   not published" in summary and "result:     FAILED" in summary
        # the report ran, last
        newest = instance.get_runs(limit=1)[0]
        assert newest.job_name == "report" and newest.run_id == held.report_run_id and held.report_error is None

        # asked for explicitly: the three shards that passed are published, shard 0000 named as left out (its
        # failed requests are sent again: the server still answers them without a result)
        httpx.post(f"{sim.url}/_sim/faults", json={"error_body": first}, timeout=10).raise_for_status()
        partial = materialize_graph(
            defs, instance, scope=GraphScope(run_ingest=False, run_publish=True, allow_partial=True), resources=res
        )
        assert not partial.shards[0].ok and partial.publish_success and partial.left_out == ["0000"]
        assert not partial.success  # a shard failed: never a SUCCESS, published or not
        assert (data / "snapshots" / "LATEST").read_text().strip() == partial.snapshot_version
    snap = data / "snapshots" / str(partial.snapshot_version)
    manifest = json.loads((snap / "manifest.json").read_text())
    (why,) = manifest["shards_left_out"].values()
    assert list(manifest["shards_left_out"]) == ["0000"] and "generations" in why, why
    assert manifest["rows"] == prompts.height - first
    card = (snap / "README.md").read_text()
    assert "## Shards left out" in card and "**This is a partial snapshot**" in card and "| 0000 |" in card
    assert "PARTIAL snapshot (--allow-partial): shard(s) 0000 left out" in summarize(
        partial, data_root(data), settings()
    )


@pytest.mark.full  # runs launched by the dg CLI, another way to deploy: `make test-full`
def test_dg_launch_runs_a_shard(tmp_path, kimi_profile):
    data = tmp_path / "data"
    home = tmp_path / "dagster_home"
    home.mkdir()
    dg_bin = str(Path(sys.executable).parent / "dg")
    with start_simulator() as sim:
        env = {**os.environ, "DAGSTER_HOME": str(home), "EAGLE3_DATA_DIR": str(data), "EAGLE3_SGLANG_URL": sim.url}
        for args in (["--job", "ingest"], ["--job", "shard_pipeline", "--partition", "0001"]):
            r = subprocess.run(
                [dg_bin, "launch", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300
            )
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (data / "training_samples" / "shard=0001" / "part-0000.parquet").exists()
