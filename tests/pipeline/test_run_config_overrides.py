"""Every overridable resource field, overridden in a run's config, changes what the run does.

Each case is one real in-process Dagster run of the real assets, on a real instance, against real
simulator processes: the deployment's settings come from the environment (bound into the resources
by `resources_from_settings`, the function the code location uses), and the run config overrides
ONE field, as a user does in the launchpad (`resources: {sglang: {config: {regen_seed: 7}}}`). The
assertion is the observable effect: where files land, what the run read, the ids stored, the
endpoint used, the retries the client made.

Dagster 1.13 behaviour this relies on (the regen_seed case pins it):
run config for a resource replaces its bound values, so a field the run config does not name falls
back to its class default. `resources_from_settings` binds each resource as a class whose defaults ARE
the deployment's values (orchestration/resources.bound), so the other fields keep them.

Load-time settings (shard count, source list, executor, schedule, sensor interval) are not resource
fields: they shape the definitions and are covered by tests/pipeline/test_defs_snapshot.py.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest
from graph_helpers import shard_with_most_prompts
from sim_ctl import Sim

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.definitions import defs
from eagle3_dagster.generate import sample_key
from eagle3_dagster.orchestration.asset_names import stage_assets
from eagle3_dagster.orchestration.resources import PipelineSettings, SGLangFleet, resources_from_settings
from eagle3_dagster.orchestration.run import QUIET
from eagle3_dagster.quality.gate import read_gate_result

pytestmark = pytest.mark.integration

QWEN_TOKENIZER = (PROJECT_ROOT.parent / "shared" / "tokenizers" / "qwen3").resolve()


@dataclass
class Deployment:
    root: Path
    base_data: Path
    shard: str
    sim: Sim
    other_sim: Sim
    instance: dg.DagsterInstance
    base_tokenized_meta: dict[str, Any]
    mp: pytest.MonkeyPatch


def _meta(result: dg.ExecuteInProcessResult, node: str) -> dict[str, Any]:
    mats = result.asset_materializations_for_node(node)
    assert mats, f"{node} was not materialized: {_failures(result)}"
    return {k: getattr(v, "value", v) for k, v in mats[-1].metadata.items()}


def _failures(result: dg.ExecuteInProcessResult) -> str:
    out = []
    for ev in result.get_step_failure_events():
        err = ev.step_failure_data.error
        while err is not None:
            out.append(err.message)
            err = err.cause
    return "\n".join(out)


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {ev.check_name: bool(ev.passed) for ev in result.get_asset_check_evaluations()}


def _run(dep: Deployment, asset: str, overrides: dict[str, dict[str, Any]]) -> dg.ExecuteInProcessResult:
    """One run of `asset` for the deployment's shard: resources bound from the current settings,
    `overrides` ({resource: {field: value}}) in the run config."""
    return dg.materialize(
        list(defs.assets or []),
        selection=[asset],
        partition_key=dep.shard,
        instance=dep.instance,
        resources=resources_from_settings(settings()),
        run_config={**QUIET, "resources": {name: {"config": cfg} for name, cfg in overrides.items()}},
        raise_on_error=False,
    )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("overrides")
    sims = [Sim(wait=False), Sim(wait=False)]  # both load the tokenizer at once
    mp = pytest.MonkeyPatch()
    try:
        for s in sims:
            s.wait_ready()
        # the deployment's model profile answers in at most 256 tokens: streamed in 64-token chunks, quick runs
        assets = root / "deployment_assets"
        shutil.copytree(PROJECT_ROOT / "assets", assets)
        prof = assets / "models" / "kimi-k2.5.yaml"
        prof.write_text(prof.read_text().replace("max_new_tokens: 8192", "max_new_tokens: 256", 1))
        mp.setenv("EAGLE3_ASSETS_DIR", str(assets))
        mp.setenv("EAGLE3_DATA_DIR", str(root / "base" / "data"))
        mp.setenv("EAGLE3_WORK_DIR", str(root / "base" / "work"))
        mp.setenv("EAGLE3_SGLANG_URL", sims[0].url)
        mp.setenv("EAGLE3_ENDPOINT_WAIT_S", "60")  # a deployment value: an override that is lost shows as a hang
        mp.delenv("EAGLE3_STREAM", raising=False)
        mp.delenv("EAGLE3_STALL_TIMEOUT_S", raising=False)
        with dg.instance_for_test() as instance:
            ingest = dg.materialize(
                list(defs.assets or []),
                selection=stage_assets("ingest"),
                instance=instance,
                resources=resources_from_settings(settings()),
                run_config=QUIET,
            )
            assert ingest.success
            shard = shard_with_most_prompts(root / "base" / "data")
            dep = Deployment(root, root / "base" / "data", shard, sims[0], sims[1], instance, {}, mp)
            tok = _run(dep, "tokenized_prompts", {})
            assert tok.success, _failures(tok)
            dep.base_tokenized_meta = _meta(tok, "tokenized_prompts")
            assert dep.base_tokenized_meta["rejected"] == 0 and dep.base_tokenized_meta["profile"] == "kimi-k2.5"
            yield dep
    finally:
        mp.undo()
        for s in sims:
            s.kill()


@pytest.fixture
def case(deployment: Deployment, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """A fresh data dir per case (the base prompts + tokenized shard, no generations: nothing cached)."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)
    data = deployment.root / name / "data"
    for part in ("prompts", "tokenized_prompts"):
        shutil.copytree(deployment.base_data / part, data / part)
    deployment.mp.setenv("EAGLE3_DATA_DIR", str(data))
    deployment.mp.setenv("EAGLE3_WORK_DIR", str(deployment.root / name / "work"))
    deployment.sim.faults(clear=True)
    try:
        yield deployment
    finally:
        deployment.sim.faults(clear=True)


