"""Faults against the real simulator process: in every case the stored generations equal a clean
run's (same sample ids, same output_ids, no duplicates) and the report says what was retried."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from gen_helpers import Sim, as_map, make_config, make_prompts

from eagle3_dagster.generate import ShardReport, generate_shard, read_generations

pytestmark = pytest.mark.integration

N = 24


@pytest.fixture(scope="module")
def prompts() -> pl.DataFrame:
    return make_prompts(N, seed=21)


@pytest.fixture(scope="module")
def reference(shared_sim: Sim, prompts: pl.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[int]]:
    """A clean run: the answer every faulty run must reproduce exactly."""
    shared_sim.faults(clear=True)
    out = tmp_path_factory.mktemp("clean") / "shard=0000"
    rep = generate_shard(prompts, out, make_config(shared_sim.url))
    assert rep.succeeded == N and rep.retried_by_kind == {}
    return as_map(read_generations(out))


def assert_same_as_clean(out: Path, reference: dict[str, list[int]]) -> None:
    files = sorted(out.glob("part-*.parquet"))
    raw = pl.read_parquet(files)
    assert raw.height == raw.get_column("sample_id").n_unique(), "a sample was stored twice"
    assert as_map(raw) == reference


def test_503_burst_is_retried(clean_sim: Sim, prompts, reference, tmp_path: Path):
    clean_sim.faults(queue_full_burst=7)
    rep = generate_shard(prompts, tmp_path / "s", make_config(clean_sim.url))
    assert rep.retried_by_kind == {"http_503": 7}
    assert (rep.succeeded, rep.failed) == (N, 0)
    assert_same_as_clean(tmp_path / "s", reference)


@pytest.mark.parametrize("stream", [True, False])
def test_a_503_burst_counts_as_failures_of_the_endpoint_streamed_or_not(
    clean_sim: Sim, prompts, stream: bool, tmp_path: Path
):
    # Streamed, the queue-full refusal is a 200 stream whose chunk aborts with status 503 (spec §3.5);
    # without streaming an HTTP 503: the endpoint's figures say the same either way.
    clean_sim.faults(queue_full_burst=7)
    rep = generate_shard(prompts, tmp_path / "s", make_config(clean_sim.url, stream=stream))
    assert rep.retried_by_kind == {"http_503": 7} and (rep.succeeded, rep.failed) == (N, 0)
    figures = rep.per_endpoint[clean_sim.url]
    assert (figures["requests"], figures["succeeded"], figures["failures"], figures["circuit_opens"]) == (
        N + 7,
        N,
        7,
        0,
    )


def test_reset_mid_body_is_retried_with_fresh_rids(clean_sim: Sim, prompts, reference, tmp_path: Path):
    clean_sim.faults(reset_mid_body=4)
    before = clean_sim.stats()["rids_repeated"]
    rep = generate_shard(prompts, tmp_path / "s", make_config(clean_sim.url))
    assert rep.retried_by_kind == {"reset": 4}
    assert rep.requests_sent == N + 4
    assert clean_sim.stats()["rids_repeated"] == before  # every attempt had its own rid
    assert_same_as_clean(tmp_path / "s", reference)


def test_server_slower_than_client_timeout(clean_sim: Sim, prompts, reference, tmp_path: Path):
    # 24 tokens x 40 ms = 0.96 s against a 0.2 s timeout; each retry waits twice as long (0.4, 0.8, 1.6 s) and the
    # fourth attempt gets through. The margin is wide on purpose: a client starved of CPU for longer than the answer
    # takes finds the answer already read when it wakes, before its timer fires.
    clean_sim.faults(slow_tokens_ms=40)
    sub = prompts.head(6)
    cfg = make_config(clean_sim.url, read_timeout_s=0.2, max_in_flight=6, stream=False)  # the non-streamed path
    rep = generate_shard(sub, tmp_path / "s", cfg)
    clean_sim.faults(clear=True)
    assert rep.retried_by_kind.get("read_timeout", 0) >= 6  # each sample timed out at least once
    assert (rep.succeeded, rep.failed) == (6, 0)
    stored = as_map(read_generations(tmp_path / "s"))
    assert stored == {k: reference[k] for k in stored} and len(stored) == 6


def test_timeouts_exhausting_retries_are_recorded(clean_sim: Sim, prompts, tmp_path: Path):
    clean_sim.faults(slow_tokens_ms=200)
    cfg = make_config(clean_sim.url, read_timeout_s=0.05, max_retries=1, max_in_flight=2, stream=False)
    rep = generate_shard(prompts.head(2), tmp_path / "s", cfg)
    clean_sim.faults(clear=True)
    assert (rep.succeeded, rep.failed) == (0, 2) and rep.reconciles
    assert rep.errors_by_kind == {"retries_exhausted": 2} and rep.retried_by_kind == {"read_timeout": 2}
    assert read_generations(tmp_path / "s").height == 0


def _run_in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def target() -> None:
        try:
            box["report"] = fn()
        except BaseException as e:  # surfaced by the test
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    return t, box


def test_server_restart_mid_shard(start_sim, prompts, reference, tmp_path: Path):
    sim = start_sim("--token-latency-ms", "4")
    sim.faults(crash_after=9)  # the 9th /generate kills the server mid-response
    cfg = make_config(sim.url, max_in_flight=4, breaker_cooldown_s=0.2)
    t, box = _run_in_thread(lambda: generate_shard(prompts, tmp_path / "s", cfg))
    deadline = time.monotonic() + 30
    while sim.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sim.proc.poll() is not None, "the crash fault did not fire"
    time.sleep(0.5)  # the client sees connection refused meanwhile
    sim.start()  # same port, fresh process
    t.join(60)
    assert not t.is_alive() and "error" not in box, box.get("error")
    rep: ShardReport = box["report"]
    print(rep.as_metadata())
    assert (rep.succeeded, rep.failed) == (N, 0)
    retried = rep.retried_by_kind
    assert retried.get("reset", 0) >= 1  # the in-flight requests that died with the server
    assert sum(retried.values()) >= 1
    assert_same_as_clean(tmp_path / "s", reference)


_KILL_SCRIPT = """
import sys, polars as pl
sys.path[:0] = [{helpers!r}, {tests_root!r}]
from gen_helpers import make_config
from eagle3_dagster.generate import generate_shard
generate_shard(pl.read_parquet({prompts!r}), __import__("pathlib").Path({out!r}),
               make_config({url!r}, max_in_flight=2, flush_every_n=2, flush_every_s=60))
