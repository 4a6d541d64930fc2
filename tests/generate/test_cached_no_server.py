"""A shard whose every request is stored needs no server: no wait, no contact (generate/cached_only.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gen_helpers import free_port, make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.endpoint_info import NoEndpointError

pytestmark = pytest.mark.integration


def test_a_fully_cached_shard_never_waits_for_a_dead_endpoint(tmp_path: Path, start_sim):
    prompts = make_prompts(12)
    out = tmp_path / "gen"
    sim = start_sim()
    first = generate_shard(prompts, out, make_config(sim.url))
    assert first.succeeded == 12
    stored = read_generations(out).sort("sample_id")
    sim.kill()

    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    again = generate_shard(prompts, out, make_config(dead, wait_for_endpoint_s=120.0))
    took = time.monotonic() - t0
    assert took < 30, f"waited {took:.0f}s for an endpoint although nothing was to be sent"
    assert (again.requested, again.skipped_cached, again.succeeded, again.failed) == (12, 12, 0, 0)
    assert again.model_revision == first.model_revision and again.sampling_hash == first.sampling_hash
    assert read_generations(out).sort("sample_id").equals(stored)  # nothing rewritten


def test_a_shard_with_one_new_prompt_still_asks_the_server(tmp_path: Path, start_sim):
    out = tmp_path / "gen"
    sim = start_sim()
    generate_shard(make_prompts(6), out, make_config(sim.url))
    sim.kill()
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(NoEndpointError, match=r"connection refused"):
        generate_shard(make_prompts(7), out, make_config(dead, wait_for_endpoint_s=1.0))


def test_a_shard_without_prompts_never_contacts_the_endpoint(tmp_path: Path):
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    rep = generate_shard(make_prompts(1).clear(), tmp_path / "gen", make_config(dead, wait_for_endpoint_s=120.0))
    assert time.monotonic() - t0 < 30
    assert (rep.requested, rep.succeeded, rep.failed) == (0, 0, 0)


def test_a_cached_shard_is_regenerated_when_the_answering_server_serves_new_weights(tmp_path: Path, start_sim):
    """The shortcut is for a dead endpoint only: a server that answers is asked for its revision, and a
    model updated in place (a new weight_version) makes every stored request stale."""
    prompts = make_prompts(8)
    out = tmp_path / "gen"
    sim = start_sim()
    first = generate_shard(prompts, out, make_config(sim.url))
    assert first.succeeded == 8
    sim.faults(weight_version="v2")
    again = generate_shard(prompts, out, make_config(sim.url))
    assert again.model_revision != first.model_revision and again.model_revision.endswith("@v2")
    assert (again.skipped_cached, again.succeeded) == (0, 8)