def _gens(dep: Deployment) -> pl.DataFrame:
    return pl.read_parquet(
        Path(settings().storage.data_dir.local_path) / "generations" / f"shard={dep.shard}" / "part-*.parquet"
    )


# ------------------------------------------------------------------------ PipelineSettings fields


def case_data_dir(dep: Deployment) -> None:
    other = dep.root / "elsewhere"
    shutil.copytree(dep.base_data / "prompts", other / "prompts")
    r = _run(dep, "tokenized_prompts", {"pipeline": {"data_dir": str(other)}})
    assert r.success, _failures(r)
    assert (other / "tokenized_prompts" / f"shard={dep.shard}" / "part-0000.parquet").is_file()
    assert _meta(r, "tokenized_prompts")["path"].startswith(str(other))


def case_work_dir(dep: Deployment) -> None:
    work = dep.root / "scratch"
    r = _run(dep, "tokenized_prompts", {"pipeline": {"work_dir": str(work)}})
    assert r.success, _failures(r)
    assert (work / "gx").is_dir(), "the GX context goes to the overriding work dir"
    report = dg.materialize(
        list(defs.assets or []),
        selection=["quality_report"],
        instance=dep.instance,
        resources=resources_from_settings(settings()),
        run_config={**QUIET, "resources": {"pipeline": {"config": {"work_dir": str(work)}}}},
        raise_on_error=False,
    )
    assert _meta(report, "quality_report")["path"].startswith(str(work))


def case_assets_dir(dep: Deployment) -> None:
    assets = dep.root / "assets2"
    shutil.copytree(settings().storage.assets_dir, assets)
    prof = assets / "models" / "kimi-k2.5.yaml"
    prof.write_text(prof.read_text().replace("max_prompt_tokens: 32768", "max_prompt_tokens: 8"))
    r = _run(dep, "tokenized_prompts", {"pipeline": {"assets_dir": str(assets)}})
    meta = _meta(r, "tokenized_prompts")
    # the profile read from the overriding assets dir allows 8 prompt tokens: every prompt is quarantined
    assert meta["rejected"] == meta["prompts_in"] > 0, meta
    assert set(meta["rejects_by_reason"]) == {"prompt_too_long"}


def case_expectations_dir(dep: Deployment) -> None:
    exp = dep.root / "expectations2"
    shutil.copytree(PROJECT_ROOT / "expectations", exp)
    suite = json.loads((exp / "prompts.json").read_text())
    for e in suite["expectations"]:
        if e["meta"]["key"] == "thinking_token_ends_prompt":
            e["kwargs"]["value_set"] = [False]  # a suite no Kimi prompt can pass
    (exp / "prompts.json").write_text(json.dumps(suite))
    r = _run(dep, "tokenized_prompts", {"pipeline": {"expectations_dir": str(exp)}})
    assert _checks(r)["thinking_token_ends_prompt"] is False
    assert not r.success  # a blocking check failed


def case_model(dep: Deployment) -> None:
    r = _run(dep, "tokenized_prompts", {"pipeline": {"model": "qwen3"}})
    assert _meta(r, "tokenized_prompts")["profile"] == "qwen3"


def case_tokenizer(dep: Deployment) -> None:
    r = _run(dep, "tokenized_prompts", {"pipeline": {"tokenizer": str(QWEN_TOKENIZER)}})
    meta = _meta(r, "tokenized_prompts")
    assert meta["tokenizer"] == str(QWEN_TOKENIZER)
    assert meta["tokenizer_fingerprint"] != dep.base_tokenized_meta["tokenizer_fingerprint"]


