"""The real sglang-router (PyPI `sglang-router`, a Rust binary) in front of two simulator workers.

Facts these tests rest on are in docs/sglang-router.md: the router's /get_server_info is a stub, so
the client cannot read the workers' stream mode from it; a dead worker answers 500
call_upstream_request_error through the router until its health check notices.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from gen_helpers import Sim, as_map, make_config, make_prompts
from real_router import start_real_router

from eagle3_dagster.generate import endpoints, generate_shard, read_generations
from eagle3_dagster.orchestration.run import GraphScope

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("sglang_router") is None,
        reason="sglang_router is not installed (pip install -e '.[router]'): the real router cannot be started",
    ),
]

N = 24


@pytest.fixture
def router(tmp_path: Path, start_sim: Callable[..., Sim]) -> Iterator[Callable[..., tuple[str, list[Sim]]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def _router(*worker_args: str) -> tuple[str, list[Sim]]:
        sims = [start_sim(*worker_args), start_sim(*worker_args)]
        p, url = start_real_router([s.url for s in sims], tmp_path / f"router-{len(procs)}.log")
        procs.append(p)
        return url, sims

    yield _router
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(N, seed=300)


def _direct(sim: Sim, prompts, out: Path, **cfg) -> dict[str, list[int]]:
    rep = generate_shard(prompts, out, make_config(sim.url, **cfg))
    assert (rep.succeeded, rep.failed) == (N, 0), rep
    return as_map(read_generations(out))


@pytest.mark.parametrize("stream", [False, True])
def test_generation_through_the_router_equals_a_direct_run(router, prompts, tmp_path: Path, stream: bool):
    url, sims = router()
    reference = _direct(sims[0], prompts, tmp_path / "direct", stream=stream)
    rep = generate_shard(prompts, tmp_path / "via", make_config(url, stream=stream))
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.reconciles, rep
    assert as_map(read_generations(tmp_path / "via")) == reference
    # the router spread the work: both workers generated
    assert all(s.requests() > 0 for s in sims), [s.requests() for s in sims]


def test_incremental_streaming_workers_behind_the_router_give_complete_rows(router, prompts, tmp_path: Path, caplog):
    url, sims = router("--incremental-streaming-output")
    # the router's own /get_server_info says nothing of the stream mode (docs/sglang-router.md)
    assert "incremental_streaming_output" not in httpx.get(url + "/get_server_info", timeout=5).text
    reference = _direct(sims[0], prompts, tmp_path / "direct", stream=False)
    rep = generate_shard(prompts, tmp_path / "via", make_config(url, stream=True, stream_interval=1))
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.reconciles, rep
    got = read_generations(tmp_path / "via")
    assert as_map(got) == reference  # every row whole: not the last delta chunk alone
    assert all(len(ids) > 1 for ids in got["output_ids"].to_list())


@pytest.mark.parametrize("worker_args", [(), ("--incremental-streaming-output",)], ids=["cumulative", "delta"])
def test_stream_mode_told_from_the_chunks_when_no_server_says_it(
    router, prompts, tmp_path: Path, monkeypatch, caplog, worker_args: tuple[str, ...]
):
    """Workers whose /server_info is out of reach (another network than the router's): each stream tells."""
    url, sims = router(*worker_args)
    reference = _direct(sims[0], prompts, tmp_path / "direct", stream=False)
    monkeypatch.setattr(endpoints, "stream_mode_of", lambda info: None)  # no /server_info says the mode
    caplog.set_level(logging.WARNING, logger="eagle3_dagster.generate")
    rep = generate_shard(prompts, tmp_path / "via", make_config(url, stream=True, stream_interval=1))
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.reconciles, rep
    assert as_map(read_generations(tmp_path / "via")) == reference
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "stream mode of its workers not known" in said
    assert ("streams delta output_ids" in said) == bool(worker_args)


def test_a_worker_sigkilled_mid_shard_loses_and_duplicates_nothing(router, tmp_path: Path):
    n = 48
    prompts = make_prompts(n, seed=301)
    url, sims = router("--token-latency-ms", "8")
    victim = sims[0]
    killed = threading.Event()

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and victim.requests() < 4:
            time.sleep(0.02)
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed.set()

    t = threading.Thread(target=kill_when_busy, daemon=True)
    t.start()
    rep = generate_shard(prompts, tmp_path / "via", make_config(url, stream=True, max_in_flight=8))
    t.join(5)
    assert killed.is_set()
    assert (rep.succeeded, rep.failed) == (n, 0) and rep.reconciles, rep
    assert sum(rep.retried_by_kind.values()) > 0, rep  # the kill was felt: its in-flight requests went again
    got = read_generations(tmp_path / "via")
    assert got.height == n and got["sample_id"].n_unique() == n
    # the same ids a direct run on the surviving worker gives
    direct = generate_shard(prompts, tmp_path / "direct", make_config(sims[1].url))
    assert direct.succeeded == n
    assert as_map(got) == as_map(read_generations(tmp_path / "direct"))


def test_a_dead_first_worker_is_named_in_the_routers_words_and_worked_around(router, tmp_path: Path, caplog):
    """The router's /get_model_info goes to its first listed worker; dead, that is a 500 naming it (not a 404)
    until the router's health check (every 60 s, 3 failures) notices. The client reads what the router serves
    from the live worker in /workers instead of waiting those minutes, and the shard completes."""
    n = 200  # more than the window, so the window is what runs at once
    prompts = make_prompts(n, seed=302)
    url, sims = router()
    first = httpx.get(url + "/workers", timeout=5).json()["workers"][0]["url"].rstrip("/")
    dead = next(s for s in sims if s.url == first)
    live = next(s for s in sims if s.url != first)
    dead.kill()  # SIGKILL
    r = httpx.get(url + "/get_model_info", timeout=5)
    assert r.status_code == 500 and "call_upstream_request_error" in r.text and first in r.text  # the router's view
    caplog.set_level(logging.INFO, logger="eagle3_dagster.generate")
    t0 = time.monotonic()
    rep = generate_shard(
        prompts, tmp_path / "via", make_config(url, wait_for_endpoint_s=30.0, max_in_flight=None, in_flight_headroom=0)
    )
    took = time.monotonic() - t0
    assert (rep.succeeded, rep.failed) == (n, 0) and rep.reconciles, rep
    assert took < 30, took  # not the router's 3 x 60 s
    # the in-flight window: the dead worker counts as much as the live one (not 0, which halved it)
    cap = httpx.get(live.url + "/server_info", timeout=5).json()["max_running_requests"]
    assert rep.in_flight_source == "server_info" and rep.max_in_flight == 2 * cap, rep.max_in_flight
    assert any(
        f"2 worker(s), max_running_requests {2 * cap} in total (1 not reachable" in r.getMessage()
        for r in caplog.records
    )
    got = read_generations(tmp_path / "via")
    assert got.height == n and got["sample_id"].n_unique() == n
    said = [r.getMessage() for r in caplog.records]
    [why] = [m for m in said if "read what it serves from its worker" in m]
    assert "/get_model_info answered 500" in why and "call_upstream_request_error" in why and first in why, why
    assert live.url in why.split("from its worker", 1)[1]
    assert not any("/model_info answered 404" in m for m in said)
    direct = generate_shard(prompts, tmp_path / "direct", make_config(live.url))
    assert direct.succeeded == n and as_map(got) == as_map(read_generations(tmp_path / "direct"))


def test_a_stall_through_the_router_is_retried_and_its_refused_abort_is_logged(router, prompts, tmp_path: Path, caplog):
    url, sims = router()
    reference = _direct(sims[0], prompts, tmp_path / "direct", stream=False)
    for s in sims:
        s.faults(stall=1, stall_after_tokens=4)
    caplog.set_level(logging.WARNING, logger="eagle3_dagster.generate")
    rep = generate_shard(
        prompts, tmp_path / "via", make_config(url, stream=True, stream_interval=2, stall_timeout_s=3.0)
    )
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.reconciles, rep
    assert rep.retried_by_kind.get("stall", 0) >= 1, rep
    assert as_map(read_generations(tmp_path / "via")) == reference
    # the abort went out (in the background) while the retry ran: the router has no /abort_request
    assert any("/abort_request answered 404" in r.getMessage() for r in caplog.records)


def _generation_step(instance, run_id: str) -> tuple[float, str]:
    """(seconds from STEP_START to STEP_FAILURE, the failure's message) of a run's failed generations step."""
    events = [e for e in instance.all_logs(run_id) if e.step_key == "generations" and e.dagster_event]
    kinds = {e.dagster_event.event_type_value: e for e in events}
    assert "STEP_UP_FOR_RETRY" not in kinds, [e.dagster_event.event_type_value for e in events]
    failure = kinds["STEP_FAILURE"]
    return failure.timestamp - kinds["STEP_START"].timestamp, failure.dagster_event.step_failure_data.error.message


def test_no_worker_alive_one_endpoint_wait_per_graph_run_not_per_shard(router, tmp_path: Path, kimi_profile):
    """Both workers SIGKILLed: the first shard waits its bounded wait and fails naming the router and its 500;
    the run's other shards fail at once with the same line (a real Dagster graph run of three shards)."""
    import dagster as dg
    from graph_helpers import graph_resources

    from eagle3_dagster.definitions import defs
    from eagle3_dagster.orchestration.run import materialize_graph

    url, sims = router()
    for s in sims:
        s.kill()
    wait_s = 4.0
    data = tmp_path / "data"
    res = graph_resources(data, kimi_profile.tokenizer, url, wait_for_endpoint_s=wait_s)
    shards = ["0000", "0001", "0002"]
    with dg.instance_for_test() as instance:
        outcome = materialize_graph(defs, instance, scope=GraphScope(shards=shards), resources=res)
        assert outcome.ingest_success and [s.shard for s in outcome.shards] == shards
        steps = [_generation_step(instance, s.run_id) for s in outcome.shards]
    assert all(not s.success and "generations" in s.skipped_or_failed for s in outcome.shards)
    (first_s, first), *rest = steps
    line = first.split("NoEndpointError: ", 1)[1].strip()
    # the router's own answer: its health check (every 60 s) has not noticed, it proxies to a dead worker
    assert line.startswith(f"no routable SGLang endpoint after {wait_s:.0f}s"), first
    assert url in line and "/get_model_info answered 500" in line and "call_upstream_request_error" in line, line
    assert first_s >= wait_s, steps
    for took, said in rest:
        assert line in said and "not waited again" in said, said
        assert took < wait_s / 2, steps  # no second wait
    # the record is the run's (a new graph run waits afresh): one file, holding the line
    [record] = list((data / "runs").glob("*/endpoint-wait.txt"))
    assert record.read_text().strip() == line
