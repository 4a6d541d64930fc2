"""The whole graph against a simulator whose outputs carry non-canonical token splits (text unchanged), as
a real sampler's do: every row stays in the token-level tables, the text exports flag or leave out the
rows whose text re-encodes to other ids, and the counts show in metadata, manifest and quality report."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts
from stream_reference import assert_training_shard_equals_whole_shard_build, small_stream_batches  # noqa: F401

from eagle3_dagster.definitions import defs
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.publish.export import CONVERSATIONS_FILE, PREFORMATTED_FILE, SPECFORGE_FILE
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("small_stream_batches")
def test_non_canonical_outputs_keep_every_row(tmp_path, kimi_profile, kimi_tokenizer):
    data = tmp_path / "data"
    with start_simulator(extra_args=["--noncanonical-rate", "0.6"]) as sim:
        res = graph_resources(data, kimi_profile.tokenizer, sim.url)
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)
            out = materialize_graph(
                defs,
                instance,
                scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
                resources=res,
            )
            assert out.success, out  # every gate passes: non-canonical output is valid output
            train_meta = instance.get_latest_materialization_event(
                dg.AssetKey("training_samples")
            ).asset_materialization.metadata
            snap_meta = instance.get_latest_materialization_event(
                dg.AssetKey("training_dataset")
            ).asset_materialization.metadata
        import httpx

        split = httpx.get(sim.url + "/_sim/stats", timeout=10).json()["noncanonical"]

    # the streamed training stage (tiny batches and sort buckets here) wrote what the whole-shard build writes
    assert_training_shard_equals_whole_shard_build(data, shard, res["pipeline"], train_meta, tmp_path)

    k = int(shard)
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == k)
    tok = pl.read_parquet(data / "tokenized_prompts" / f"shard={shard}" / "part-0000.parquet")
    gens = pl.read_parquet(data / "generations" / f"shard={shard}" / "part-*.parquet")
    train = pl.read_parquet(data / "training_samples" / f"shard={shard}" / "part-0000.parquet")

    # same prompts -> same row count as with canonical output: nothing was removed
    assert train.height == gens.height == tok.height == prompts.height > 0
    assert split["samples_split"] > 0
    flagged = train.filter(~pl.col("text_exact"))
    # exactly the samples the server split are flagged: the ids are not what encoding their text gives
    by_sample = {r["sample_id"]: r["output_ids"] for r in gens.iter_rows(named=True)}
    resplit = {
        sid
        for sid, ids in by_sample.items()
        if kimi_tokenizer.encode(kimi_tokenizer.decode(ids, skip_special_tokens=False), add_special_tokens=False) != ids
    }
    assert set(flagged["sample_id"].to_list()) == resplit and flagged.height == split["samples_split"]
    assert train.filter(pl.col("text_exact"))["text_mismatch_pos"].null_count() == train.height - flagged.height
    # token ids are sacred: the flagged rows hold the ids exactly as received, fully supervised
    by_prompt = {r["prompt_id"]: r["input_ids"] for r in tok.iter_rows(named=True)}
    for r in flagged.iter_rows(named=True):
        o = by_sample[r["sample_id"]]
        assert r["input_ids"] == by_prompt[r["prompt_id"]] + o and sum(r["loss_mask"]) == len(o)
        assert 0 <= r["text_mismatch_pos"] < len(o)
    assert (
        not (data / "training_samples" / f"shard={shard}" / "quarantine.parquet").exists()
        or pl.read_parquet(data / "training_samples" / f"shard={shard}" / "quarantine.parquet").height == 0
    )

    # materialization metadata
    assert train_meta["text_exact_false"].value == flagged.height
    assert train_meta["samples"].value == train.height
    assert snap_meta["rows_not_text_exact"].value == flagged.height

    # exports: token level keeps every row; conversations flag; preformatted leaves out, counted
    snap = data / "snapshots" / out.snapshot_version
    manifest = json.loads((snap / "manifest.json").read_text())["exports"]
    sf = [json.loads(x) for x in (snap / SPECFORGE_FILE).read_text().splitlines()]
    assert {r["id"] for r in sf} == set(train["sample_id"].to_list())
    ids_by_sample = dict(zip(train["sample_id"].to_list(), train["input_ids"].to_list()))
    assert all(r["input_ids"] == ids_by_sample[r["id"]] for r in sf)
    conv = [json.loads(x) for x in (snap / CONVERSATIONS_FILE).read_text().splitlines()]
    assert len(conv) == train.height
    assert {r["id"] for r in conv if r["text_exact"] is False} == set(flagged["sample_id"].to_list())
    pre = [json.loads(x) for x in (snap / PREFORMATTED_FILE).read_text().splitlines()]
    assert {r["id"] for r in pre} == set(train["sample_id"].to_list()) - set(flagged["sample_id"].to_list())
    assert manifest[SPECFORGE_FILE]["rows"] == train.height
    assert manifest[SPECFORGE_FILE]["rows_not_text_exact"] == flagged.height
    assert manifest[CONVERSATIONS_FILE]["rows_not_text_exact"] == flagged.height
    assert manifest[PREFORMATTED_FILE]["rows"] == len(pre) == manifest[PREFORMATTED_FILE]["specforge_exact_rows"]
    assert manifest[PREFORMATTED_FILE]["left_out_by_reason"] == {"not_text_exact": flagged.height}
    # every tool call in OpenAI's shape: arguments are JSON strings, in every turn
    calls = [c for r in conv for m in r["conversations"] for c in m.get("tool_calls") or []]
    assert calls and all(isinstance(c["function"]["arguments"], str) for c in calls)

    # the quality report shows the count
    report = (data / "reports" / "index.html").read_text()
    assert "not text-exact (training_samples)" in report and "non_canonical_tokenization" in report
