"""Publishing is a gate, and drift between nights is noticed: real Dagster runs on one instance and one
data dir, the simulator as the SGLang server.

- night 1 (healthy demo sources): published, no warning anywhere (no alarm fatigue);
- night 2 against a changed deployment (new weight version, reasoning ~5x shorter): regenerates, the
  drift check fails (policy hold: not published, LATEST unchanged) or warns (default policy: published,
  marked), and the report, the run log, the demo summary and the manifest name it;
- a wrong tokenizer for the profile (every prompt rejected) and a run where every shard fails a gate,
  after a good snapshot: nothing published, LATEST unchanged, the asset fails naming why.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import dagster as dg
import httpx
import pytest
from graph_helpers import shard_with_most_prompts

from eagle3_dagster.app.demo import summarize
from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.definitions import defs
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.quality import read_gate_result
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration

QWEN_TOKENIZER = (PROJECT_ROOT.parent / "shared" / "tokenizers" / "qwen3").resolve()


def _requests(url: str) -> int:
    return httpx.get(f"{url}/_sim/stats", timeout=10).json()["requests"]


def _latest(data: Path) -> str:
    return (data / "snapshots" / "LATEST").read_text().strip()


def _manifest(data: Path, version: str) -> dict:
    return json.loads((data / "snapshots" / version / "manifest.json").read_text())


def _run_log(instance: dg.DagsterInstance, run_id: str) -> str:
    return "\n".join(e.user_message or "" for e in instance.all_logs(run_id))


def _res(data: Path, url: str, **pipeline) -> dict:
    return {
        "pipeline": pipeline_resource(settings(), data_dir=str(data), max_new_tokens=2048, **pipeline),
        "sglang": SGLangFleet(urls=url),
    }


def _first_night(data: Path, instance: dg.DagsterInstance, url: str) -> tuple[str, str, object]:
    """Ingest, then the busiest shard, then publish: the good snapshot later nights compare with."""
    ingest = materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=_res(data, url))
    assert ingest.success
    shard = shard_with_most_prompts(data)
    night = materialize_graph(
        defs,
        instance,
        scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
        resources=_res(data, url),
    )
    assert night.success, night
    return shard, night.snapshot_version, night


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    """Night 1 healthy; night 2 against a changed deployment, first with the drift policy "hold", then
    with the default ("publish"). Returns what the tests look at (runs, logs, metadata)."""
    tmp = tmp_path_factory.mktemp("nights")
    data = tmp / "data"
    hold = tmp / "expectations-hold"
    shutil.copytree(PROJECT_ROOT / "expectations", hold)
    suite = json.loads((hold / "drift.json").read_text())
    suite["meta"]["drifted_snapshot"] = "hold"
    (hold / "drift.json").write_text(json.dumps(suite))
    out = {"data": data}
    with dg.instance_for_test() as instance, start_simulator() as sim:
        out["shard"], out["v1"], out["night1"] = _first_night(data, instance, sim.url)
        site = data / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site"
        out["docs_index_night1"] = (site / "index.html").read_text()
        out["docs_pages_night1"] = {p.relative_to(site).as_posix() for p in (site / "validations").rglob("*.html")}
        out["latest_after_night1"] = _latest(data)
        out["gates_night1"] = {
            g: read_gate_result(data, g, int(out["shard"])) for g in ("prompts", "generations", "training_samples")
        }
        out["report_night1"] = (data / "reports" / "index.html").read_text()
        out["summary_night1"] = summarize(out["night1"], dg_data(data), settings())

    v2_args = ["--weight-version", "v2-int4", "--reasoning-scale", "0.2"]
    with dg.instance_for_test() as instance, start_simulator(extra_args=v2_args) as sim2:
        held = materialize_graph(
            defs,
            instance,
            scope=GraphScope(shards=[out["shard"]], run_publish=True, allow_partial=True),
            resources=_res(data, sim2.url, expectations_dir=str(hold)),
        )
        out.update(
            held=held,
            sim2_requests=_requests(sim2.url),
            latest_after_hold=_latest(data),
            held_log=_run_log(instance, held.publish_run_id),
            attempt_held=json.loads((data / "gates" / "publish" / "last.json").read_text()),
        )
        out["manifest_held"] = _manifest(data, out["attempt_held"]["version"])
        night2 = materialize_graph(
            defs,
            instance,
            scope=GraphScope(shards=[], run_ingest=False, run_publish=True, allow_partial=True),
            resources=_res(data, sim2.url),
        )
        mat = instance.get_latest_materialization_event(dg.AssetKey("training_dataset")).asset_materialization
        out.update(
            night2=night2,
            night2_log=_run_log(instance, night2.publish_run_id),
            night2_meta=mat.metadata,
            night2_report_meta=instance.get_latest_materialization_event(
                dg.AssetKey("quality_report")
            ).asset_materialization.metadata,
            summary=summarize(night2, dg_data(data), settings()),
        )
    return out


def test_night_one_is_published_without_a_single_warning(nights):
    data, v1 = nights["data"], nights["v1"]
    assert nights["latest_after_night1"] == v1
    m1 = _manifest(data, v1)
    assert m1["published"] is True and m1["drift"] is None and m1["summary"]["rows"] == m1["rows"] > 0
    assert m1["summary"]["model_revision"].endswith("@default")
    # no alarm fatigue: a healthy single-source run warns nowhere
    for gate, res in nights["gates_night1"].items():
        assert res.success and not res.failed_warnings, (gate, [o.key for o in res.failed_warnings])
    assert 'class="badge WARN"' not in nights["report_night1"]
    assert "warnings:   none" in nights["summary_night1"]
    # quality_report's Data Docs build (the gates build none): the index links exactly the stored pages
    # (every gate of the night: prompts, generations, training_samples, publish, drift)
    linked = set(re.findall(r'(validations/[^"\\\s<>]+?\.html)', nights["docs_index_night1"]))
    assert linked == nights["docs_pages_night1"]
    assert {p.split("/")[1] for p in linked} >= {"prompts_gate", "generations_gate", "training_samples_gate"}


def test_changed_deployment_regenerates_and_drift_holds_back_or_warns_as_configured(nights):
    data, v1 = nights["data"], nights["v1"]
    held = nights["held"]
    # policy "hold": regenerated against the new deployment, held back, LATEST unchanged, the asset fails
    assert nights["sim2_requests"] > 0, "a new weight version is a new cache key: night 2 must regenerate"
    assert all(s.success for s in held.shards) and held.publish_success is False and not held.success
    assert nights["latest_after_hold"] == v1
    drift_ok, severity, text = held.publish_checks["drift_gate"]
    assert not drift_ok and severity == "ERROR" and "median reasoning length" in text and "held back" in text
    attempt = nights["attempt_held"]
    v2 = attempt["version"]
    assert v2 != v1 and not attempt["published"] and attempt["written"]
    mh = nights["manifest_held"]
    assert mh["published"] is False and mh["drift"]["status"] == "warned" and mh["drift"]["against"] == v1
    assert "held back by the drift gate" in mh["not_published_because"][0]
    ratio = mh["drift"]["values"]["reasoning_len_p50_ratio"]
    assert 0.1 < ratio < 0.35, ratio  # ~5x shorter
    assert mh["drift"]["values"]["model_revision_changed"] is True
    assert "held back" in nights["held_log"]

    # the default policy ("publish"): the same snapshot is published, marked, and the check warns
    night2 = nights["night2"]
    assert night2.success and night2.snapshot_version == v2 and _latest(data) == v2
    drift_ok, severity, text = night2.publish_checks["drift_gate"]
    assert not drift_ok and severity == "WARN" and "published, marked drifted" in text
    m2 = _manifest(data, v2)
    assert m2["published"] is True and m2["drift"]["status"] == "warned"
    failed = " ".join(m2["drift"]["failed"])
    assert "median reasoning length" in failed and "same model revision" in failed
    # the run log, the demo summary and the report name it
    assert "drift: WARNED against snapshot " + v1 in nights["night2_log"]
    assert f"drift:      WARNED against snapshot {v1}" in nights["summary"]
    assert "result:     SUCCESS" in nights["summary"]
    report = (data / "reports" / "index.html").read_text()
    top = report[: report.index("Gates by shard")]
    assert "DRIFT WARNED" in top and "median reasoning length" in top and "before vs after" in top
    # headline numbers as numeric metadata (Dagster plots them across nights), and the report path
    assert isinstance(nights["night2_meta"]["summary/reasoning_len_p50"].value, float)
    assert nights["night2_report_meta"]["path"].value.endswith("index.html")


def dg_data(data: Path):
    from eagle3_dagster.storage import data_root

    return data_root(data)


def test_nothing_published_after_a_good_snapshot_when_every_prompt_or_every_shard_fails(nights):
    data, shard = nights["data"], nights["shard"]
    good = _latest(data)
    before = sorted(p.name for p in (data / "snapshots").iterdir() if p.is_dir())
    with dg.instance_for_test() as instance, start_simulator() as sim:
        # the Qwen3 tokenizer with the Kimi profile: every prompt is rejected, the shard is empty
        wrong = materialize_graph(
            defs,
            instance,
            scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
            resources=_res(data, sim.url, tokenizer=str(QWEN_TOKENIZER)),
        )
        assert wrong.publish_success is False and not wrong.success and wrong.snapshot_version is None
        assert _latest(data) == good
        ok, severity, text = wrong.publish_checks["publish_gate"]
        assert not ok and severity == "ERROR" and "snapshot has at least one row" in text and "LATEST unchanged" in text
        assert "NOT published" in _run_log(instance, wrong.publish_run_id)
        summary = summarize(wrong, dg_data(data), settings())
        assert "publish:    FAILED" in summary and "result:     FAILED" in summary
        assert "not published" in summary

        # every shard of the run fails a gate (outputs without think-end): none passed, no snapshot is even
        # attempted (not even a partial one, though it was asked for), and the summary says so
        httpx.post(f"{sim.url}/_sim/faults", json={"mode": "drop-think-end"}, timeout=10).raise_for_status()
        res = _res(data, sim.url)
        res["sglang"] = SGLangFleet(urls=sim.url, regen_seed=11)  # new cache keys: regenerate
        broken = materialize_graph(
            defs,
            instance,
            scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
            resources=res,
        )
        assert not broken.shards[0].success and broken.publish_success is None and broken.publish_run_id == ""
        assert _latest(data) == good
        assert broken.not_published == f"not published: no shard passed (shard(s) {shard} failed)"
        assert f"publish:    {broken.not_published}" in summarize(broken, dg_data(data), settings())
        top = (data / "reports" / "index.html").read_text().split("Gates by shard")[0]
        assert "NOT published (refused)" in top  # the last attempt (the empty snapshot above) stays the news
    assert sorted(p.name for p in (data / "snapshots").iterdir() if p.is_dir()) == before


def test_one_answer_for_every_prompt_fails_the_shard_and_nothing_is_published(nights):
    """A server that sends one answer for every prompt, each with its own rid and prompt length (a response cache
    keyed on the wrong field): the generations gate fails on `same_answer_to_different_prompts` and quarantines
    every row. Under the one publish rule no snapshot is asked for and the summary says which shard kept it back;
    a partial snapshot asked for is not made of no shard at all. LATEST stays."""
    data, shard = nights["data"], nights["shard"]
    good = _latest(data)
    before = sorted(p.name for p in (data / "snapshots").iterdir() if p.is_dir())
    with dg.instance_for_test() as instance, start_simulator() as sim:
        httpx.post(f"{sim.url}/_sim/faults", json={"same_answer": 1_000_000}, timeout=10).raise_for_status()
        res = _res(data, sim.url)
        res["sglang"] = SGLangFleet(urls=sim.url, regen_seed=12)  # new cache keys: regenerate
        run = materialize_graph(
            defs, instance, scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True), resources=res
        )
        sent = httpx.get(f"{sim.url}/_sim/stats", timeout=10).json()
        partial = materialize_graph(
            defs,
            instance,
            scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
            resources=res,
        )
    answered = sum(sent["finished"].values())
    assert sent["faults_injected"]["same_answer"] == answered > 1  # every answer was the first one
    assert not run.shards[0].success and run.publish_success is None and not run.success
    assert shard in run.not_published and "every shard passed" in run.not_published
    gate = read_gate_result(data, "generations", int(shard))
    assert [o.key for o in gate.failed_critical] == ["same_answer_to_different_prompts"]
    assert gate.row_failures.height == answered  # every row quarantined: none can reach training
    summary = summarize(run, dg_data(data), settings())
    assert f"publish:    {run.not_published}" in summary and "result:     FAILED" in summary
    assert partial.publish_success is None and not partial.success  # a partial snapshot of no shard is none
    assert "no shard passed" in partial.not_published and shard in partial.not_published
    assert _latest(data) == good
    assert sorted(p.name for p in (data / "snapshots").iterdir() if p.is_dir()) == before