def case_max_new_tokens(dep: Deployment) -> None:
    _run(dep, "generations", {"pipeline": {"max_new_tokens": 16}})  # its gate fails: no room for </think>
    gens = _gens(dep)
    assert gens.height > 0 and gens["completion_tokens"].max() <= 16
    assert set(gens["finish_reason"]) == {"length"}


def _evaluation(result: dg.ExecuteInProcessResult, check: str) -> Any:
    evs = [ev for ev in result.get_asset_check_evaluations() if ev.check_name == check]
    assert len(evs) == 1, f"{check}: {evs} {_failures(result)}"
    return evs[0]


def case_max_failed_rate(dep: Deployment) -> None:
    # one response cut off and not retried: 1 of the shard's requests fails (retryable: the next run sends it
    # again, so it is not called permanent), over the default 1% budget
    dep.sim.faults(reset_mid_body=1)
    r = _run(dep, "generations", {"sglang": {"max_retries": 0}})
    requested = _meta(r, "generations")["requested"]
    assert requested > 1
    ev = _evaluation(r, "request_failure_budget")
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
    assert ev.description.startswith(
        f"request failure rate {1 / requested:.2%} (budget 1.00%), top reason retries_exhausted=1: "
        f"1 of {requested} requests failed (1 retryable, the next run sends them again: retries_exhausted=1); "
        "last retries_exhausted: reset after 1 "
    ), ev.description
    gate = read_gate_result(settings().storage.data_dir, "generations", int(dep.shard))
    # stored as a failed critical outcome of the generations gate: the snapshot leaves the shard out
    assert gate is not None and not gate.success
    assert "request_failure_rate" in {o.key for o in gate.failed_critical}

    # the same failure under a budget of 50%: a WARN, not a critical failure of the gate
    dep.sim.faults(reset_mid_body=1)
    r = _run(dep, "generations", {"pipeline": {"max_failed_rate": 0.5}, "sglang": {"max_retries": 0}})
    ev = _evaluation(r, "request_failure_budget")
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.WARN, ev.description
    assert "(budget 50.00%), top reason retries_exhausted=1" in ev.description
    gate = read_gate_result(settings().storage.data_dir, "generations", int(dep.shard))
    assert gate is not None and "request_failure_rate" not in {o.key for o in gate.failed_critical}
    assert "request_failure_rate" in {o.key for o in gate.failed_warnings}


# ----------------------------------------------------------------------------- SGLangFleet fields


def case_urls(dep: Deployment) -> None:
    before_a, before_b = dep.sim.requests(), dep.other_sim.requests()
    r = _run(dep, "generations", {"sglang": {"urls": dep.other_sim.url}})
    assert _meta(r, "generations")["succeeded"] > 0, _failures(r)
    assert set(_gens(dep)["endpoint"]) == {dep.other_sim.url}
    assert dep.other_sim.requests() > before_b and dep.sim.requests() == before_a


def case_max_in_flight(dep: Deployment) -> None:
    r = _run(dep, "generations", {"sglang": {"max_in_flight": 3}})
    meta = _meta(r, "generations")
    assert (meta["max_in_flight"], meta["in_flight_source"]) == (3, "config")


def case_model_revision(dep: Deployment) -> None:
    r = _run(dep, "generations", {"sglang": {"model_revision": "pinned-rev-7"}})
    assert _meta(r, "generations")["succeeded"] > 0, _failures(r)
    assert set(_gens(dep)["model_revision"]) == {"pinned-rev-7"}


def case_regen_seed(dep: Deployment) -> None:
    r = _run(dep, "generations", {"sglang": {"regen_seed": 7}})
    assert _meta(r, "generations")["succeeded"] > 0, _failures(r)
    gens = _gens(dep)
    rows = gens.select("sample_id", "prompt_id", "model_revision", "template_hash", "sampling_hash").rows()
    assert rows and all(sid == sample_key(p, rev, th, sh, 7) for sid, p, rev, th, sh in rows)
    assert all(sid != sample_key(p, rev, th, sh, None) for sid, p, rev, th, sh in rows)
    # the fields the run config did not name kept the deployment's values (Dagster dropped the bound ones):
    # the endpoint from EAGLE3_SGLANG_URL, streaming on
    assert set(gens["endpoint"]) == {dep.sim.url}
    assert _meta(r, "generations")["streamed"] is True


