"""Probe sets through the real graph: real Dagster runs, two simulator processes speculating with two
drafters, the shared datasets (docs/probes.md).

What a user relies on: the probe prompts are generated on each night's drafter and a new drafter gets
them again (the training prompts are not re-sent), each drafter keeps its probe results, and no probe
prompt ever reaches a training table or an export; a training prompt that is a probe prompt is
quarantined as probe_overlap.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from graph_helpers import SPEC_ARGS, probe_assets

from eagle3_dagster.app.demo import summarize
from eagle3_dagster.config import settings
from eagle3_dagster.defs.ingest import build_ingest_assets
from eagle3_dagster.generate.probe_results import drafter_versions, read_all_results
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.publish.export import SPECFORGE_FILE
from eagle3_dagster.quality.acceptance_drift import read_log
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.storage import data_root

pytestmark = pytest.mark.integration

N_PROBE = 3


def _assets(tmp_path: Path, datasets_dir: Path) -> Path:
    assets = probe_assets(tmp_path, datasets_dir, n_probe=N_PROBE, train_limit=40)
    gsm8k = datasets_dir / "gsm8k_test" / "test.jsonl"
    # a training source whose first question is the first probe prompt: quarantined as probe_overlap
    (assets / "sources" / "math_train.yaml").write_text(f"path: {gsm8k}\nformat: gsm8k\nlimit: 1\n")
    return assets


def _defs() -> dg.Definitions:
    from eagle3_dagster.definitions import defs

    ingest_free = [
        a
        for a in (defs.assets or [])
        if not any(k.path[0].startswith("source__") or k.path[0] == "prompts" for k in a.keys)
    ]
    return dg.Definitions(assets=[*build_ingest_assets(settings()), *ingest_free])


def _night(defs, instance, res, shards: list[str]):
    out = materialize_graph(
        defs,
        instance,
        scope=GraphScope(shards=shards, run_ingest=False, run_publish=True, allow_partial=True),
        resources=res,
    )
    assert out.success, out
    return out


def test_probe_prompts_are_measured_per_drafter_and_never_trained_on(
    tmp_path, monkeypatch, datasets_dir, kimi_profile
) -> None:
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(_assets(tmp_path, datasets_dir)))
    data = tmp_path / "data"
    defs = _defs()
    with dg.instance_for_test() as instance:
        res = {
            "pipeline": pipeline_resource(settings(), data_dir=str(data), tokenizer=kimi_profile.tokenizer),
            "sglang": SGLangFleet(urls="http://127.0.0.1:9", wait_for_endpoint_s=5),
        }
        assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
        prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
        probe_ids = set(prompts.filter(pl.col("source") == "probe_math")["prompt_id"].to_list())
        assert len(probe_ids) == N_PROBE
        rejects = pl.read_parquet(data / "prompts" / "prompt_rejects.parquet")
        assert rejects.filter(pl.col("reason") == "probe_overlap")["source"].to_list() == ["math_train"]
        # the shards holding a probe prompt, plus one of training prompts only
        shards = sorted({f"{s:04d}" for s in prompts.filter(pl.col("source") == "probe_math")["shard"].to_list()})

        runs = []
        for drafter in ("test/drafter-a", "test/drafter-b"):
            with start_simulator(extra_args=["--speculative-draft-model-path", drafter, *SPEC_ARGS]) as sim:
                res["sglang"] = SGLangFleet(urls=sim.url, wait_for_endpoint_s=5)
                runs.append(_night(defs, instance, res, shards))

        # the fleet is down on a night with nothing to send: the probe prompts are cached under the drafter
        # `eagle3 plan` assumes (the newest stored probe results'), so the night succeeds without a server, and
        # it records no drafter of its own (no "drafter changed: X -> ''" now, no "'' -> X" the next night)
        res["sglang"] = SGLangFleet(urls="http://127.0.0.1:9", wait_for_endpoint_s=5)
        dead = _night(defs, instance, res, shards)
        logged = [r.user_message for sh in dead.shards for r in instance.all_logs(sh.run_id) if not r.dagster_event]
        assert not [m for m in logged if "drafter changed" in m], logged
        assert any("no endpoint was asked" in m for m in logged)
        for s in shards:
            keys = read_log(data, int(s))["drafter_key"].to_list()
            assert len(keys) == 2 and "" not in keys  # the two nights that reached the fleet, nothing blank

        gens = pl.concat(
            [pl.read_parquet(data / "generations" / f"shard={s}" / "part-*.parquet") for s in shards], how="diagonal"
        )
        train_rows = gens.filter(pl.col("source") != "probe_math")
        probe_rows = gens.filter(pl.col("source") == "probe_math")
        # the second drafter re-sent exactly the probe prompts: two rows per probe prompt, one per training prompt
        assert probe_rows.height == 2 * N_PROBE and probe_rows["drafter_id"].n_unique() == 2
        assert train_rows.height == train_rows["prompt_id"].n_unique() and train_rows["drafter_id"].n_unique() == 1

        versions = drafter_versions(read_all_results(data))
        assert versions["draft_model_path"].to_list() == ["test/drafter-a", "test/drafter-b"]
        assert versions["n_probe_prompts"].to_list() == [N_PROBE, N_PROBE]

        # never in a training table or an export, on either night
        for s in shards:
            train = pl.read_parquet(data / "training_samples" / f"shard={s}" / "part-0000.parquet")
            assert train.height > 0 and not set(train["prompt_id"].to_list()) & probe_ids
        for out in runs:
            snap = data / "snapshots" / str(out.snapshot_version)
            exported = [json.loads(x) for x in (snap / SPECFORGE_FILE).read_text().splitlines()]
            assert exported and not {r["id"] for r in exported} & set(probe_rows["sample_id"].to_list())

        # every prompt read is counted once, probes and quarantined ones included: the demo's summary and the
        # data card state the same equation, and it adds up
        last = runs[-1]
        said = summarize(last, data_root(data), settings())
        [line] = [ln for ln in said.splitlines() if ln.startswith("counts:")]
        equation = line.removeprefix("counts:").strip()
        card = (data / "snapshots" / str(last.snapshot_version) / "README.md").read_text()
        assert f"Prompts in: {equation} (the snapshot's " in card
        read, terms, rows = _equation(equation)
        assert read == sum(terms.values()) and rows == terms["trained"] > 0
        assert terms["probe prompts"] == N_PROBE and terms["probe overlap"] == 1 and terms["in other shards"] > 0
        ingested = sum(json.loads(f.read_text())["read"] for f in (data / "sources").glob("*/counts.json"))
        assert read == ingested  # no eval source here: every record read by a source is counted


def _equation(text: str) -> tuple[int, dict[str, int], int]:
    """ "read R = words N + words N ...; training rows T..." -> (R, {words: N}, T)."""
    head, _, tail = text.partition("; training rows ")
    read, _, terms = head.removeprefix("read ").partition(" = ")
    out = {}
    for term in terms.split(" + "):
        words, _, n = term.rpartition(" ")
        out[words] = int(n.replace(",", ""))
    return int(read.replace(",", "")), out, int(tail.split(",")[0].split()[0].replace(",", ""))
