"""Fault matrix at the pipeline level: real Dagster runs of the shard graph (tokenized_prompts ->
generations -> training_samples) on a DagsterInstance in a temporary DAGSTER_HOME (the project's own
instance config: SQLite, pool "sglang" limited to 2), against a real `eagle3-sim` process on 127.0.0.1.

Faults: a 503 burst; connection resets mid-body; a server slower than the client's read timeout;
a server restart mid-shard; a SIGKILL of the pipeline process mid-shard; failed disk writes of a
chunk (recovered by retry, and a disk that stays broken: the step fails loudly, the rerun after the
fix completes). For each fault the final `generations` and `training_samples` tables equal a clean
run's on every data column, with no loss and no duplicates, the counts reconcile, and the
`generations` materialization's metadata in the instance's event log says what was retried.
The SIGKILL case also checks that the dead run does not keep its slot of the "sglang" pool.

Knobs the resources do not expose (client read timeout, chunk flush size) are forced on the
GenerationConfig the asset builds (fault_helpers.generation_overrides).

One simulator is shared by the module (faults are reset through POST /_sim/faults before each
test); each test gets its own data folder seeded with the same ingested prompts.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import psutil
import pytest
from fault_helpers import (
    ShardData,
    SimCtl,
    assert_same_data,
    fresh_data_dir,
    generation_overrides,
    ingest_prompts,
    materialization_metadata,
    run_shard,
    run_status,
    shard_data,
    step_event_types,
    write_source,
)
from rel_helpers import PYTHON, ROOT, child_env

from eagle3_dagster.app.instance import INSTANCE_YAML
from eagle3_dagster.orchestration.run import ShardOutcome

pytestmark = pytest.mark.integration

WORKER = str(Path(__file__).with_name("fault_worker.py"))
SHARD_ASSETS = ["generations", "tokenized_prompts", "training_samples"]
REPORT_KEYS = (
    "requested",
    "skipped_cached",
    "succeeded",
    "failed",
    "retried_by_kind",
    "errors_by_kind",
    "requests_sent",
    "chunks_written",
    "reconciles",
)


@dataclass
class Matrix:
    root: Path
    prompts: Path  # a data folder holding only the ingested prompts (copied into each test's folder)
    shard: str
    home: Path
    instance: dg.DagsterInstance
    sim: SimCtl


@dataclass
class Clean:
    data: ShardData
    meta: dict[str, Any]
    checks: dict[str, bool]

    @property
    def n(self) -> int:
        return self.data.tokenized


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    root = tmp_path_factory.mktemp("fault-matrix")
    prompts = root / "prompts-only"
    shard = ingest_prompts(write_source(root / "source", n=200), prompts)
    home = root / "dagster_home"
    home.mkdir()
    # the instance a user gets (`make instance` / `eagle3 demo`): SQLite, pool limit 2 for "sglang"
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    sim = SimCtl(root)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            yield Matrix(root=root, prompts=prompts, shard=shard, home=home, instance=instance, sim=sim)
    finally:
        sim.kill()


@pytest.fixture
def m(matrix: Matrix) -> Matrix:
    if not matrix.sim.sp.alive():  # a failed restart test must not take the rest of the module down
        matrix.sim.start()
    matrix.sim.faults(clear=True)
    return matrix


@pytest.fixture(scope="module")
def clean(matrix: Matrix) -> Clean:
    """The reference: one fault-free run of the shard graph."""
    matrix.sim.faults(clear=True)
    data = fresh_data_dir(matrix.prompts, matrix.root / "clean")
    sh = run_shard(matrix.instance, data, matrix.sim.url, matrix.shard)
    meta = _assert_run_ok(matrix, sh)
    ref = shard_data(data, matrix.shard)
    assert 40 <= ref.tokenized <= 70, f"the shard should hold ~50 prompts, has {ref.tokenized}"
    assert meta["retried_by_kind"] == {} and meta["errors_by_kind"] == {}
    assert meta["requests_sent"] == meta["succeeded"] == meta["requested"] == ref.tokenized
    assert ref.raw_generations.height == ref.training.height == ref.tokenized
    assert all(sh.checks.values()), sh.checks
    return Clean(data=ref, meta=meta, checks=sh.checks)


def _assert_run_ok(m: Matrix, sh) -> dict[str, Any]:
    """The run succeeded on its first attempt of every step; returns the generations metadata."""
    assert sh.success, sh
    assert sh.materialized == SHARD_ASSETS, sh
    assert run_status(m.instance, sh.run_id) == dg.DagsterRunStatus.SUCCESS
    for step in SHARD_ASSETS:
        types = step_event_types(m.instance, sh.run_id, step)
        assert "STEP_SUCCESS" in types and "STEP_UP_FOR_RETRY" not in types and "STEP_FAILURE" not in types, (
            step,
            types,
        )
    return materialization_metadata(m.instance, sh.run_id, "generations")


def _assert_reconciles(meta: dict[str, Any], train_meta: dict[str, Any], n: int) -> None:
    assert meta["reconciles"] is True
    assert meta["requested"] == n == meta["succeeded"] + meta["failed"] + meta["skipped_cached"]
    assert meta["failed"] == 0 and meta["errors_by_kind"] == {}
    assert meta["stored_samples"] == n and meta["quarantined"] == 0
    assert train_meta["samples"] == n and train_meta["generation_errors"] == 0


def _check_against_clean(m: Matrix, clean: Clean, data: Path, sh, allow_stray: int = 0) -> dict[str, Any]:
    meta = _assert_run_ok(m, sh)
    assert sh.checks == clean.checks
    assert_same_data(shard_data(data, m.shard), clean.data, allow_stray=allow_stray)
    _assert_reconciles(meta, materialization_metadata(m.instance, sh.run_id, "training_samples"), clean.n)
    print("generations report:", {k: meta[k] for k in REPORT_KEYS})
    return meta


def _injected(before: dict[str, Any], after: dict[str, Any], kind: str) -> int:
    return after["faults_injected"].get(kind, 0) - before["faults_injected"].get(kind, 0)


# -- the network and the server -------------------------------------------------------------


def test_clean_reference(clean: Clean) -> None:
    assert clean.meta["chunks_written"] >= 1 and clean.meta["finish_reasons"] == {"stop": clean.n}


def _run_under_faults(
    m: Matrix, clean: Clean, tmp_path: Path, faults: dict[str, Any], **fleet: Any
) -> tuple[dict, dict, dict]:
    """A fresh shard run with these simulator faults armed (and `sglang` resource fields);
    returns (its metadata, checked against the clean run; simulator stats before; after)."""
    data = fresh_data_dir(m.prompts, tmp_path / "data")
    before = m.sim.stats()
    m.sim.faults(**faults)
    try:
        sh = run_shard(m.instance, data, m.sim.url, m.shard, **fleet)
    finally:
        m.sim.faults(clear=True)
    after = m.sim.stats()
    return _check_against_clean(m, clean, data, sh), before, after


def test_503_burst(m: Matrix, clean: Clean, tmp_path: Path) -> None:
    meta, before, after = _run_under_faults(m, clean, tmp_path, {"queue_full_burst": 7})
    assert _injected(before, after, "queue_full") == 7
    assert meta["retried_by_kind"] == {"http_503": 7}
    assert meta["requests_sent"] == clean.n + 7 == after["requests"] - before["requests"]


def test_connection_reset_mid_body(m: Matrix, clean: Clean, tmp_path: Path) -> None:
    meta, before, after = _run_under_faults(m, clean, tmp_path, {"reset_mid_body": 5})
    assert _injected(before, after, "reset_mid_body") == 5
    assert meta["retried_by_kind"] == {"reset": 5}
    assert meta["requests_sent"] == clean.n + 5 == after["requests"] - before["requests"]
    assert after["rids_repeated"] == before["rids_repeated"]  # each retry had a fresh rid


def test_server_slower_than_client_timeout(m: Matrix, clean: Clean, tmp_path: Path) -> None:
    # The client timeout is the `sglang` resource's read_timeout_s (default 3600 s), set as a user
    # would in the launchpad; it bounds a non-streamed answer (stream=False). 3 ms a token: a sample
    # longer than 167 tokens outlasts the 0.5 s timeout; each retry waits twice as long and gets through.
    # Only samples well past the timeout (>= 1.5x: 250+ tokens) are counted as sure to time out: on a
    # busy machine the client's event loop can wake late and find a just-over-the-line answer already
    # read (CI once saw 35 timeouts for 36 samples barely over the line).
    ms, timeout = 3.0, 0.5
    slow = sum(1 for ct in clean.data.generations["completion_tokens"].to_list() if ct * ms / 1000 >= 1.5 * timeout)
    assert slow >= 5, "the fault must actually hit some samples"
    meta, before, after = _run_under_faults(
        m, clean, tmp_path, {"slow_tokens_ms": ms}, read_timeout_s=timeout, stream=False
    )
    retried = meta["retried_by_kind"]
    assert set(retried) == {"read_timeout"} and retried["read_timeout"] >= slow, retried
    assert meta["requests_sent"] == clean.n + retried["read_timeout"] == after["requests"] - before["requests"]


def test_stalled_requests_streamed(m: Matrix, clean: Clean, tmp_path: Path) -> None:
    """Three requests go silent after a few tokens, connection open (a stuck request, a dropped proxy
    connection): the streamed client notices the silence between chunks, aborts, retries with a new rid."""
    # chunks every 4 tokens, so the stall comes after the first chunk (silence before the first chunk is
    # bounded by first_chunk_timeout_s instead: queued requests send nothing)
    with generation_overrides(stream_interval=4):
        meta, before, after = _run_under_faults(
            m, clean, tmp_path, {"stall": 3, "stall_after_tokens": 8}, stall_timeout_s=3.0
        )  # 3 s: a healthy request on a busy machine is never taken for a stall (the counts are exact)
    assert _injected(before, after, "stall") == 3
    assert meta["streamed"] is True and meta["retried_by_kind"] == {"stall": 3}
    assert meta["requests_sent"] == clean.n + 3 == after["requests"] - before["requests"]
    assert after["rids_repeated"] == before["rids_repeated"] and after["in_flight"] == 0


def test_stalled_requests_not_streamed(m: Matrix, clean: Clean, tmp_path: Path) -> None:
    """The same stall without streaming: only the read timeout ends it (here 1 s; 3600 s by default)."""
    meta, before, after = _run_under_faults(
        m, clean, tmp_path, {"stall": 3, "stall_after_tokens": 8}, stream=False, read_timeout_s=1.0
    )
    assert _injected(before, after, "stall") == 3
    assert meta["streamed"] is False and meta["retried_by_kind"].get("read_timeout", 0) >= 3
    assert set(meta["retried_by_kind"]) == {"read_timeout"}


def test_server_restart_mid_shard(m: Matrix, clean: Clean, tmp_path: Path) -> None:
    """The server is killed while the shard is half answered and started again on the same port."""
    data = fresh_data_dir(m.prompts, tmp_path / "data")
    m.sim.faults(slow_tokens_ms=3)  # answers spread over ~0.1-2 s, all requests in flight at once
    finished0 = sum(m.sim.stats()["finished"].values())
    port = m.sim.sp.port
    box: dict[str, Any] = {}
    stop = threading.Event()

    def restarter() -> None:
        try:
            while not stop.is_set():
                done = sum(m.sim.stats()["finished"].values()) - finished0
                if done >= 10:
                    box["answered_before_kill"] = done
                    box["killed_pid"] = m.sim.proc.pid
                    m.sim.sp.kill()  # SIGKILL: in-flight requests die with their connections
                    time.sleep(0.5)  # clients meet connection refused meanwhile
                    m.sim.start()  # same port, a fresh process without faults
                    box["restarted"] = True
                    return
                time.sleep(0.01)
        except BaseException as e:  # surfaced below
            box["error"] = e

    t = threading.Thread(target=restarter, daemon=True)
    t.start()
    try:
        sh = run_shard(m.instance, data, m.sim.url, m.shard)
    finally:
        stop.set()
        t.join(60)
    assert "error" not in box, box["error"]
    assert box.get("restarted"), "the server was not restarted during the run"
    assert box["killed_pid"] != m.sim.proc.pid and m.sim.sp.port == port
    answered = box["answered_before_kill"]
    assert answered <= clean.n - 10, "the kill came after (nearly) the whole shard was answered"
    new_server_requests = m.sim.stats()["requests"]  # the fresh process counts from zero
    print("restart:", {"answered_before_kill": answered, "new_server_requests": new_server_requests})

    meta = _check_against_clean(m, clean, data, sh)
    retried = meta["retried_by_kind"]
    assert set(retried) <= {"reset", "connect"} and retried.get("reset", 0) >= 1, retried
    # every request the new server saw was a retry of one that died with the old one
    assert meta["requests_sent"] == clean.n + sum(retried.values())
    assert 1 <= new_server_requests <= sum(retried.values())
    # the report also shows the endpoint was taken out (circuit open) while it was down
    endpoint = meta["per_endpoint"][m.sim.url]
    assert endpoint["circuit_opens"] >= 1 and endpoint["failures"] == sum(retried.values()), endpoint


# -- the pipeline process and the disk ------------------------------------------------------


@dataclass
class SigkillRun:
    data: Path
    stored_at_kill: int
    partial: ShardData
    killed_run_ids: list[str]
    leaked_after_kill: list[Any]  # ClaimedSlotInfo of the "sglang" pool held by the killed run
    rerun: Any  # ShardOutcome of the rerun (another process)
    status_before_rerun: Any  # DagsterRunStatus of the killed run right after the kill
    rerun_requests: int  # /generate requests the simulator saw during the rerun


@pytest.fixture(scope="module")
def sigkill_run(matrix: Matrix, clean: Clean) -> SigkillRun:
    """The shard run in its own process is SIGKILLed once some chunks are written, then run again in a new process."""
    m = matrix
    m.sim.faults(clear=True)
    data = fresh_data_dir(m.prompts, m.root / "sigkill")
    gen_dir = data / "generations" / f"shard={m.shard}"
    env = child_env(DAGSTER_HOME=str(m.home))
    base = [PYTHON, WORKER, "--data", str(data), "--url", m.sim.url, "--shard", m.shard]
    m.sim.faults(slow_tokens_ms=4)  # ~1 s a sample, 2 at a time: the shard would take ~30 s
    overrides = json.dumps({"max_in_flight": 2, "flush_every_n": 4})
    children: list[psutil.Process] = []
    log_path = m.root / "sigkill-worker.log"
    started = {r.run_id for r in m.instance.get_runs()}
    t0 = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*base, "--overrides", overrides],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while len(list(gen_dir.glob("part-*.parquet"))) < 2:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no chunk written in time"
                time.sleep(0.02)
            assert proc.poll() is None
            children = psutil.Process(proc.pid).children(recursive=True)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            print(f"killed after {time.monotonic() - t0:.1f}s")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # Dagster's compute-log `tail -F` and its orphan watcher notice the dead parent and exit
    _, left = psutil.wait_procs(children, timeout=20)
    for c in left:
        c.kill()
    assert not left, f"processes of the killed pipeline still running: {left}"
    m.sim.faults(clear=True)

    partial = shard_data(data, m.shard)
    killed = [r.run_id for r in m.instance.get_runs() if r.run_id not in started]
    leaked = [
        c for c in m.instance.event_log_storage.get_concurrency_info("sglang").claimed_slots if c.run_id in killed
    ]

    status_before_rerun = run_status(m.instance, killed[0]) if killed else None
    before, t0 = m.sim.requests(), time.monotonic()
    rerun = subprocess.run(base, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-4000:]
    sh = ShardOutcome(**json.loads(rerun.stdout.strip().splitlines()[-1])["shard"])
    print(f"rerun took {time.monotonic() - t0:.1f}s")
    return SigkillRun(
        data=data,
        stored_at_kill=partial.raw_generations.height,
        partial=partial,
        killed_run_ids=killed,
        leaked_after_kill=leaked,
        rerun=sh,
        status_before_rerun=status_before_rerun,
        rerun_requests=m.sim.requests() - before,
    )


def test_sigkill_of_the_pipeline_mid_shard_then_rerun(m: Matrix, clean: Clean, sigkill_run: SigkillRun) -> None:
    r = sigkill_run
    stored = r.stored_at_kill
    assert 8 <= stored < clean.n, stored  # killed mid-shard, the chunks written so far intact
    assert r.partial.raw_generations.get_column("sample_id").n_unique() == stored
    ref = clean.data.generations
    assert r.partial.generations.equals(ref.filter(ref["sample_id"].is_in(r.partial.generations["sample_id"])))
    # the killed run could not finish itself; the next run on this host saw its owner gone and failed it
    assert len(r.killed_run_ids) == 1 and run_status(m.instance, r.killed_run_ids[0]) == dg.DagsterRunStatus.FAILURE
    assert r.status_before_rerun == dg.DagsterRunStatus.STARTED
    failure = [
        e.message
        for e in m.instance.all_logs(r.killed_run_ids[0])
        if e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_FAILURE"
    ]
    assert failure and "is gone" in failure[-1], failure
    assert _materialized(m, r.killed_run_ids[0]) == {"tokenized_prompts"}  # generations never finished

    assert r.rerun_requests == clean.n - stored, "the rerun must request only what was missing"
    meta = _check_against_clean(m, clean, r.data, r.rerun)
    assert meta["skipped_cached"] == stored and meta["succeeded"] == clean.n - stored
    assert meta["requests_sent"] == r.rerun_requests and meta["retried_by_kind"] == {}


def test_sigkilled_run_does_not_keep_its_sglang_pool_slot(m: Matrix, sigkill_run: SigkillRun) -> None:
    """The instance limits pool "sglang" to 2 slots. A run whose process was SIGKILLed holds its slot
    (Dagster cannot release it); unless the next run gives it back, two such kills would make every
    later `generations` step wait for a slot forever."""
    assert sigkill_run.leaked_after_kill, "the kill should have left the slot claimed (else this proves nothing)"
    held = [
        c
        for c in m.instance.event_log_storage.get_concurrency_info("sglang").claimed_slots
        if c.run_id in sigkill_run.killed_run_ids
    ]
    for run_id in {c.run_id for c in held}:  # give it back, so the rest of the module runs unaffected
        m.instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    assert not held, (
        f"the SIGKILLed run {sigkill_run.killed_run_ids} still holds {held} of the 'sglang' pool "
        f"(limit 2) after the rerun completed; leaked right after the kill: {sigkill_run.leaked_after_kill}"
    )


def _materialized(m: Matrix, run_id: str) -> set[str]:
    from dagster import DagsterEventType

    recs = m.instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    return {r.asset_materialization.asset_key.to_user_string() for r in recs}


def _flaky_part_writes(fails, err: int, calls: dict[str, int]):
    """A stand-in for the chunk writer: chunk-write attempt n (1-based) fails when fails(n), as a full disk does."""
    from eagle3_dagster.generate import store

    real = store.write_table_atomic

    def write(table, path, **kw):
        if Path(path).name.startswith("part-"):
            calls["n"] += 1
            if fails(calls["n"]):
                # what a full disk leaves: half a temp file (never under a final name)
                Path(path).with_name(f".{Path(path).name}.half.tmp").write_bytes(b"PAR1 half a chunk")
                raise OSError(err, os.strerror(err))
        return real(table, path, **kw)

    return write


@dataclass
class FlakyWriteRun:
    sh: Any
    data: Path
    calls: int


@pytest.fixture(scope="module")
def flaky_write_run(matrix: Matrix, clean: Clean) -> FlakyWriteRun:
    """A run whose first two chunk-write attempts fail with ENOSPC (each leaves half a temp file)."""
    from eagle3_dagster.generate import store

    matrix.sim.faults(clear=True)
    data = fresh_data_dir(matrix.prompts, matrix.root / "flaky-write")
    calls = {"n": 0}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store, "write_table_atomic", _flaky_part_writes(lambda n: n <= 2, errno.ENOSPC, calls))
        sh = run_shard(matrix.instance, data, matrix.sim.url, matrix.shard)
    return FlakyWriteRun(sh=sh, data=data, calls=calls["n"])


def test_failed_chunk_write_is_retried_with_identical_data(
    m: Matrix, clean: Clean, flaky_write_run: FlakyWriteRun
) -> None:
    r = flaky_write_run
    assert r.calls >= 3, "the chunk writer was never called through store.write_table_atomic"
    meta = _check_against_clean(m, clean, r.data, r.sh, allow_stray=1)  # no Dagster step retry: the store retried
    # the half-written temp file of the failed attempts (both retried to the same final name):
    # a hidden name, never read as data; the next open of the shard store removes it
    assert [f.endswith(".half.tmp") for f in shard_data(r.data, m.shard).stray_files] == [True]
    assert meta["retried_by_kind"] == {}  # no request was sent twice
    assert meta["requests_sent"] == clean.n


def test_report_says_chunk_writes_were_retried(m: Matrix, flaky_write_run: FlakyWriteRun) -> None:
    meta = materialization_metadata(m.instance, flaky_write_run.sh.run_id, "generations")
    retries = {k: v for k, v in meta.items() if "write" in k and "retr" in k}
    retries.update({k: v for k, v in meta["retried_by_kind"].items() if "write" in k})
    assert retries, (
        f"the generations metadata does not report the 2 failed chunk writes that were retried; keys: {sorted(meta)}"
    )
    assert sum(v for v in retries.values() if isinstance(v, int)) == 2, retries


def test_chunk_write_that_keeps_failing_fails_loudly_then_rerun_completes(
    m: Matrix, clean: Clean, tmp_path: Path
) -> None:
    from eagle3_dagster.generate import store

    data = fresh_data_dir(m.prompts, tmp_path / "data")
    calls = {"n": 0}
    before = m.sim.requests()
    policy = _generations_op().retry_policy
    assert policy is not None and policy.max_retries == 2
    with generation_overrides(flush_every_n=16), pytest.MonkeyPatch.context() as mp:
        # the asset's own step retries, without their 30 s / 60 s waits
        mp.setattr(_generations_op(), "_retry_policy", dg.RetryPolicy(max_retries=policy.max_retries, delay=0))
        # the first chunk lands, then the disk is full for good
        mp.setattr(store, "write_table_atomic", _flaky_part_writes(lambda n: n > 1, errno.ENOSPC, calls))
        sh = run_shard(m.instance, data, m.sim.url, m.shard)
    sent_failed_run = m.sim.requests() - before
    assert not sh.success and "generations" in sh.skipped_or_failed and "training_samples" in sh.skipped_or_failed
    assert run_status(m.instance, sh.run_id) == dg.DagsterRunStatus.FAILURE
    types = step_event_types(m.instance, sh.run_id, "generations")
    assert types.count("STEP_UP_FOR_RETRY") == 2 and types.count("STEP_FAILURE") == 1, types
    assert "STEP_SUCCESS" not in types and "ASSET_MATERIALIZATION" not in types
    failure = _step_failure_text(m.instance, sh.run_id, "generations")
    assert "StoreWriteError" in failure and "could not write" in failure and "No space left on device" in failure, (
        failure
    )
    assert not step_event_types(m.instance, sh.run_id, "training_samples").count("STEP_START")
    partial = shard_data(data, m.shard)
    stored = partial.raw_generations.height
    assert 16 <= stored < clean.n and partial.raw_generations["sample_id"].n_unique() == stored  # the one chunk written
    assert not (data / "generations" / f"shard={m.shard}" / "active.parquet").exists()
    assert not (data / "training_samples").exists()
    # what the broken disk cost: every attempt re-sent the samples it could not store, nothing else
    assert sent_failed_run == clean.n + policy.max_retries * (clean.n - stored)

    # the disk is fixed: a plain rerun completes, identical to the clean run
    before = m.sim.requests()
    sh2 = run_shard(m.instance, data, m.sim.url, m.shard)
    meta = _check_against_clean(m, clean, data, sh2)
    assert meta["skipped_cached"] == stored and meta["succeeded"] == clean.n - stored
    assert m.sim.requests() - before == clean.n - stored == meta["requests_sent"]


def _generations_op():
    from eagle3_dagster.definitions import defs

    (assets_def,) = [a for a in defs.assets if getattr(a, "key", None) == dg.AssetKey("generations")]
    return assets_def.op


def _step_failure_text(instance: dg.DagsterInstance, run_id: str, step: str) -> str:
    out = []
    for rec in instance.all_logs(run_id):
        ev = rec.dagster_event
        if ev is not None and ev.step_key == step and ev.event_type_value == "STEP_FAILURE":
            err = ev.step_failure_data.error
            while err is not None:
                out.append(f"{err.cls_name}: {err.message}")
                err = err.cause
    return "\n".join(out)
