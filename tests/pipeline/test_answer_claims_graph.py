"""A gateway that truncates a prompt, through the real shard graph on a real Dagster instance: the run is
loud (the request_failure_budget check fails naming prompt_tokens_mismatch, an ERROR line names the
field and the counts), the answer is never stored or built into training samples, and once the gateway
stops lying the same graph run heals the shard. It used to be stored and published with SUCCESS.
"""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts
from sim_ctl import Sim

from eagle3_dagster.definitions import defs
from eagle3_dagster.generate import read_generation_errors, read_generations
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = Sim(log_path=tmp_path_factory.mktemp("sim") / "sim.log")
    yield s
    s.kill()


def test_a_truncated_prompt_makes_the_run_loud_and_is_never_published(tmp_path, kimi_profile, sim):
    data = tmp_path / "data"
    sim.faults(clear=True)
    res = graph_resources(data, kimi_profile.tokenizer, sim.url)
    with dg.instance_for_test() as instance:
        assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
        shard = shard_with_most_prompts(data)
        n = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == int(shard)).height
        gen_dir = data / "generations" / f"shard={shard}"
        sim.faults(truncate_prompt=1)  # the first request's prompt loses its first 2 ids on the way
        sh = materialize_graph(
            defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
        ).shards[0]
        assert sim.stats()["faults_injected"].get("truncate_prompt") == 1
        assert not sh.ok and sh.failed_checks.get("generations:request_failure_budget") == "ERROR", sh
        errs = read_generation_errors(gen_dir)
        assert errs.height == 1 and errs["reason"].to_list() == ["prompt_tokens_mismatch"]
        bad = errs["sample_id"][0]
        gens = read_generations(gen_dir)
        assert gens.height == n - 1 and bad not in set(gens["sample_id"])
        train = data / "training_samples" / f"shard={shard}" / "part-0000.parquet"
        if train.exists():
            assert bad not in set(pl.read_parquet(train, columns=["sample_id"])["sample_id"])
        logs = [r.user_message for r in instance.all_logs(sh.run_id) if not r.dagster_event]
        assert any("prompt_tokens_mismatch" in m and "meta_info.prompt_tokens is" in m for m in logs)
        meta = instance.get_latest_materialization_event(dg.AssetKey("generations")).asset_materialization.metadata
        assert (meta["succeeded"].value, meta["failed"].value, meta["reconciles"].value) == (n - 1, 1, True)

        sim.faults(clear=True)  # the gateway is fixed: the same run again sends that sample only
        again = materialize_graph(
            defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
        ).shards[0]
        assert again.ok, again
        assert read_generations(gen_dir).height == n and read_generation_errors(gen_dir).height == 0


def test_a_server_of_another_model_fails_the_run_naming_both_and_nothing_is_generated(tmp_path, kimi_profile, sim):
    """A server whose /model_info says Qwen3-8B under the kimi-k2.5 profile (its answers would pass the token
    gates of a model sharing the tokenizer): the generations step fails at once, not retried, naming what the
    endpoint serves and what the profile expects; not one request is sent. It used to run with SUCCESS."""
    data = tmp_path / "data"
    sim.faults(clear=True)
    res = graph_resources(data, kimi_profile.tokenizer, sim.url)
    try:
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)
            sim.faults(claimed_model={"model_path": "Qwen/Qwen3-8B", "model_type": "qwen3"})
            before = sim.requests()
            sh = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            assert not sh.success and "generations" in sh.skipped_or_failed, sh
            (error,) = [e for e in sh.errors if e.startswith("generations")]
            for text in ("serves another model", "'Qwen/Qwen3-8B'", "'qwen3'", "kimi-k2.5", "'kimi_k25'"):
                assert text in error, error
            assert sim.requests() == before
            assert read_generations(data / "generations" / f"shard={shard}").height == 0
            attempts = [
                e
                for e in instance.all_logs(sh.run_id)
                if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"
            ]
            assert len([e for e in attempts if e.step_key == "generations"]) == 1  # not retried
    finally:
        sim.faults(clear=True)
