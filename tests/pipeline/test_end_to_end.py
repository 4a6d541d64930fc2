"""The whole graph on a real Dagster instance, real simulator process, real Kimi tokenizer."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts

from eagle3_dagster.config import settings
from eagle3_dagster.definitions import defs
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration

KIMI_THINK_START, KIMI_THINK_END, KIMI_IM_END = 163606, 163607, 163586


def _resources(tmp_path, kimi_profile, url: str, max_new_tokens: int = 2048) -> dict:
    return graph_resources(tmp_path / "data", kimi_profile.tokenizer, url, max_new_tokens=max_new_tokens)


_shard_with_most_prompts = shard_with_most_prompts


@pytest.fixture(scope="module")
def normal_sim():
    with start_simulator() as sim:
        yield sim


def test_full_graph_one_shard(tmp_path, kimi_profile, normal_sim):
    res = _resources(tmp_path, kimi_profile, normal_sim.url)
    data = tmp_path / "data"
    with dg.instance_for_test() as instance:
        ingest = materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res)
        assert ingest.ingest_success
        shard = _shard_with_most_prompts(data)
        out = materialize_graph(defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res)
        sh = out.shards[0]
        assert sh.success, sh
        assert sh.checks["tokenized_prompts:thinking_token_ends_prompt"] is True
        assert sh.checks["generations:think_end_present"] is True
        assert sh.materialized == ["generations", "tokenized_prompts", "training_samples"]
        # the runs are recorded on the instance, as the UI shows them
        assert instance.get_latest_materialization_event(dg.AssetKey("training_samples")) is not None
        # what a user reads in the UI: counts, throughput, a sample preview with the think-end position
        meta = instance.get_latest_materialization_event(dg.AssetKey("generations")).asset_materialization.metadata
        assert meta["succeeded"].value == meta["requested"].value > 0
        assert "163607" in meta["sample_preview"].value and "think-end" in meta["sample_preview"].value
        assert "reasoning_len" in meta["histograms"].value

    k = int(shard)
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == k)
    tok = pl.read_parquet(data / "tokenized_prompts" / f"shard={shard}" / "part-0000.parquet")
    gens = pl.read_parquet(data / "generations" / f"shard={shard}" / "part-*.parquet")
    train = pl.read_parquet(data / "training_samples" / f"shard={shard}" / "part-0000.parquet")

    assert tok.height == prompts.height > 0
    assert all(ids[-1] == KIMI_THINK_START for ids in tok["input_ids"].to_list())
    assert gens.height == tok.height and gens["sample_id"].n_unique() == gens.height
    assert all(KIMI_THINK_END in ids and ids[-1] == KIMI_IM_END for ids in gens["output_ids"].to_list())
    # every generated sample became a training row, and each row is prompt + output with the right mask
    assert train.height == gens.height
    by_prompt = {r["prompt_id"]: r["input_ids"] for r in tok.iter_rows(named=True)}
    by_sample = {r["sample_id"]: r["output_ids"] for r in gens.iter_rows(named=True)}
    for r in train.iter_rows(named=True):
        p, o = by_prompt[r["prompt_id"]], by_sample[r["sample_id"]]
        assert r["input_ids"] == p + o
        assert r["loss_mask"] == [0] * len(p) + [1] * len(o)
        assert r["prompt_len"] == len(p) and r["output_len"] == len(o)
    assert train.schema["input_ids"] == pl.List(pl.Int32) and train.schema["loss_mask"] == pl.List(pl.Int8)


def test_dropped_think_end_blocks_training_samples(tmp_path, kimi_profile):
    data = tmp_path / "data"
    with start_simulator(extra_args=["--mode", "drop-think-end"]) as sim:
        res = _resources(tmp_path, kimi_profile, sim.url)
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = _shard_with_most_prompts(data)
            out = materialize_graph(defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res)
            sh = out.shards[0]
            assert not sh.success
            assert sh.checks["tokenized_prompts:thinking_token_ends_prompt"] is True
            assert sh.checks["generations:think_end_present"] is False
            assert "training_samples" in sh.skipped_or_failed
            assert instance.get_latest_materialization_event(dg.AssetKey("training_samples")) is None

            # A later run that asks only for training_samples must still refuse this shard.
            again = dg.materialize(
                list(defs.assets),
                selection=["training_samples"],
                partition_key=shard,
                instance=instance,
                resources={**defs.resources, **res},
                raise_on_error=False,
            )
            assert not again.success
            assert instance.get_latest_materialization_event(dg.AssetKey("training_samples")) is None
    assert not (data / "training_samples" / f"shard={shard}").exists()
    gate = json.loads((data / "gates" / "generations" / f"shard={shard}.json").read_text())
    assert gate["success"] is False


def test_qwen3_profile_end_to_end(tmp_path, qwen_profile):
    """Another reasoning model by profile alone: Qwen3's prompt does not end with <think> (the model opens
    the block itself), its output does; the same gates pass on Qwen3-shaped output."""
    data = tmp_path / "data"
    args = ["--model", "qwen3", "--tokenizer", qwen_profile.tokenizer]
    with start_simulator(extra_args=args) as sim:
        res = {
            "pipeline": pipeline_resource(
                settings(), data_dir=str(data), model="qwen3", tokenizer=qwen_profile.tokenizer, max_new_tokens=2048
            ),
            "sglang": SGLangFleet(urls=sim.url),
        }
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = _shard_with_most_prompts(data)
            sh = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            assert sh.success, sh
            assert sh.checks["generations:think_end_present"] is True
    tok = pl.read_parquet(data / "tokenized_prompts" / f"shard={shard}" / "part-0000.parquet")
    gens = pl.read_parquet(data / "generations" / f"shard={shard}" / "part-*.parquet")
    assert all(ids[-1] != qwen_profile.think_start_id for ids in tok["input_ids"].to_list())
    assert all(
        ids[0] == qwen_profile.think_start_id and qwen_profile.think_end_id in ids
        for ids in gens["output_ids"].to_list()
    )
    train = pl.read_parquet(data / "training_samples" / f"shard={shard}" / "part-0000.parquet")
    assert train.height == gens.height
