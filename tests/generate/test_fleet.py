"""Several endpoints, health states, the circuit breaker, a router in front, the API key."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import polars as pl
import pytest
from gen_helpers import Sim, as_map, free_port, make_config, make_prompts, start_mini_router

from eagle3_dagster.config import Settings
from eagle3_dagster.generate import (
    AuthError,
    GenerationConfig,
    ModelRevisionError,
    generate_shard,
    read_generation_errors,
    read_generations,
)
from eagle3_dagster.generate.endpoint_info import display_url
from eagle3_dagster.secret import Secret

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[tuple[Sim, Sim]]:
    """Two simulators shared by this module's fleet tests (started in parallel; faults cleared per test)."""
    a = Sim(log_path=tmp_path_factory.mktemp("sim-a") / "sim.log", wait=False)
    b = Sim(log_path=tmp_path_factory.mktemp("sim-b") / "sim.log", wait=False)
    a.wait_ready()
    b.wait_ready()
    yield a, b
    a.kill()
    b.kill()


@pytest.fixture
def sims(pair: tuple[Sim, Sim]) -> tuple[Sim, Sim]:
    for s in pair:
        s.faults(clear=True, health="ok")
    return pair


def _requests(s: Sim) -> int:
    return s.stats()["requests"]


def test_two_endpoints_share_the_load_by_least_outstanding(sims, tmp_path: Path):
    a, b = sims
    for s in sims:
        s.faults(slow_tokens_ms=1)
    a0, b0 = _requests(a), _requests(b)
    prompts = make_prompts(40, seed=31)
    rep = generate_shard(prompts, tmp_path / "s", make_config(a.url, b.url, max_in_flight=8))
    assert rep.succeeded == 40
    ra, rb = _requests(a) - a0, _requests(b) - b0
    assert ra + rb == 40 and min(ra, rb) >= 12  # both used, roughly evenly
    assert rep.per_endpoint[a.url]["succeeded"] == ra and rep.per_endpoint[b.url]["succeeded"] == rb
    assert read_generations(tmp_path / "s").height == 40


def test_draining_or_dead_endpoints_get_no_work(sims, tmp_path: Path):
    live, draining = sims
    draining.faults(health="draining")  # /health 503: not routable
    d0 = _requests(draining)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    rep = generate_shard(make_prompts(12, seed=32), tmp_path / "s", make_config(dead, draining.url, live.url))
    assert rep.succeeded == 12 and rep.failed == 0
    assert _requests(draining) == d0
    assert rep.per_endpoint[live.url]["requests"] == 12
    assert rep.per_endpoint[draining.url]["health_503"] >= 1


def test_starting_endpoint_joins_when_healthy(sims, tmp_path: Path):
    a, b = sims
    for s in sims:
        s.faults(slow_tokens_ms=5)
    b.faults(health="starting")
    b0 = _requests(b)
    prompts = make_prompts(40, seed=33)
    cfg = make_config(a.url, b.url, max_in_flight=4)
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("rep", generate_shard(prompts, tmp_path / "s", cfg)))
    t.start()
    time.sleep(0.6)
    assert _requests(b) == b0
    b.faults(health="ok")
    t.join(60)
    assert box["rep"].succeeded == 40
    assert _requests(b) > b0  # probed back in while the shard was still running


def test_circuit_breaker_takes_a_failing_endpoint_out(sims, tmp_path: Path):
    good, bad = sims
    bad.faults(reset_mid_body=10_000)  # answers /health 200 but every /generate dies mid-body
    bad0 = _requests(bad)
    prompts = make_prompts(40, seed=34)
    cfg = make_config(good.url, bad.url, max_in_flight=4, breaker_threshold=3, breaker_cooldown_s=30)
    rep = generate_shard(prompts, tmp_path / "s", cfg)
    bad_n = _requests(bad) - bad0
    assert (rep.succeeded, rep.failed) == (40, 0)
    assert rep.per_endpoint[bad.url]["circuit_opens"] == 1
    assert rep.per_endpoint[bad.url]["succeeded"] == 0
    # Out of rotation after 3 consecutive failures (plus the few already in flight then).
    assert 3 <= bad_n <= 3 + 4
    assert rep.retried_by_kind == {"reset": bad_n}
    # Every sample came from the healthy server, exactly as it answers directly.
    good_only = generate_shard(prompts, tmp_path / "ref", make_config(good.url))
    assert good_only.succeeded == 40
    assert as_map(read_generations(tmp_path / "s")) == as_map(read_generations(tmp_path / "ref"))