"""


def test_sigkill_mid_shard_then_rerun(clean_sim: Sim, prompts, reference, tmp_path: Path):
    clean_sim.faults(slow_tokens_ms=8)  # ~0.2 s a sample, 2 in flight: a few seconds for the shard
    pq_in = tmp_path / "prompts.parquet"
    prompts.write_parquet(pq_in)
    out = tmp_path / "shard=0000"
    code = _KILL_SCRIPT.format(
        helpers=str(Path(__file__).parent),
        tests_root=str(Path(__file__).parent.parent),
        prompts=str(pq_in),
        out=str(out),
        url=clean_sim.url,
    )
    done0 = sum(clean_sim.stats()["finished"].values())
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while len(list(out.glob("part-*.parquet"))) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    time.sleep(0.3)  # let the server finish what was in flight when the client died
    answered = sum(clean_sim.stats()["finished"].values()) - done0
    clean_sim.faults(clear=True)

    stored = read_generations(out)
    assert 6 <= stored.height < N  # killed mid-shard, with the chunks written so far intact
    # Lost to the kill: at most one unflushed chunk (flush_every_n=2) plus the 2 requests in flight.
    assert answered - stored.height <= 2 + 2
    assert {k: reference[k] for k in as_map(stored)} == as_map(stored)

    before = clean_sim.stats()["requests"]
    rep = generate_shard(prompts, out, make_config(clean_sim.url))
    # The rerun asks only for what was not stored: stored chunks are never regenerated.
    assert clean_sim.stats()["requests"] - before == N - stored.height == rep.succeeded
    assert rep.skipped_cached == stored.height and rep.reconciles
    assert not list(out.glob(".*.tmp"))
    assert_same_as_clean(out, reference)


def test_failed_chunk_write_is_retried_without_duplicates(
    clean_sim: Sim, prompts, reference, tmp_path: Path, monkeypatch
):
    from eagle3_dagster.generate import store

    real = store.write_table_atomic
    calls = {"n": 0}

    def flaky(table, path, **kw):
        calls["n"] += 1
        if calls["n"] in (1, 2, 4):
            # Fail after writing half a temp file, as a full disk would.
            tmp = path.with_name(f".{path.name}.half.tmp")
            tmp.write_bytes(b"PAR1 half")
            raise OSError(28, "No space left on device")
        return real(table, path, **kw)

    monkeypatch.setattr(store, "write_table_atomic", flaky)
    rep = generate_shard(prompts, tmp_path / "s", make_config(clean_sim.url))
    assert rep.succeeded == N
    assert_same_as_clean(tmp_path / "s", reference)


def test_chunk_write_that_keeps_failing_fails_loudly(clean_sim: Sim, prompts, reference, tmp_path: Path, monkeypatch):
    from eagle3_dagster.generate import StoreWriteError, store

    real = store.write_table_atomic
    calls = {"n": 0}

    def broken_after_first(table, path, **kw):
        calls["n"] += 1
        if calls["n"] > 1 and path.name.startswith("part-"):
            raise OSError(5, "Input/output error")
        return real(table, path, **kw)

    monkeypatch.setattr(store, "write_table_atomic", broken_after_first)
    out = tmp_path / "s"
    with pytest.raises(StoreWriteError):
        generate_shard(prompts, out, make_config(clean_sim.url, write_retries=2))
    kept = read_generations(out)
    assert kept.height == 8  # the first chunk only: nothing half-written, nothing else claimed
    monkeypatch.setattr(store, "write_table_atomic", real)
    rep = generate_shard(prompts, out, make_config(clean_sim.url))
    assert (rep.skipped_cached, rep.succeeded) == (8, N - 8)
    assert_same_as_clean(out, reference)
