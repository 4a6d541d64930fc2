"""A second nightly run with unchanged inputs sends zero requests and republishes the identical snapshot;
a shard whose gate failed is left out of the snapshot with its reason; `dg launch` runs a shard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import httpx
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.definitions import defs
from eagle3_dagster.orchestration.resources import PipelineSettings, SGLangFleet
from eagle3_dagster.orchestration.run import materialize_graph
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
            "pipeline": PipelineSettings(data_dir=str(data), tokenizer=kimi_profile.tokenizer, max_new_tokens=2048),
            "sglang": SGLangFleet(urls=sim.url),
        }
        with dg.instance_for_test() as instance:
            first = materialize_graph(defs, instance, resources=res, run_publish=True)
            assert first.success and first.snapshot_version
            sent = _generate_requests(sim.url)
            n_prompts = sum(1 for _ in open(PROJECT_ROOT / "assets/sources/data/demo_prompts.jsonl")) - 1  # one dup
            assert sent == n_prompts
            snap = data / "snapshots" / first.snapshot_version
            before = _tree_bytes(snap)

            second = materialize_graph(defs, instance, resources=res, run_publish=True)
            assert second.success
            assert _generate_requests(sim.url) == sent, "an unchanged nightly run must not hit the server"
            assert second.snapshot_version == first.snapshot_version
            assert _tree_bytes(snap) == before
            manifest = json.loads((snap / "manifest.json").read_text())
            assert manifest["rows"] == n_prompts
            assert all(s["included"] for s in manifest["shards"])

            # A new regeneration seed is a new cache key for every prompt: everything is regenerated.
            res["sglang"] = SGLangFleet(urls=sim.url, regen_seed=7)
            third = materialize_graph(defs, instance, resources=res, shards=["0000"])
            assert third.success
            assert _generate_requests(sim.url) > sent


def test_failed_gate_shard_is_excluded_from_the_snapshot_with_its_reason(tmp_path, kimi_profile):
    data = tmp_path / "data"
    with start_simulator() as good, start_simulator(extra_args=["--mode", "drop-think-end"]) as bad:
        with dg.instance_for_test() as instance:
            base = PipelineSettings(data_dir=str(data), tokenizer=kimi_profile.tokenizer, max_new_tokens=2048)
            ok = materialize_graph(
                defs,
                instance,
                resources={"pipeline": base, "sglang": SGLangFleet(urls=good.url)},
                shards=["0000", "0001"],
            )
            assert ok.success
            broken = materialize_graph(
                defs,
                instance,
                resources={"pipeline": base, "sglang": SGLangFleet(urls=bad.url)},
                shards=["0002"],
                run_ingest=False,
                run_publish=True,
            )
            assert not broken.shards[0].success and broken.publish_success
    manifest = json.loads((data / "snapshots" / broken.snapshot_version / "manifest.json").read_text())
    by_shard = {s["shard"]: s for s in manifest["shards"]}
    assert by_shard["0000"]["included"] and by_shard["0001"]["included"]
    assert not by_shard["0002"]["included"] and by_shard["0002"]["reason"].startswith("generations gate failed: ")
    assert not by_shard["0003"]["included"]


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
