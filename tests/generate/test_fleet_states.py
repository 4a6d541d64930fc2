"""Real fleets going wrong, at the client level against real simulator / router processes:
200 answers that are not results, dead and wrong URLs, stalled requests (streamed and not), NaN
finishes, weights changing mid-shard, old servers, server-side sampling defaults, a router with no
worker. Whole-graph versions: tests/pipeline/test_fleet_graph.py, tests/reliability/test_fault_matrix.py.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from gen_helpers import Sim, as_map, free_port, make_config, make_prompts, start_mini_router

from eagle3_dagster.generate import NoEndpointError, generate_shard, read_generation_errors, read_generations
from eagle3_dagster.generate.endpoint_info import EndpointRefusedError

pytestmark = pytest.mark.integration

N = 12


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(N, seed=141)


@pytest.fixture(scope="module")
def reference(shared_sim: Sim, prompts, tmp_path_factory) -> dict[str, list[int]]:
    shared_sim.faults(clear=True)
    out = tmp_path_factory.mktemp("ref") / "s"
    rep = generate_shard(prompts, out, make_config(shared_sim.url))
    assert rep.succeeded == N
    return as_map(read_generations(out))


def test_200_error_body_is_an_error_row_never_a_generation(clean_sim: Sim, prompts, reference, tmp_path: Path, caplog):
    caplog.set_level(logging.WARNING, logger="eagle3_dagster.generate")
    for stream in (True, False):
        out = tmp_path / f"s-{stream}"
        clean_sim.faults(error_body=3)
        rep = generate_shard(prompts, out, make_config(clean_sim.url, stream=stream))
        assert (rep.succeeded, rep.failed) == (N - 3, 3) and rep.reconciles, rep
        assert rep.errors_by_kind == {"server_error_body": 3} and rep.retried_by_kind == {}
        errs = read_generation_errors(out)
        assert errs.height == 3 and set(errs["reason"]) == {"server_error_body"}
        assert all("detokenizer timeout" in d for d in errs["detail"])  # the server's own message, kept
        assert read_generations(out).height == N - 3  # never in the generations table
        # recovery: a rerun sends exactly those 3 again; the table is then the clean run's
        rep2 = generate_shard(prompts, out, make_config(clean_sim.url, stream=stream))
        assert (rep2.skipped_cached, rep2.succeeded, rep2.failed) == (N - 3, 3, 0)
        assert as_map(read_generations(out)) == reference
    logged = [r.getMessage() for r in caplog.records if "without a result" in r.getMessage()]
    assert logged and "detokenizer timeout" in logged[0]


def test_dead_and_wrong_urls_are_named_at_once_then_the_wait_ends(start_sim, tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="eagle3_dagster.generate")
    html = start_sim()
    html.faults(html=True)  # some web server, not SGLang: 200 text/html for every path
    dead = f"http://127.0.0.1:{free_port()}"
    t0, wall0 = time.monotonic(), time.time()
    with pytest.raises(NoEndpointError) as ei:
        generate_shard(make_prompts(2), tmp_path / "s", make_config(dead, html.url, wait_for_endpoint_s=3.0))
    took = time.monotonic() - t0
    msg = str(ei.value)
    assert 3.0 <= took < 8, took  # one bounded wait
    assert f"{dead}: connection refused" in msg
    assert f"{html.url}: not an SGLang server: /model_info answered text/html" in msg
    waits = [(r.created, r.getMessage()) for r in caplog.records if r.getMessage().startswith("waiting for an SGLang")]
    assert waits and waits[0][0] - wall0 < 2.0, waits  # named within seconds, not after the wait
    assert "connection refused" in waits[0][1] and "text/html" in waits[0][1]
    assert html.requests() == 0


def test_stalled_requests_are_aborted_and_retried_with_a_new_rid(clean_sim: Sim, prompts, reference, tmp_path: Path):
    # streamed: the silence between chunks gives the stall away, however long generations are
    clean_sim.faults(stall=3, stall_after_tokens=4)
    before = clean_sim.stats()
    t0 = time.monotonic()
    # 3 s of silence: long enough that a healthy request on a busy machine is never taken for a stall
    # (the counts below are exact), short enough to show the default 300 s limit was not what ended it
    rep = generate_shard(
        prompts, tmp_path / "s", make_config(clean_sim.url, stream=True, stream_interval=2, stall_timeout_s=3.0)
    )
    took = time.monotonic() - t0
    after = clean_sim.stats()
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.retried_by_kind == {"stall": 3}, rep
    assert took < 30
    assert after["rids_repeated"] == before["rids_repeated"] and after["in_flight"] == 0  # aborted server-side
    assert as_map(read_generations(tmp_path / "s")) == reference
    # not streamed: only the (long on purpose) read timeout ends it; same data after the retry
    clean_sim.faults(stall=2, stall_after_tokens=4)
    rep = generate_shard(prompts, tmp_path / "n", make_config(clean_sim.url, stream=False, read_timeout_s=3.0))
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.retried_by_kind == {"read_timeout": 2}, rep
    assert as_map(read_generations(tmp_path / "n")) == reference


def test_nan_finishes_are_stored_as_violations(clean_sim: Sim, prompts, tmp_path: Path):
    clean_sim.faults(nan_finish=2)
    rep = generate_shard(prompts, tmp_path / "s", make_config(clean_sim.url))
    assert rep.succeeded == N and rep.nan_finishes == 2 and rep.integrity_violations == 2
    g = read_generations(tmp_path / "s")
    flagged = g.filter(g["integrity_violations"].list.len() > 0)
    assert flagged.height == 2 and all(v.to_list() == ["nan_happened"] for v in flagged["integrity_violations"])
    assert set(flagged["finish_matched"]) == {'"NaN happened"'}


def test_weights_changed_mid_shard_fail_the_affected_rows(clean_sim: Sim, tmp_path: Path):
    clean_sim.faults(slow_tokens_ms=2)
    prompts = make_prompts(24, seed=142)
    finished0 = sum(clean_sim.stats()["finished"].values())

    def flip() -> None:
        while sum(clean_sim.stats()["finished"].values()) - finished0 < 6:
            time.sleep(0.01)
        clean_sim.faults(weight_version="v2")

    t = threading.Thread(target=flip, daemon=True)
    t.start()
    rep = generate_shard(prompts, tmp_path / "s", make_config(clean_sim.url, max_in_flight=2))
    t.join(10)
    changed = rep.errors_by_kind.get("weight_version_changed", 0)
    assert rep.reconciles and changed >= 1 and rep.succeeded + changed == 24, rep
    g = read_generations(tmp_path / "s")
    assert g.height == rep.succeeded and set(g["model_revision"]) == {rep.model_revision}
    assert rep.model_revision.endswith("@default")
    # the rerun reads the new revision: new cache keys, every sample generated under v2
    rep2 = generate_shard(prompts, tmp_path / "s", make_config(clean_sim.url))
    assert rep2.model_revision.endswith("@v2") and rep2.succeeded == 24


def test_old_servers_and_server_side_sampling_defaults_are_refused(clean_sim: Sim, tmp_path: Path):
    clean_sim.faults(report_version="0.5.2")
    with pytest.raises(EndpointRefusedError, match=r"SGLang 0\.5\.2 is older than 0\.5\.9.*EAGLE3_ALLOW_OLD_SGLANG"):
        generate_shard(make_prompts(2), tmp_path / "a", make_config(clean_sim.url, wait_for_endpoint_s=30))
    rep = generate_shard(make_prompts(2), tmp_path / "b", make_config(clean_sim.url, allow_old_server=True))
    assert rep.succeeded == 2 and rep.server_versions == {clean_sim.url: "0.5.2"}

    clean_sim.faults(clear=True, preferred_sampling_params={"stop": ["\n\n"], "presence_penalty": 0.5})
    r0 = clean_sim.requests()
    with pytest.raises(EndpointRefusedError, match=r"preferred-sampling-params set stop=\['\\n\\n'\]"):
        generate_shard(make_prompts(2), tmp_path / "c", make_config(clean_sim.url, wait_for_endpoint_s=30))
    assert clean_sim.requests() == r0  # refused before anything was sent
    # a default for a field the client sends is overridden by every request: recorded, not refused
    clean_sim.faults(clear=True, preferred_sampling_params={"presence_penalty": 0.5})
    rep = generate_shard(make_prompts(2), tmp_path / "d", make_config(clean_sim.url))
    assert rep.succeeded == 2 and rep.preferred_sampling_params == {clean_sim.url: {"presence_penalty": 0.5}}


def test_router_without_workers_is_waited_for_without_spending_retries(
    clean_sim: Sim, prompts, reference, tmp_path: Path, caplog
):
    caplog.set_level(logging.INFO, logger="eagle3_dagster.generate")
    router, url = start_mini_router(clean_sim.url, "--start-empty")
    try:

        def add_worker() -> None:
            time.sleep(2.0)
            httpx.post(url + "/_router/workers", json={"urls": [clean_sim.url]}, timeout=5)

        t = threading.Thread(target=add_worker, daemon=True)
        t.start()
        rep = generate_shard(prompts, tmp_path / "s", make_config(url, max_in_flight=None, max_retries=0))
        t.join(5)
    finally:
        router.kill()
        router.wait()
    assert (rep.succeeded, rep.failed) == (N, 0), rep  # max_retries=0: no retry was spent on the wait
    assert any("router has no ready worker (/readiness 503)" in r.getMessage() for r in caplog.records)
    # the window comes from the router's worker list (1 worker x (64 + 128 headroom))
    assert rep.max_in_flight == N and rep.in_flight_source == "server_info"
    assert as_map(read_generations(tmp_path / "s")) == reference
