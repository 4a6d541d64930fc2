"""The asset graph itself: what a user sees in the UI and what blocks what."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.definitions import defs


@pytest.fixture(scope="module")
def repo():
    return defs.get_repository_def()


def _asset(repo, name: str) -> dg.AssetsDefinition:
    return repo.assets_defs_by_key[dg.AssetKey(name)]


def test_graph_has_the_pipeline_assets_in_order(repo):
    keys = {k.to_user_string() for k in repo.assets_defs_by_key}
    assert {"prompts", "tokenized_prompts", "generations", "training_samples"} <= keys
    # one asset per prompt source file, all feeding `prompts`
    sources = {k for k in keys if k.startswith("source__")}
    assert "source__demo" in sources
    graph = repo.asset_graph
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("prompts")).parent_keys} == sources
    assert dg.AssetKey("prompts") in graph.get(dg.AssetKey("tokenized_prompts")).parent_keys
    assert dg.AssetKey("tokenized_prompts") in graph.get(dg.AssetKey("generations")).parent_keys
    assert dg.AssetKey("generations") in graph.get(dg.AssetKey("training_samples")).parent_keys


def test_shard_assets_are_partitioned_alike(repo):
    parts = [_asset(repo, n).partitions_def for n in ("tokenized_prompts", "generations", "training_samples")]
    assert all(p is not None for p in parts)
    keys = parts[0].get_partition_keys()
    assert keys == [f"{i:04d}" for i in range(len(keys))]
    assert all(p.get_partition_keys() == keys for p in parts)
    assert _asset(repo, "prompts").partitions_def is None


def test_gates_are_blocking_checks(repo):
    from eagle3_dagster.defs.generate import ACCEPTANCE_CHECK

    by_asset = {}
    for a in ("tokenized_prompts", "generations", "training_samples"):
        specs = list(_asset(repo, a).check_specs)
        by_asset[a] = {s.name: s for s in specs}
        gates = [s for s in specs if s.name != ACCEPTANCE_CHECK]
        assert gates and all(s.blocking for s in gates), a
    # the drafter's acceptance drift says the traffic moved; it never holds a shard back
    assert not by_asset["generations"][ACCEPTANCE_CHECK].blocking
    assert "thinking_token_ends_prompt" in by_asset["tokenized_prompts"]
    assert "think_end_present" in by_asset["generations"]
    assert "163607" in by_asset["generations"]["think_end_present"].description


def test_generation_is_pooled_and_retried(repo):
    gen = _asset(repo, "generations")
    # The asset graph (what the instance's concurrency pools see): only the step that calls the
    # SGLang fleet holds the "sglang" pool; every other computed asset runs unpooled.
    pooled = {
        k.to_user_string(): node.pools
        for k, node in ((k, repo.asset_graph.get(k)) for k in repo.assets_defs_by_key)
        if node.pools
    }
    assert pooled == {"generations": {"sglang"}}
    node = gen.node_def
    assert node.pool == "sglang"
    assert node.retry_policy is not None and node.retry_policy.max_retries >= 1


@pytest.mark.integration
def test_definitions_validate_from_the_workspace(tmp_path):
    """What `dagster dev -w workspace.yaml` loads must validate (same check as `dg check defs`)."""
    r = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.integration
def test_dg_check_defs():
    r = subprocess.run(
        [str(Path(sys.executable).parent / "dg"), "check", "defs"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "All definitions loaded successfully" in r.stdout + r.stderr