def test_an_endpoint_that_cuts_every_stream_is_taken_out_by_the_circuit(sims, tmp_path: Path, caplog):
    """Streams that end cleanly without [DONE] (a gateway that lost the stream upstream and closes its side as a
    normal end) count against the circuit like a body cut without streaming: the endpoint leaves the rotation."""
    good, bad = sims
    bad.faults(cut_stream=10_000)  # /health 200, every stream ends after its first chunk, no [DONE]
    bad0, cut0 = _requests(bad), bad.stats()["faults_injected"].get("cut_stream", 0)
    prompts = make_prompts(40, seed=35)
    cfg = make_config(good.url, bad.url, stream=True, max_in_flight=4, breaker_threshold=3, breaker_cooldown_s=30)
    caplog.set_level(logging.WARNING, logger="eagle3_dagster.generate.endpoints")
    rep = generate_shard(prompts, tmp_path / "s", cfg)
    bad_n = _requests(bad) - bad0
    assert bad.stats()["faults_injected"]["cut_stream"] - cut0 == bad_n  # every request there was cut
    rows, errors = read_generations(tmp_path / "s"), read_generation_errors(tmp_path / "s")
    assert (rep.succeeded, rep.failed, rows.height, errors.height) == (40, 0, 40, 0)  # in = out + errors
    assert sorted(rows["prompt_id"].to_list()) == sorted(prompts["prompt_id"].to_list())  # each row exactly once
    assert rep.per_endpoint[bad.url]["circuit_opens"] == 1 and rep.per_endpoint[bad.url]["succeeded"] == 0
    opened = [r.getMessage() for r in caplog.records if "out of rotation" in r.getMessage()]
    assert opened and all(display_url(bad.url) in m and "3 times in a row" in m for m in opened), opened
    # Out of rotation after 3 consecutive cuts (plus the few already in flight then), not a share of every row.
    assert 3 <= bad_n <= 3 + 4
    assert rep.retried_by_kind == {"reset": bad_n}
    assert rep.per_endpoint[good.url]["succeeded"] == 40


def test_max_in_flight_from_server_info(start_sim, tmp_path: Path):
    sim = start_sim("--max-running-requests", "3")
    rep = generate_shard(
        make_prompts(20, seed=35), tmp_path / "s", make_config(sim.url, max_in_flight=None, in_flight_headroom=2)
    )
    assert rep.max_in_flight == 5 and rep.succeeded == 20
    assert rep.http_pools == 1


def test_workers_are_spread_over_small_connection_pools(clean_sim, tmp_path: Path):
    # httpcore scans its whole pool per request: 20 workers at 8 a pool -> 3 pools (bench/generate.py).
    rep = generate_shard(make_prompts(30, seed=41), tmp_path / "s", make_config(clean_sim.url, max_in_flight=20))
    assert (rep.max_in_flight, rep.http_pools, rep.succeeded) == (20, 3, 30)


def test_behind_a_router_refusals_are_retried(clean_sim, tmp_path: Path):
    sim = clean_sim
    router, url = start_mini_router(sim.url, "--no-workers", "3", "--queue-full", "2", "--queue-timeout", "2")
    try:
        prompts = make_prompts(10, seed=36)
        rep = generate_shard(prompts, tmp_path / "s", make_config(url))
        rstats = httpx.get(url + "/_router/stats").json()
    finally:
        router.kill()
        router.wait()
    assert (rep.succeeded, rep.failed) == (10, 0)
    # 503 "No available workers" is the router having nothing to route to: the samples wait for it
    # without spending their retries (counted apart); 429/408 are the router's queue: retried.
    assert rep.retried_by_kind == {"no_available_workers": 3, "http_429": 2, "http_408": 2}
    assert rstats["forwarded"] == 10  # one prompt per request, each forwarded once
    # The same ids as straight from the server (the router only dropped text-only keys).
    direct = generate_shard(prompts, tmp_path / "direct", make_config(sim.url))
    assert direct.succeeded == 10
    assert as_map(read_generations(tmp_path / "s")) == as_map(read_generations(tmp_path / "direct"))


SECRET = "sk-test-5f1c2a9e-do-not-log-me"


