"""`eagle3 demo --samples N` runs one big shard from its own assets folder by building its definitions from a
changed copy of the settings: this process's environment, and so every other reader of `settings()`, is
left exactly as it was."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from eagle3_dagster.app import demo
from eagle3_dagster.app.cli import build_parser
from eagle3_dagster.config import settings
from eagle3_dagster.orchestration import run as run_module
from eagle3_dagster.orchestration.run import graph_shard_keys

pytestmark = pytest.mark.integration  # the ingest run executes in process on a real instance


def test_demo_samples_runs_one_shard_without_touching_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EAGLE3_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("EAGLE3_SGLANG_URL", "http://127.0.0.1:9")  # no simulator: no request is sent
    for var in ("EAGLE3_N_SHARDS", "EAGLE3_ASSETS_DIR"):
        monkeypatch.delenv(var, raising=False)
    before = dict(os.environ)
    seen: dict[str, Any] = {}
    real = run_module.materialize_graph

    def ingest_only(defs: dg.Definitions, instance: dg.DagsterInstance, **kw: Any) -> Any:
        """The demo's graph run, up to its ingest run (the shard runs need a server): what it was handed."""
        seen.update(kw, keys=graph_shard_keys(defs), defs=defs, shards=kw["scope"].shards)
        ingest_scope = dataclasses.replace(kw["scope"], shards=[], run_publish=False)
        return real(defs, instance, **{**kw, "scope": ingest_scope})

    monkeypatch.setattr(run_module, "materialize_graph", ingest_only)
    args = build_parser().parse_args(["demo", "--samples", "3"])
    assert demo.run(args) == 0

    assert dict(os.environ) == before
    assert (
        settings().shards.n_shards == 4 and settings().storage.assets_dir != tmp_path / "data" / "big_shard" / "assets"
    )
    assert seen["keys"] == ["0000"] and seen["shards"] is None  # every shard of its definitions: the one
    pipeline = seen["defs"].resources["pipeline"]
    assert Path(pipeline.assets_dir).parent.name == "big_shard"
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        [ingest] = instance.get_runs()
        prompts = instance.get_latest_materialization_event(dg.AssetKey("prompts"))
        assert prompts is not None and ingest.job_name == "ingest"
        meta = prompts.asset_materialization.metadata
    assert meta["n_shards"].value == 1 and meta["rows_per_shard"].value == {"0000": 3}
    sources = sorted(k.to_user_string() for a in seen["defs"].assets for k in a.keys if "source__" in str(k))
    assert sources == ["source__big_shard"]


def test_demo_speculative_is_one_switch_for_a_drafter_and_a_probe_set(tmp_path: Path, monkeypatch) -> None:
    """`eagle3 demo --speculative`: the simulator the demo starts speculates (its /server_info names the drafter,
    its answers carry the figures) and the example probe set is among the sources, as a probe set; the
    project's assets and this process's environment are untouched."""
    import httpx

    from eagle3_dagster.generate.drafter import drafter_of
    from eagle3_dagster.ingest import load_source_specs

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EAGLE3_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("EAGLE3_WORK_DIR", str(tmp_path / "work"))
    for var in ("EAGLE3_N_SHARDS", "EAGLE3_ASSETS_DIR", "EAGLE3_SGLANG_URL"):
        monkeypatch.delenv(var, raising=False)
    before = dict(os.environ)
    seen: dict[str, Any] = {}
    real = run_module.materialize_graph

    def ingest_only(defs: dg.Definitions, instance: dg.DagsterInstance, **kw: Any) -> Any:
        url = kw["resources"]["sglang"].urls
        seen["drafter"] = drafter_of(httpx.get(url + "/server_info", timeout=5).json())
        body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}}
        seen["meta"] = httpx.post(url + "/generate", json=body, timeout=30).json()["meta_info"]
        seen["defs"] = defs
        ingest_scope = dataclasses.replace(kw["scope"], shards=[], run_publish=False)
        return real(defs, instance, **{**kw, "scope": ingest_scope})

    monkeypatch.setattr(run_module, "materialize_graph", ingest_only)
    assert demo.run(build_parser().parse_args(["demo", "--speculative"])) == 0

    assert dict(os.environ) == before and settings().storage.assets_dir.name == "assets"
    drafter = seen["drafter"]
    assert drafter is not None and (drafter.algorithm, drafter.num_draft_tokens) == ("EAGLE3", 4)
    assert seen["meta"]["spec_verify_ct"] > 0 and "spec_accept_length" in seen["meta"]
    pipeline = seen["defs"].resources["pipeline"]
    specs = {s.name: s for s in load_source_specs(Path(pipeline.assets_dir) / "sources")}
    assert specs["probe_demo"].role == "probe" and "demo" in specs  # the project's sources, plus the probe set
    assert all(f.exists() for s in specs.values() for f in s.files())
    sources = sorted(k.to_user_string() for a in seen["defs"].assets for k in a.keys if "source__" in str(k))
    assert sources == ["source__demo", "source__probe_demo"]
