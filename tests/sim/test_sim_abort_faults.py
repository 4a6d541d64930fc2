"""Aborts, runtime fault injection, the emulated GPU (slots, latency, busy time) and lifecycle."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sim_helpers import QWEN_ARGS, faults, gen, sse_events, stats

from eagle3_dagster.sim.process import SimulatorError, start_simulator

P = [2000 + i for i in range(16)]


def _later(fn, delay: float) -> threading.Timer:
    t = threading.Timer(delay, fn)
    t.start()
    return t


def _wait_in_flight(s, n: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while stats(s)["in_flight"] < n:
        assert time.monotonic() < deadline, "requests never became in-flight"
        time.sleep(0.02)


def test_abort_running_request_returns_partial_output(sim):
    faults(sim, slow_tokens_ms=20)
    full = None
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(
            gen,
            sim,
            {"input_ids": P, "rid": "abort-me", "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}},
        )
        _wait_in_flight(sim, 1)
        time.sleep(0.3)
        assert httpx.post(sim.url + "/abort_request", json={"rid": "abort-me"}).status_code == 200
        r = fut.result(timeout=20)
    faults(sim, slow_tokens_ms=0)
    full = gen(sim, {"input_ids": P, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}).json()
    assert r.status_code == 200
    d = r.json()
    assert d["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    n = len(d["output_ids"])
    assert 0 < n < 200 and d["meta_info"]["completion_tokens"] == n
    assert d["output_ids"] == full["output_ids"][:n]


def test_abort_matches_rid_prefix_and_abort_all(sim):
    faults(sim, slow_tokens_ms=50)
    with ThreadPoolExecutor(2) as ex:
        batch = ex.submit(
            gen, sim, {"input_ids": [P, P[:-1]], "rid": "grp", "sampling_params": {"max_new_tokens": 100}}
        )
        other = ex.submit(gen, sim, {"input_ids": P[:-2], "rid": "zzz", "sampling_params": {"max_new_tokens": 100}})
        _wait_in_flight(sim, 3)
        httpx.post(sim.url + "/abort_request", json={"rid": "grp"})
        b = batch.result(timeout=20).json()
        assert [x["meta_info"]["finish_reason"]["type"] for x in b] == ["abort", "abort"]
        assert not other.done()
        httpx.post(sim.url + "/abort_request", json={"abort_all": True})
        assert other.result(timeout=20).json()["meta_info"]["finish_reason"]["type"] == "abort"
    # unknown rid: still 200, no-op
    assert httpx.post(sim.url + "/abort_request", json={"rid": "nobody"}).status_code == 200


def test_duplicate_in_flight_rid_rejected_in_0523(sim):
    faults(sim, slow_tokens_ms=30)
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(gen, sim, {"input_ids": P, "rid": "busy", "sampling_params": {"max_new_tokens": 200}})
        _wait_in_flight(sim, 1)
        r = gen(sim, {"input_ids": P, "rid": "busy", "sampling_params": {"max_new_tokens": 5}})
        assert r.status_code == 400 and r.json() == {"error": {"message": "Duplicate request ID detected: busy"}}
        flush = httpx.post(sim.url + "/flush_cache")
        assert flush.status_code == 400  # not while requests run
        httpx.post(sim.url + "/abort_request", json={"rid": "busy"})
        assert fut.result(timeout=20).status_code == 200
    assert gen(sim, {"input_ids": P, "rid": "busy", "sampling_params": {"max_new_tokens": 5}}).status_code == 200


def test_client_disconnect_cancels_the_work(sim):
    faults(sim, slow_tokens_ms=50)
    before = stats(sim)["client_disconnects"]
    with pytest.raises(httpx.ReadTimeout):
        gen(sim, {"input_ids": P, "rid": "gone", "sampling_params": {"max_new_tokens": 200}}, timeout=0.3)
    deadline = time.monotonic() + 10
    while stats(sim)["client_disconnects"] == before:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert stats(sim)["in_flight"] == 0


def test_stream_client_disconnect_cancels_the_work(sim):
    faults(sim, slow_tokens_ms=30)
    before = stats(sim)["client_disconnects"]
    with httpx.stream(
        "POST", sim.url + "/generate", json={"input_ids": P, "stream": True, "sampling_params": {"max_new_tokens": 200}}
    ) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break
    deadline = time.monotonic() + 10
    while stats(sim)["client_disconnects"] == before or stats(sim)["in_flight"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_queue_full_burst(sim):
    faults(sim, queue_full_burst=2)
    for _ in range(2):
        r = gen(sim, {"input_ids": P, "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 503
        assert r.json() == {
            "object": "error",
            "message": "The request queue is full.",
            "type": "503",
            "param": None,
            "code": 503,
        }
    assert gen(sim, {"input_ids": P, "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    assert stats(sim)["faults_injected"]["queue_full"] >= 2
    # in a stream it is an abort chunk with HTTP 200
    faults(sim, queue_full_burst=1)
    r = gen(sim, {"input_ids": P, "stream": True, "sampling_params": {"max_new_tokens": 2}})
    ev = sse_events(r.text)
    fr = json.loads(ev[0])["meta_info"]["finish_reason"]
    assert r.status_code == 200 and fr["type"] == "abort" and fr["status_code"] == 503 and ev[-1] == "[DONE]"


def test_reset_mid_body(sim):
    faults(sim, reset_mid_body=1)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        gen(sim, {"input_ids": P, "sampling_params": {"max_new_tokens": 50}})
    assert gen(sim, {"input_ids": P, "sampling_params": {"max_new_tokens": 50}}).status_code == 200
    # a stream gets some events, then a reset and no [DONE]
    faults(sim, reset_mid_body=1)
    got = b""
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        with httpx.stream(
            "POST",
            sim.url + "/generate",
            json={"input_ids": P, "stream": True, "sampling_params": {"max_new_tokens": 50}},
        ) as r:
            for b in r.iter_bytes():
                got += b
    assert got.startswith(b"data: {") and b"[DONE]" not in got
    assert stats(sim)["faults_injected"]["reset_mid_body"] >= 2


def test_cut_stream_ends_a_stream_cleanly_after_one_chunk_without_done(sim):
    body = {"input_ids": P, "stream": True, "sampling_params": {"max_new_tokens": 50, "stream_interval": 5}}
    before = stats(sim)["faults_injected"].get("cut_stream", 0)
    faults(sim, cut_stream=1)
    plain = gen(sim, {"input_ids": P, "sampling_params": {"max_new_tokens": 50}})
    assert plain.status_code == 200 and plain.json()["meta_info"]["finish_reason"]  # no stream: not taken
    r = gen(sim, body)  # the response ends as a normal end: no transport error
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r.text)
    assert len(ev) == 1 and json.loads(ev[0])["meta_info"]["finish_reason"] is None  # no final chunk, no [DONE]
    assert sse_events(gen(sim, body).text)[-1] == "[DONE]"  # the next stream is whole
    assert stats(sim)["faults_injected"]["cut_stream"] - before == 1


def test_runtime_health_states(sim):
    faults(sim, health="draining")
    assert httpx.get(sim.url + "/health").status_code == 503
    assert gen(sim, {"input_ids": P, "sampling_params": {"max_new_tokens": 1}}).status_code == 200
    faults(sim, health="ok")
    assert httpx.get(sim.url + "/health").status_code == 200
    r = httpx.post(sim.url + "/_sim/faults", json={"nonsense": 1})
    assert r.status_code == 400


@pytest.mark.integration
def test_crash_after_kills_the_process_mid_response():
    with start_simulator(extra_args=QWEN_ARGS) as s:
        faults(s, crash_after=2)
        assert gen(s, {"input_ids": P, "sampling_params": {"max_new_tokens": 20}}).status_code == 200
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            gen(s, {"input_ids": P, "sampling_params": {"max_new_tokens": 20}})
        s.proc.wait(10)
        assert s.proc.returncode == 70
        with pytest.raises(httpx.ConnectError):
            httpx.get(s.url + "/health")
        # restart brings it back on the same URL
        url = s.url
        s.restart()
        assert s.url == url and httpx.get(url + "/health").status_code == 200


@pytest.mark.integration
def test_gpu_emulation_slots_latency_and_busy_time():
    # 2 slots, 10 ms/token, 4 requests x 40 tokens -> two waves of ~0.4 s
    with start_simulator(
        extra_args=QWEN_ARGS + ["--max-running-requests", "2", "--max-queued-requests", "2", "--token-latency-ms", "10"]
    ) as s:
        t0 = time.monotonic()
        with ThreadPoolExecutor(4) as ex:
            futs = [
                ex.submit(gen, s, {"input_ids": P + [i], "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}})
                for i in range(4)
            ]
            rs = [f.result(timeout=30) for f in futs]
        wall = time.monotonic() - t0
        assert all(r.status_code == 200 and len(r.json()["output_ids"]) == 40 for r in rs)
        assert wall >= 0.78
        st = stats(s)
        assert st["slot_seconds"] >= 1.55 and st["busy_seconds"] >= 0.78
        assert st["items"] == 4 and st["finished"]["length"] == 4 and st["rids_seen"] == 4
        assert st["peak_in_flight"] == 4 and st["peak_running"] == 2  # two waited for a slot
        # aborting a queued request: "Abort in waiting queue", no output, no prompt_tokens
        faults(s, slow_tokens_ms=100)
        with ThreadPoolExecutor(4) as ex:
            running = [
                ex.submit(gen, s, {"input_ids": P, "rid": f"r{i}", "sampling_params": {"max_new_tokens": 50}})
                for i in range(2)
            ]
            _wait_in_flight(s, 2)
            queued = ex.submit(gen, s, {"input_ids": P, "rid": "queued", "sampling_params": {"max_new_tokens": 5}})
            _wait_in_flight(s, 3)
            second = ex.submit(gen, s, {"input_ids": P, "rid": "q2", "sampling_params": {"max_new_tokens": 5}})
            _wait_in_flight(s, 4)
            # 2 running + 2 waiting = --max-queued-requests reached
            full = gen(s, {"input_ids": P, "rid": "q3", "sampling_params": {"max_new_tokens": 5}})
            assert full.status_code == 503 and full.json()["message"] == "The request queue is full."
            httpx.post(s.url + "/abort_request", json={"rid": "queued"})
            q = queued.result(timeout=20).json()
            httpx.post(s.url + "/abort_request", json={"abort_all": True})
            [f.result(timeout=20) for f in running + [second]]
        assert q["output_ids"] == [] and q["meta_info"]["finish_reason"]["message"] == "Abort in waiting queue"
        assert "prompt_tokens" not in q["meta_info"] and "cached_tokens" not in q["meta_info"]


def _port_refuses(port: int) -> bool:
    with socket.socket() as so:
        so.settimeout(0.5)
        return so.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.integration
def test_lifecycle_loading_refuses_then_starting_serves_generate_with_health_503():
    with start_simulator(
        extra_args=QWEN_ARGS + ["--loading-seconds", "1.5", "--starting-seconds", "60", "--timeout-keep-alive", "0.5"],
        wait_for="none",
    ) as s:
        time.sleep(0.3)
        assert _port_refuses(s.port)  # loading: connection refused
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(s.url + "/model_info").status_code == 200:
                    break
            except httpx.ConnectError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # starting: health 503, generate works
        assert httpx.get(s.url + "/health").status_code == 503
        assert httpx.get(s.url + "/health_generate").status_code == 503
        assert gen(s, {"input_ids": P, "sampling_params": {"max_new_tokens": 3}}).status_code == 200
        faults(s, health="ok")
        assert httpx.get(s.url + "/health").status_code == 200
        # idle keep-alive connections are closed by the server, as uvicorn does after 5 s by default
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as so:
            so.sendall(b"GET /health HTTP/1.1\r\nHost: sim\r\n\r\n")
            assert so.recv(1000).startswith(b"HTTP/1.1 200")
            t = time.monotonic()
            assert so.recv(1000) == b""
            assert 0.3 < time.monotonic() - t < 4


@pytest.mark.integration
def test_sigterm_drains_in_flight_then_exits():
    s = start_simulator(extra_args=QWEN_ARGS + ["--token-latency-ms", "20"])
    try:
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(gen, s, {"input_ids": P, "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}})
            _wait_in_flight(s, 1)
            s.proc.send_signal(signal.SIGTERM)
            time.sleep(0.1)
            assert httpx.get(s.url + "/health").status_code == 503
            r = fut.result(timeout=20)
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 40
        assert s.proc.wait(10) == 0
    finally:
        s.kill()


@pytest.mark.integration
def test_start_failure_reports_the_log():
    with pytest.raises(SimulatorError, match="not found"):
        start_simulator(extra_args=["--model", "no-such-model"], ready_timeout=30)


def test_prefill_time_counts_only_uncached_tokens(sim):
    faults(sim, prefill_ms_per_1k=200)
    prompt = [3000 + i for i in range(2000)]  # 0.4 s of prefill when nothing is cached
    t = time.monotonic()
    first = gen(sim, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}).json()
    t_first = time.monotonic() - t
    t = time.monotonic()
    second = gen(sim, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}).json()
    t_second = time.monotonic() - t
    assert first["meta_info"]["cached_tokens"] == 0 and second["meta_info"]["cached_tokens"] == 1999
    assert t_first >= 0.4 and t_second < t_first - 0.2
