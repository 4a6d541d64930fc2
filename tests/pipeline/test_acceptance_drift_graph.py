"""Nightly acceptance drift through the real graph: real Dagster runs, simulator processes that speculate,
new prompts every night (quality/acceptance_drift.py, expectations/acceptance_drift.json).

What a user relies on: tonight's new prompts are judged against the previous night's with the same drafter;
a planted drop (the simulator's fleet fault spec_acceptance_scale) warns on the non-blocking check
`generations:acceptance_drift` naming the figures, an unchanged drafter on unchanged traffic does not, and
a drafter change is named in a WARNING line with the old and new drafter ids instead of being judged.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import httpx
import pytest

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.defs.ingest import build_ingest_assets
from eagle3_dagster.generate.drafter import drafter_of
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.quality.acceptance_drift import read_log
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration

SPEC = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
SHARD = "0000"


def _defs() -> dg.Definitions:
    from eagle3_dagster.definitions import defs

    ingest_free = [
        a
        for a in (defs.assets or [])
        if not any(k.path[0].startswith("source__") or k.path[0] == "prompts" for k in a.keys)
    ]
    return dg.Definitions(assets=[*build_ingest_assets(settings()), *ingest_free])


def _check_description(instance, run_id: str, check: str) -> str:
    (ev,) = [
        r.dagster_event.event_specific_data
        for r in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        if r.dagster_event.event_specific_data.check_name == check
    ]
    return ev.description or ""


def _source(assets: Path, datasets_dir: Path, limit: int) -> None:
    numina = datasets_dir / "numina_cot_sharegpt" / "numina_cot_sharegpt_data_1k.jsonl"
    (assets / "sources" / "numina.yaml").write_text(f"path: {numina}\nformat: sharegpt\nlimit: {limit}\n")


def _night(instance, res, sim_url: str):
    res["sglang"] = SGLangFleet(urls=sim_url, wait_for_endpoint_s=5)
    # the definitions are read again: each source asset holds its YAML as it was when they were loaded
    out = materialize_graph(_defs(), instance, scope=GraphScope(shards=[SHARD]), resources=res)
    (sh,) = out.shards
    assert sh.success, sh
    meta = instance.get_latest_materialization_event(dg.AssetKey("generations")).asset_materialization.metadata
    warnings = [r.user_message for r in instance.all_logs(sh.run_id) if not r.dagster_event and r.level >= 30]
    return sh, meta["acceptance_drift"].value, warnings


def test_acceptance_drift_fires_on_a_planted_drop_and_a_drafter_change_is_named(
    tmp_path, monkeypatch, datasets_dir, kimi_profile
) -> None:
    assets = tmp_path / "assets"
    (assets / "sources").mkdir(parents=True)
    (assets / "models").symlink_to(PROJECT_ROOT / "assets" / "models")
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    data = tmp_path / "data"
    res = {"pipeline": pipeline_resource(settings(), data_dir=str(data), tokenizer=kimi_profile.tokenizer)}
    check = "generations:acceptance_drift"
    with dg.instance_for_test() as instance:
        with start_simulator(extra_args=["--speculative-draft-model-path", "test/drafter-a", *SPEC]) as sim:
            drafter_a = drafter_of(httpx.get(sim.url + "/server_info", timeout=5).json())
            assert drafter_a is not None
            _source(assets, datasets_dir, 40)
            sh, drift, _ = _night(instance, res, sim.url)  # night 1: nothing to compare with
            assert drift["status"] == "none" and "no earlier night with this drafter" in drift["line"]
            assert drift["judged"] is False and check in sh.not_judged  # never shown as a verdict (PASS)
            assert _check_description(instance, sh.run_id, "acceptance_drift").startswith("not judged: ")

            _source(assets, datasets_dir, 100)  # night 2: new prompts, same drafter, same traffic
            sh, drift, warnings = _night(instance, res, sim.url)
            assert drift["status"] == "ok", drift
            assert sh.checks[check] is True and check not in sh.failed_checks and check not in sh.not_judged
            assert not any("acceptance drift on shard" in w for w in warnings)

            httpx.post(sim.url + "/_sim/faults", json={"spec_acceptance_scale": 0.5}, timeout=5).raise_for_status()
            _source(assets, datasets_dir, 180)  # night 3: new prompts the drafter knows less well
            sh, drift, warnings = _night(instance, res, sim.url)
            assert drift["status"] == "warned", drift
            assert drift["accept_length_ratio"] < 0.9 and drift["accept_rate_change"] < -0.05
            assert (sh.checks[check], sh.failed_checks[check]) == (False, "WARN")
            assert sh.ok  # a warning: the shard is not blocked
            (line,) = [w for w in warnings if "acceptance drift on shard 0000" in w]
            assert "mean accept length at least 0.9x the previous night's" in line and drafter_a.drafter_id in line

        with start_simulator(extra_args=["--speculative-draft-model-path", "test/drafter-b", *SPEC]) as sim:
            drafter_b = drafter_of(httpx.get(sim.url + "/server_info", timeout=5).json())
            assert drafter_b is not None
            _source(assets, datasets_dir, 260)  # night 4: another drafter is deployed
            sh, drift, warnings = _night(instance, res, sim.url)
            assert drift["status"] == "none" and check in sh.not_judged  # not judged across drafters
            (changed,) = [w for w in warnings if "drafter changed on shard 0000" in w]
            assert f"{drafter_a.drafter_id} (last seen" in changed and f"-> {drafter_b.drafter_id}" in changed
            assert drift["drafter_change"] == changed

    log = read_log(data, 0)
    assert log["drafter_key"].to_list() == [drafter_a.drafter_id] * 3 + [drafter_b.drafter_id]
    assert all(n >= 8 for n in log["new_rows"].to_list())
