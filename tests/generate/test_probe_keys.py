"""Probe sets are generated again for every drafter the fleet runs; training prompts are not.

Real simulator processes speculating with two different drafters (`--speculative-draft-model-path`),
real HTTP and Parquet: a probe prompt's cache key holds the fleet's drafter (generate/probes.py), so a
new drafter regenerates exactly the probe prompts, the same drafter finds them cached, the earlier
drafter's rows stay, and the per-drafter probe table (generate/probe_results.py) holds both.
"""

from __future__ import annotations

import hashlib
import json

import polars as pl
import pytest
from gen_helpers import free_port, make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.active import active_sample_ids
from eagle3_dagster.generate.config import sample_key
from eagle3_dagster.generate.probe_results import (
    drafter_versions,
    read_all_results,
    record_probe_results,
    stored_drafter_key,
)
from eagle3_dagster.generate.probes import ProbeKeys, fleet_drafter_key

N_TRAIN, N_PROBE = 8, 4
SPEC = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")


def _prompts() -> pl.DataFrame:
    train = make_prompts(N_TRAIN, seed=501)
    probe = make_prompts(N_PROBE, seed=502).with_columns(pl.lit("probe_set").alias("source"))
    return pl.concat([train, probe])


def _record(data, out, prompts, rep, config) -> None:
    probes = ProbeKeys(frozenset(config.probe_sources), rep.drafter_key, config.probe_seed)
    active = active_sample_ids(prompts, rep.model_revision, rep.sampling_hash, config.regen_seed, probes=probes)
    record_probe_results(data, 0, out, active, prompts, probes)


def test_a_training_key_is_unchanged_by_the_probe_part() -> None:
    blob = json.dumps(["p", "rev", "t", "h", None], separators=(",", ":"))
    assert sample_key("p", "rev", "t", "h", None) == hashlib.sha256(blob.encode()).hexdigest()[:32]
    assert sample_key("p", "rev", "t", "h", None, "eagle3-a") != sample_key("p", "rev", "t", "h", None, "eagle3-b")
    keys = ProbeKeys(frozenset({"probe_set"}), "eagle3-a", None)
    assert (keys.tag("probe_set"), keys.tag("unit"), keys.tag(None)) == ("eagle3-a", None, None)
    assert ProbeKeys(frozenset({"probe_set"}), "eagle3-a", 2).tag("probe_set") == "eagle3-a#2"
    assert fleet_drafter_key([None]) == "none" and fleet_drafter_key([]) == "none"


@pytest.mark.integration
def test_probe_prompts_are_regenerated_for_a_new_drafter_only(start_sim, tmp_path) -> None:
    prompts = _prompts()
    out, data = tmp_path / "gen", tmp_path / "data"
    sim_a = start_sim("--speculative-draft-model-path", "test/drafter-a", *SPEC)
    config_a = make_config(sim_a.url, probe_sources=("probe_set",))
    first = generate_shard(prompts, out, config_a)
    assert (first.succeeded, first.skipped_cached) == (N_TRAIN + N_PROBE, 0)
    _record(data, out, prompts, first, config_a)

    again = generate_shard(prompts, out, config_a)  # same drafter: everything is cached
    assert (again.succeeded, again.skipped_cached, again.drafter_key) == (0, N_TRAIN + N_PROBE, first.drafter_key)
    sim_a.kill()

    # the fleet is down and nothing is left to send: the probe prompts are keyed with the newest stored probe
    # drafter (as `eagle3 plan` keys them), so the shard never waits for the dead endpoint
    stored = stored_drafter_key(data)
    assert stored == first.drafter_key
    dead = make_config(
        f"http://127.0.0.1:{free_port()}",
        probe_sources=("probe_set",),
        stored_probe_drafter=stored,
        wait_for_endpoint_s=120.0,
    )
    blind = generate_shard(prompts, out, dead)
    assert (blind.requests_sent, blind.skipped_cached, blind.failed) == (0, N_TRAIN + N_PROBE, 0)
    assert (blind.drafter_key, blind.drafter_asked) == (first.drafter_key, False)  # assumed, and said so

    sim_b = start_sim("--speculative-draft-model-path", "test/drafter-b", *SPEC)
    config_b = make_config(sim_b.url, probe_sources=("probe_set",))
    second = generate_shard(prompts, out, config_b)  # a new drafter: only the probe prompts are sent
    assert second.drafter_key != first.drafter_key
    assert (second.succeeded, second.skipped_cached) == (N_PROBE, N_TRAIN)
    _record(data, out, prompts, second, config_b)

    gens = read_generations(out)
    probe_rows = gens.filter(pl.col("source") == "probe_set")
    assert probe_rows.height == 2 * N_PROBE  # the first drafter's rows are kept
    per_drafter = probe_rows.group_by("drafter_id").agg(pl.col("prompt_id").n_unique())
    assert sorted(per_drafter["prompt_id"].to_list()) == [N_PROBE, N_PROBE]
    assert set(per_drafter["drafter_id"]) == {first.drafter_key, second.drafter_key}
    train_rows = gens.filter(pl.col("source") == "unit")
    assert train_rows.height == N_TRAIN and set(train_rows["drafter_id"]) == {first.drafter_key}

    versions = drafter_versions(read_all_results(data))
    assert versions["drafter_id"].to_list() == [first.drafter_key, second.drafter_key]  # oldest first
    assert versions["draft_model_path"].to_list() == ["test/drafter-a", "test/drafter-b"]
    assert versions["n_probe_prompts"].to_list() == [N_PROBE, N_PROBE]
    for r in versions.iter_rows(named=True):
        mine = probe_rows.filter(pl.col("drafter_id") == r["drafter_id"])
        # one definition: Σ completion tokens / Σ verify steps, Σ correct / Σ proposed drafts
        assert r["accept_length"] == mine["completion_tokens"].sum() / mine["spec_verify_ct"].sum()
        assert r["accept_rate"] == mine["spec_num_correct_drafts"].sum() / mine["spec_num_proposed_drafts"].sum()
        assert (r["rows"], r["left_out"]) == (N_PROBE, 0) and r["first_seen"] <= r["last_seen"]


@pytest.mark.integration
def test_a_bumped_probe_seed_regenerates_the_probe_prompts_only(start_sim, tmp_path) -> None:
    prompts = _prompts()
    sim = start_sim("--speculative-draft-model-path", "test/drafter-a", *SPEC)
    first = generate_shard(prompts, tmp_path / "gen", make_config(sim.url, probe_sources=("probe_set",)))
    assert first.succeeded == N_TRAIN + N_PROBE
    bumped = generate_shard(prompts, tmp_path / "gen", make_config(sim.url, probe_sources=("probe_set",), probe_seed=1))
    assert (bumped.succeeded, bumped.skipped_cached) == (N_PROBE, N_TRAIN)
