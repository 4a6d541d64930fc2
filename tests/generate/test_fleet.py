"""Several endpoints, health states, the circuit breaker, a router in front, the API key."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import polars as pl
import pytest
from gen_helpers import Sim, as_map, free_port, make_config, make_prompts

from eagle3_dagster.generate import AuthError, GenerationConfig, generate_shard, read_generation_errors, read_generations

pytestmark = pytest.mark.integration


def test_two_endpoints_share_the_load_by_least_outstanding(two_sims, tmp_path: Path):
    a, b = two_sims("--token-latency-ms", "1")
    prompts = make_prompts(40, seed=31)
    rep = generate_shard(prompts, tmp_path / "s", make_config(a.url, b.url, max_in_flight=8))
    assert rep.succeeded == 40
    ra, rb = a.stats()["requests"], b.stats()["requests"]
    assert ra + rb == 40 and min(ra, rb) >= 12  # both used, roughly evenly
    assert rep.per_endpoint[a.url]["succeeded"] == ra and rep.per_endpoint[b.url]["succeeded"] == rb
    assert read_generations(tmp_path / "s").height == 40


def test_draining_or_dead_endpoints_get_no_work(two_sims, tmp_path: Path):
    live, draining = two_sims()
    draining.faults(health="draining")  # /health 503: not routable
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    rep = generate_shard(make_prompts(12, seed=32), tmp_path / "s", make_config(dead, draining.url, live.url))
    assert rep.succeeded == 12 and rep.failed == 0
    assert draining.stats()["requests"] == 0
    assert rep.per_endpoint[live.url]["requests"] == 12
    assert rep.per_endpoint[draining.url]["health_503"] >= 1


def test_starting_endpoint_joins_when_healthy(two_sims, tmp_path: Path):
    a, b = two_sims("--token-latency-ms", "5")
    b.faults(health="starting")
    prompts = make_prompts(40, seed=33)
    cfg = make_config(a.url, b.url, max_in_flight=4)
    import threading

    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("rep", generate_shard(prompts, tmp_path / "s", cfg)))
    t.start()
    time.sleep(0.6)
    assert b.stats()["requests"] == 0
    b.faults(health="ok")
    t.join(60)
    assert box["rep"].succeeded == 40
    assert b.stats()["requests"] > 0  # probed back in while the shard was still running


def test_circuit_breaker_takes_a_failing_endpoint_out(two_sims, tmp_path: Path):
    good, bad = two_sims()
    bad.faults(reset_mid_body=10_000)  # answers /health 200 but every /generate dies mid-body
    prompts = make_prompts(40, seed=34)
    cfg = make_config(good.url, bad.url, max_in_flight=4, breaker_threshold=3, breaker_cooldown_s=30)
    rep = generate_shard(prompts, tmp_path / "s", cfg)
    assert (rep.succeeded, rep.failed) == (40, 0)
    assert rep.per_endpoint[bad.url]["circuit_opens"] == 1
    assert rep.per_endpoint[bad.url]["succeeded"] == 0
    # Out of rotation after 3 consecutive failures (plus the few already in flight then).
    assert bad.stats()["requests"] <= 3 + 4
    assert rep.retried_by_kind == {"reset": bad.stats()["requests"]}
    ref = as_map(read_generations(tmp_path / "s"))
    assert len(ref) == 40


def test_max_in_flight_from_server_info(start_sim, tmp_path: Path):
    sim = start_sim("--max-running-requests", "3")
    rep = generate_shard(make_prompts(20, seed=35), tmp_path / "s", make_config(sim.url, max_in_flight=None, in_flight_headroom=2))
    assert rep.max_in_flight == 5 and rep.succeeded == 20


def _start_router(worker: str, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = subprocess.Popen([sys.executable, str(Path(__file__).parent / "mini_router.py"), "--port", str(port),
                          "--worker", worker, *args])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/liveness", timeout=0.5)
            return p, url
        except httpx.HTTPError:
            time.sleep(0.05)
    p.kill()
    raise TimeoutError("router did not start")


def test_behind_a_router_refusals_are_retried(sim, tmp_path: Path):
    router, url = _start_router(sim.url, "--no-workers", "3", "--queue-full", "2", "--queue-timeout", "2")
    try:
        prompts = make_prompts(10, seed=36)
        rep = generate_shard(prompts, tmp_path / "s", make_config(url))
        rstats = httpx.get(url + "/_router/stats").json()
    finally:
        router.kill()
        router.wait()
    assert (rep.succeeded, rep.failed) == (10, 0)
    assert rep.retried_by_kind == {"http_503": 3, "http_429": 2, "http_408": 2}
    assert rstats["forwarded"] == 10  # one prompt per request, each forwarded once
    # The same ids as straight from the server (the router only dropped text-only keys).
    direct = generate_shard(prompts, tmp_path / "direct", make_config(sim.url))
    assert direct.succeeded == 10
    assert as_map(read_generations(tmp_path / "s")) == as_map(read_generations(tmp_path / "direct"))


SECRET = "sk-test-5f1c2a9e-do-not-log-me"


def test_api_key_is_sent_and_never_leaks(start_sim, tmp_path: Path, monkeypatch, caplog):
    sim = start_sim("--api-key-env", "SIM_TEST_KEY", env={"SIM_TEST_KEY": SECRET})
    sim.faults(reset_mid_body=2, queue_full_burst=2)
    monkeypatch.setenv("SGLANG_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    cfg = make_config(sim.url)
    prompts = make_prompts(6, seed=37)
    long_ids = list(range(1000, 1010)) * 30000  # too long for the context: a 400 with the server's text
    prompts = pl.concat([prompts, make_prompts(1, seed=38).with_columns(pl.Series("input_ids", [long_ids], dtype=pl.List(pl.Int32)))])
    rep = generate_shard(prompts, tmp_path / "s", cfg)
    assert (rep.succeeded, rep.failed) == (6, 1)
    assert rep.retried_by_kind == {"reset": 2, "http_503": 2}

    # Without the key, the server refuses: the run fails loudly, without the key in the message.
    monkeypatch.setenv("SGLANG_API_KEY", "wrong-" + SECRET[::-1])
    with pytest.raises(AuthError) as ei:
        generate_shard(prompts, tmp_path / "s2", cfg)
    monkeypatch.delenv("SGLANG_API_KEY")
    with pytest.raises(AuthError):
        generate_shard(prompts, tmp_path / "s3", cfg)

    texts = [repr(cfg), str(cfg), json.dumps(rep.as_metadata()), repr(rep), str(ei.value), repr(ei.value)]
    for rec in caplog.records:
        texts.append(rec.getMessage())
        if rec.exc_info:
            texts.append(logging.Formatter().formatException(rec.exc_info))
    texts.append(read_generation_errors(tmp_path / "s").write_json())
    texts.append(read_generations(tmp_path / "s").drop("output_ids").write_json())
    assert texts and not any(SECRET in t or SECRET[::-1] in t for t in texts)
    assert SECRET not in {str(getattr(cfg, f)) for f in GenerationConfig.__dataclass_fields__}


def test_progress_reports_during_the_run(start_sim, tmp_path: Path):
    sim = start_sim("--token-latency-ms", "10")
    seen = []
    rep = generate_shard(make_prompts(16, seed=39), tmp_path / "s", make_config(sim.url, max_in_flight=4),
                         progress=seen.append, progress_every_s=0.1)
    assert len(seen) >= 4  # ~1 s of work, a report every 0.1 s
    assert all(p.total == 16 for p in seen)
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    mid = [p for p in seen if 0 < p.done < 16]
    assert mid and all(p.samples_per_s > 0 and p.eta_s is not None and p.eta_s > 0 for p in mid)
    assert seen[-1].done == 16 and seen[-1].output_tokens_per_s > 0
    md = rep.as_metadata()
    for k in ("samples_per_s", "output_tokens_per_s", "latency_p50", "latency_p90", "latency_p99", "finish_reasons",
              "cached_tokens_ratio", "per_endpoint", "retried_by_kind"):
        assert k in md
    assert 0 < md["latency_p50"] <= md["latency_p90"] <= md["latency_p99"]
    json.dumps(md)
