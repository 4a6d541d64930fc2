"""`eagle3 plan` from a plain subprocess against a real simulator, then the real run: the plan's counts
are what the run does, an incremental night plans nothing to send, and the report shows plan vs actual; a
server of another model than the profile's is named and gets no probe request."""

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
from graph_helpers import SPEC_ARGS, graph_resources, probe_assets

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.orchestration.run import GraphScope
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration

MAX_NEW = 2048  # the plan and the run must use the same (it is part of every cache key)


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_", "PYTEST"))}
    env.update(
        EAGLE3_DATA_DIR=str(tmp_path / "data"),
        EAGLE3_SGLANG_URL=url,
        DAGSTER_HOME=str(tmp_path / "home"),
    )
    return env


def _plan(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.app.cli", "plan", *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plan_probes_the_fleet_and_matches_the_run(tmp_path, kimi_profile):
    from eagle3_dagster.definitions import defs
    from eagle3_dagster.orchestration.run import materialize_graph
    from eagle3_dagster.plan.actual import plan_vs_actual
    from eagle3_dagster.plan.build import read_plan
    from eagle3_dagster.storage import data_root

    data = tmp_path / "data"
    with start_simulator(extra_args=("--token-latency-ms", "1")) as sim:
        env = _env(tmp_path, sim.url)
        r = _plan(env, "--max-new-tokens", str(MAX_NEW), "--probe-requests", "4", "--json", str(tmp_path / "p.json"))
        assert r.returncode == 0, r.stderr
        assert "ETA" in r.stdout and "GPU-hours" in r.stdout and "Traceback" not in r.stderr
        plan = json.loads((tmp_path / "p.json").read_text())
        assert plan == json.loads((data / "plan" / "plan.json").read_text())
        # the probe: real /generate answers, measured tokens/s, the revision the server reports
        assert len(plan["probe"]) == 1 and plan["probe"][0]["requests"] == 4
        assert plan["probe"][0]["output_tokens"] > 0 and plan["fleet"]["tokens_per_s_per_server"] > 0
        assert plan["fleet"]["throughput_basis"].startswith("probe")
        assert plan["model_revision"] == "moonshotai/Kimi-K2.5@default"
        assert plan["requests_cached"] == 0 and plan["requests_to_send"] == plan["tokenized"] > 0
        assert (
            plan["output_basis"] == "max_new_tokens" and plan["expected_output_tokens"] == MAX_NEW * plan["tokenized"]
        )
        assert any("max_new_tokens" in a for a in plan["assumptions"])
        assert not list((data / "plan").glob("plan-*"))  # the scratch ingest is removed

        # the run itself, as `eagle3 demo` drives it
        res = graph_resources(data, kimi_profile.tokenizer, sim.url, max_new_tokens=MAX_NEW)
        with dg.instance_for_test() as instance:
            out = materialize_graph(
                defs, instance, scope=GraphScope(shards=[f"{k:04d}" for k in range(4)], run_publish=True), resources=res
            )
            assert out.success, out
            meta = instance.get_latest_materialization_event(dg.AssetKey("prompts")).asset_materialization.metadata
            assert meta["plan_prompts"].value == plan["prompts"]

    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
    tokenized = pl.read_parquet(data / "tokenized_prompts" / "shard=*" / "part-0000.parquet")
    generated = pl.read_parquet(data / "generations" / "shard=*" / "part-*.parquet")
    assert plan["prompts"] == prompts.height
    assert plan["tokenized"] == tokenized.height
    assert plan["prompt_tokens"] == int(tokenized["prompt_len"].sum())
    assert plan["requests_to_send"] == generated["sample_id"].n_unique()

    view = plan_vs_actual(data_root(data), read_plan(data_root(data)))
    assert view is not None
    got = {row["metric"]: (row["planned"], row["actual"]) for row in view["rows"]}
    assert got["prompts"] == (prompts.height, prompts.height)
    assert got["prompt tokens"][0] == got["prompt tokens"][1]
    assert got["requests generated"] == (plan["requests_to_send"], generated.height)
    assert got["output tokens"][1] == int(generated["completion_tokens"].sum())
    assert got["generate time (s)"][1] > 0
    from eagle3_dagster.report.html import write_report

    page = write_report(data, tmp_path / "work").read_text()
    assert "Plan vs actual" in page and "requests generated" in page

    # the servers are down and no throughput is given: the plan uses what the run just measured, saying so
    r = _plan(_env(tmp_path, "http://127.0.0.1:9"), "--max-new-tokens", str(MAX_NEW))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    [said] = r.stderr.strip().splitlines()
    assert said.startswith(
        "eagle3 plan: no endpoint answered (EAGLE3_SGLANG_URL http://127.0.0.1:9: connection refused); "
        "using the last measured throughput, "
    ), said
    measured = json.loads((data / "plan" / "plan.json").read_text())["fleet"]
    assert measured["throughput_basis"].startswith("last measured: ") and measured["servers"] == 1
    # plan.json keeps 3 decimals (plan/estimate.py as_jsonable): 84.640 for a measured 84.64024...
    assert measured["tokens_per_s_per_server"] == pytest.approx(
        got["output tokens"][1] / got["generate time (s)"][1], abs=5e-4 + 1e-9
    )

    # the next night, nothing new: the servers are down, the throughput declared; the revision comes
    # from what is stored, and every request is cached; output tokens now from the published snapshot
    env = _env(tmp_path, "http://127.0.0.1:9")
    r = _plan(env, "--max-new-tokens", str(MAX_NEW), "--tokens-per-s-per-server", "1000", "--servers", "2")
    assert r.returncode == 0, r.stderr
    again = json.loads((data / "plan" / "plan.json").read_text())
    assert again["requests_cached"] == again["requests"] == plan["requests"] and again["requests_to_send"] == 0
    assert again["fleet"]["eta_s"] == 0 and again["fleet"]["servers"] == 2
    assert again["output_basis"].startswith("snapshot ")
    train = pl.read_parquet(data / "training_samples" / "shard=*" / "part-0000.parquet")
    assert again["output_mean_per_request"] == pytest.approx(float(train["output_len"].mean()), rel=1e-3)
    assert again["disk"]["basis"]["generations"].startswith("measured")


def test_bad_settings_and_unreachable_endpoints_are_one_line(tmp_path):
    env = _env(tmp_path, "http://127.0.0.1:9")
    r = _plan(env, "--servers", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "eagle3 plan: error: --servers must be at least 1, got 0"
    r = _plan(env, "--max-new-tokens", "64")  # no throughput declared: the probe finds nobody
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "probe of http://127.0.0.1:9: /model_info" in r.stderr and "--tokens-per-s-per-server X" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2
    r = _plan({**env, "EAGLE3_N_SHARDS": "0"}, "--tokens-per-s-per-server", "10")
    assert r.returncode == 2 and "EAGLE3_N_SHARDS" in r.stderr and "Traceback" not in r.stderr


def test_a_server_of_another_model_is_named_and_gets_no_probe_request(tmp_path):
    qwen_args = ("--model", "qwen3", "--tokenizer", str(PROJECT_ROOT.parent / "shared" / "tokenizers" / "qwen3"))
    with start_simulator(extra_args=qwen_args) as qwen:  # a real Qwen3 server; the profile is Kimi-K2.5's
        r = _plan(_env(tmp_path, qwen.url), "--max-new-tokens", "64", "--probe-requests", "2")
        sent = httpx.get(qwen.url + "/_sim/stats", timeout=5).json()["requests"]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [
        f"eagle3 plan: error: EAGLE3_SGLANG_URL {qwen.url}: the endpoint serves another model: model_path "
        "'Qwen/Qwen3-8B' (model_type 'qwen3'), but the model profile kimi-k2.5 expects model_type 'kimi_k25'. Point "
        "the run at a server of that model, choose the profile of this one (EAGLE3_MODEL), or, if you mean to use "
        "this model, pin it: EAGLE3_SERVED_MODEL=Qwen/Qwen3-8B",
        "eagle3 plan: no probe request was sent; nothing was written",
    ]
    assert sent == 0 and not (tmp_path / "data" / "plan").exists()


N_PROBE = 3


def _generated(data: Path) -> pl.DataFrame:
    return pl.read_parquet(data / "generations" / "shard=*" / "part-*.parquet", columns=["sample_id", "source"])


def test_a_new_drafter_is_planned_as_the_probe_prompts_and_the_run_sends_them(
    tmp_path, monkeypatch, datasets_dir, kimi_profile
):
    from eagle3_dagster.config import settings
    from eagle3_dagster.definitions import defs as full
    from eagle3_dagster.defs.ingest import build_ingest_assets
    from eagle3_dagster.orchestration.run import materialize_graph

    assets = probe_assets(tmp_path, datasets_dir, n_probe=N_PROBE, train_limit=12)
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    ingest_free = [
        a
        for a in (full.assets or [])
        if not any(k.path[0].startswith("source__") or k.path[0] == "prompts" for k in a.keys)
    ]
    defs = dg.Definitions(assets=[*build_ingest_assets(settings()), *ingest_free])
    data, shards = tmp_path / "data", [f"{k:04d}" for k in range(4)]

    def plan(url: str) -> dict:
        env = {**_env(tmp_path, url), "EAGLE3_ASSETS_DIR": str(assets)}
        r = _plan(env, "--max-new-tokens", str(MAX_NEW), "--tokens-per-s-per-server", "1000")
        assert r.returncode == 0, r.stderr
        return json.loads((data / "plan" / "plan.json").read_text())

    def night(url: str) -> None:
        res = graph_resources(data, kimi_profile.tokenizer, url, max_new_tokens=MAX_NEW)
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=shards), resources=res).success

    sim_args = ("--token-latency-ms", "1", *SPEC_ARGS, "--speculative-draft-model-path")
    with start_simulator(extra_args=(*sim_args, "test/drafter-a")) as sim_a:
        night(sim_a.url)
        same = plan(sim_a.url)  # the drafter that generated them: every probe prompt is cached
    first = _generated(data)
    assert same["requests_to_send"] == 0 and same["requests_cached"] == same["requests"] == first.height
    assert same["probe_sources"] == ["probe_math"] and same["drafter_key"].startswith("eagle3-")

    with start_simulator(extra_args=(*sim_args, "test/drafter-b")) as sim_b:
        new = plan(sim_b.url)  # a new drafter: exactly the probe prompts will be sent
        assert new["drafter_key"] != same["drafter_key"]
        assert new["requests_to_send"] == N_PROBE and new["requests_cached"] == new["requests"] - N_PROBE
        night(sim_b.url)
    sent = _generated(data).join(first, on="sample_id", how="anti")
    assert sent.height == new["requests_to_send"]  # plan == actual
    assert sent["source"].to_list() == ["probe_math"] * N_PROBE