def case_probe_seed(dep: Deployment) -> None:
    """probe_seed redraws the `role: probe` sets only (tests/generate/test_probe_keys.py): the deployment has
    none, so a bumped probe seed leaves every training sample's key, and so its stored row, as it was."""
    base = _meta(
        _run(dep, "generations", {}), "generations"
    )  # the 256-token answers may fail the gate: stored all the same
    assert base["requested"] > 0, base
    r = _run(dep, "generations", {"sglang": {"probe_seed": 7}})
    meta = _meta(r, "generations")
    assert meta["succeeded"] == 0 and meta["skipped_cached"] == meta["requested"] > 0, meta


def case_read_timeout_s(dep: Deployment) -> None:
    dep.sim.faults(slow_tokens_ms=5)  # an answer takes longer than the 0.2 s read timeout
    # the read timeout bounds a non-streamed request (a streamed one is bounded by the stall limits)
    r = _run(dep, "generations", {"sglang": {"read_timeout_s": 0.2, "stream": False}})
    meta = _meta(r, "generations")
    assert meta["retried_by_kind"].get("read_timeout", 0) > 0, meta["retried_by_kind"]


def case_max_retries(dep: Deployment) -> None:
    dep.sim.faults(reset_mid_body=1)  # one response cut off: retried under the default, lost with 0 retries
    r = _run(dep, "generations", {"sglang": {"max_retries": 0}})
    meta = _meta(r, "generations")
    assert meta["failed"] == 1 and meta["succeeded"] == meta["requested"] - 1, meta
    assert not meta["retried_by_kind"]


def case_wait_for_endpoint_s(dep: Deployment) -> None:
    dep.sim.faults(health="draining")  # /health 503: no routable endpoint
    t0 = time.monotonic()
    r = _run(dep, "generations", {"sglang": {"wait_for_endpoint_s": 1.0}})
    assert not r.success
    assert "no routable SGLang endpoint after 1s" in _failures(r)
    assert time.monotonic() - t0 < 30  # the deployment's 60 s wait was not used


def case_stream(dep: Deployment) -> None:
    r = _run(dep, "generations", {"sglang": {"stream": False}})
    assert _meta(r, "generations")["succeeded"] > 0, _failures(r)
    assert _meta(r, "generations")["streamed"] is False


def case_stall_timeout_s(dep: Deployment) -> None:
    # one stream goes silent with the connection open after its first 64-token chunk
    dep.sim.faults(stall=1, stall_after_tokens=70, slow_tokens_ms=1)
    t0 = time.monotonic()
    r = _run(dep, "generations", {"sglang": {"stall_timeout_s": 1.0}})
    assert _meta(r, "generations")["retried_by_kind"].get("stall", 0) >= 1
    assert time.monotonic() - t0 < 60  # the default 300 s stall limit was not used


def case_context_overflow(dep: Deployment) -> None:
    # the simulator's context is the profile's: nothing overflows, the run names the mode it was given
    r = _run(dep, "generations", {"sglang": {"context_overflow": "skip"}})
    meta = _meta(r, "generations")
    assert meta["context_overflow"] == "skip" and meta["succeeded"] > 0, _failures(r)
    assert (meta["context_fitted"], meta["context_overflow_skipped"]) == (0, 0)


CASES: dict[str, Callable[[Deployment], None]] = {
    "pipeline.data_dir": case_data_dir,
    "pipeline.work_dir": case_work_dir,
    "pipeline.assets_dir": case_assets_dir,
    "pipeline.expectations_dir": case_expectations_dir,
    "pipeline.model": case_model,
    "pipeline.tokenizer": case_tokenizer,
    "pipeline.max_new_tokens": case_max_new_tokens,
    "pipeline.max_failed_rate": case_max_failed_rate,
    "sglang.urls": case_urls,
    "sglang.max_in_flight": case_max_in_flight,
    "sglang.model_revision": case_model_revision,
    "sglang.regen_seed": case_regen_seed,
    "sglang.probe_seed": case_probe_seed,
    "sglang.read_timeout_s": case_read_timeout_s,
    "sglang.max_retries": case_max_retries,
    "sglang.wait_for_endpoint_s": case_wait_for_endpoint_s,
    "sglang.stream": case_stream,
    "sglang.stall_timeout_s": case_stall_timeout_s,
    "sglang.context_overflow": case_context_overflow,
}


def test_every_resource_field_has_a_case() -> None:
    """A new resource field without an override case fails here."""
    fields = {f"pipeline.{f}" for f in PipelineSettings.model_fields} | {
        f"sglang.{f}" for f in SGLangFleet.model_fields
    }
    assert fields == set(CASES)


@pytest.mark.parametrize("field", list(CASES))
def test_run_config_override_changes_the_run(field: str, case: Deployment) -> None:
    CASES[field](case)