def test_api_key_is_sent_and_never_leaks(start_sim, tmp_path: Path, monkeypatch, caplog):
    sim = start_sim("--api-key-env", "SIM_TEST_KEY", env={"SIM_TEST_KEY": SECRET})
    sim.faults(reset_mid_body=2, queue_full_burst=2)
    caplog.set_level(logging.DEBUG)
    # the settings layer reads SGLANG_API_KEY and hands it over as a Secret (generate.config.deployment_fields)
    key = Settings.from_env({"SGLANG_API_KEY": SECRET}).fleet.api_key
    assert key is not None and SECRET not in repr(key) + str(key) + f"{key}"
    cfg = make_config(sim.url, api_key=key)
    prompts = make_prompts(6, seed=37)
    long_ids = list(range(1000, 1010)) * 30000  # too long for the context: a 400 with the server's text
    prompts = pl.concat(
        [prompts, make_prompts(1, seed=38).with_columns(pl.Series("input_ids", [long_ids], dtype=pl.List(pl.Int32)))]
    )
    rep = generate_shard(prompts, tmp_path / "s", cfg)
    assert (rep.succeeded, rep.failed) == (6, 1)
    assert rep.retried_by_kind == {"reset": 2, "http_503": 2}

    # Without the key, the server refuses: the run fails loudly, without the key in the message.
    with pytest.raises(AuthError) as ei:
        generate_shard(prompts, tmp_path / "s2", cfg.with_(api_key=Secret("wrong-" + SECRET[::-1])))
    with pytest.raises(AuthError):
        generate_shard(prompts, tmp_path / "s3", cfg.with_(api_key=None))

    texts = [repr(cfg), str(cfg), json.dumps(rep.as_metadata()), repr(rep), str(ei.value), repr(ei.value)]
    for rec in caplog.records:
        texts.append(rec.getMessage())
        if rec.exc_info:
            texts.append(logging.Formatter().formatException(rec.exc_info))
    texts.append(read_generation_errors(tmp_path / "s").write_json())
    texts.append(read_generations(tmp_path / "s").drop("output_ids").write_json())
    assert texts and not any(SECRET in t or SECRET[::-1] in t for t in texts)
    assert SECRET not in {str(getattr(cfg, f)) for f in GenerationConfig.__dataclass_fields__}


def test_progress_reports_during_the_run(clean_sim, tmp_path: Path):
    sim = clean_sim
    sim.faults(slow_tokens_ms=10)
    seen = []
    # flush_every_n is never reached: chunks are written on the timer (flush_every_s) during the run.
    cfg = make_config(sim.url, max_in_flight=4, flush_every_n=1000, flush_every_s=0.2)
    rep = generate_shard(make_prompts(16, seed=39), tmp_path / "s", cfg, progress=seen.append, progress_every_s=0.1)
    sim.faults(clear=True)
    assert rep.chunks_written >= 3 and read_generations(tmp_path / "s").height == 16
    assert len(seen) >= 4  # ~1 s of work, a report every 0.1 s
    assert all(p.total == 16 for p in seen)
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    mid = [p for p in seen if 0 < p.done < 16]
    assert mid and all(p.samples_per_s > 0 and p.eta_s is not None and p.eta_s > 0 for p in mid)
    assert seen[-1].done == 16 and seen[-1].output_tokens_per_s > 0
    md = rep.as_metadata()
    for k in (
        "samples_per_s",
        "output_tokens_per_s",
        "latency_p50",
        "latency_p90",
        "latency_p99",
        "finish_reasons",
        "cached_tokens_ratio",
        "per_endpoint",
        "retried_by_kind",
    ):
        assert k in md
    assert 0 < md["latency_p50"] <= md["latency_p90"] <= md["latency_p99"]
    json.dumps(md)


def test_endpoints_serving_different_weights_are_refused(sims, start_sim, tmp_path: Path):
    a, _ = sims
    other = start_sim("--model-path", "moonshotai/Kimi-K2.5-other")
    a0 = _requests(a)
    with pytest.raises(ModelRevisionError, match="different model revisions"):
        generate_shard(make_prompts(4, seed=40), tmp_path / "s", make_config(a.url, other.url))
    assert _requests(a) == a0 and other.stats()["requests"] == 0
    # Pinning the revision is the explicit way to run anyway.
    rep = generate_shard(
        make_prompts(4, seed=40), tmp_path / "s", make_config(a.url, other.url, model_revision="pinned@1")
    )
    assert rep.succeeded == 4 and rep.model_revision == "pinned@1"
