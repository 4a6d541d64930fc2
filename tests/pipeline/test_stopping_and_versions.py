"""Issue 14's remaining proofs, run the way users meet them.

- Weights updated under a running shard (a real Dagster run of one shard against the simulator, whose
  weight_version switches after N requests): the answers under the new version fail
  `weight_version_changed`, the generations table holds only the shard's revision, counts reconcile,
  and the step's log and metadata name it.
- `kill -9` of `eagle3 demo` leaves no simulator behind (it dies with its parent; its port is free).
- `eagle3 ui` stops on SIGTERM and on SIGINT: it, `dagster dev`, their children and the simulator are gone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import dagster as dg
import httpx
import polars as pl
import psutil
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts
from proc_helpers import EAGLE3, command_env, wait_for_log
from sim_ctl import Sim

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.definitions import defs
from eagle3_dagster.generate import read_generation_errors, read_generations
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.sim.process import free_port

pytestmark = pytest.mark.integration

# -- weights updated under a running shard ---------------------------------------------------------------


def test_weight_version_change_mid_shard_fails_those_rows_and_never_mixes_versions(tmp_path, kimi_profile):
    data = tmp_path / "data"
    sim = Sim(log_path=tmp_path / "sim.log")
    try:
        # one request at a time, so exactly the first 3 answers come from the starting weights
        # a failure budget of 100%: the partial shard goes on (its failures are a WARN), see below
        res = graph_resources(data, kimi_profile.tokenizer, sim.url, max_in_flight=1, max_failed_rate=1.0)
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)
            n = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == int(shard)).height
            assert n > 3, n
            sim.faults(clear=True, weight_version_after=3, next_weight_version="v2")
            sh = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            assert sim.stats()["faults_injected"].get("weight_version_change") == 1

            gen_dir = data / "generations" / f"shard={shard}"
            gens = read_generations(gen_dir)
            errs = read_generation_errors(gen_dir)
            # the shard never silently mixes two versions: only the starting revision is stored
            assert gens.height == 3, gens.select("sample_id", "model_revision")
            assert set(gens["model_revision"]) == {"kimi-k2.5@default"} or all(
                r.endswith("@default") for r in gens["model_revision"]
            ), set(gens["model_revision"])
            assert errs.height == n - 3 and set(errs["reason"]) == {"weight_version_changed"}, errs
            assert all("'v2'" in d for d in errs["detail"]), errs["detail"].to_list()
            assert set(gens["sample_id"]).isdisjoint(set(errs["sample_id"]))  # in = out + rejected

            meta = instance.get_latest_materialization_event(dg.AssetKey("generations")).asset_materialization.metadata
            assert meta["succeeded"].value == 3 and meta["failed"].value == n - 3
            assert meta["reconciles"].value is True
            assert "weight_version_changed" in str(meta["errors_by_kind"].value), meta["errors_by_kind"]
            named = [
                r
                for r in instance.all_logs(sh.run_id)
                if not r.dagster_event
                and r.step_key == "generations"
                and "now reports weight_version 'v2'" in r.user_message
                and "@default" in r.user_message
            ]
            assert named and named[0].level >= 40, named  # an ERROR line naming both versions
            # within its failure budget the partial shard goes on (failed rows are counted, a rerun generates
            # them under the new revision), but nothing from the new weights reaches the training rows
            assert sh.success, sh
            assert sh.failed_checks.get("generations:request_failure_budget") == "WARN", sh.failed_checks
            train = pl.read_parquet(data / "training_samples" / f"shard={shard}" / "part-0000.parquet")
            assert train.height > 0 and set(train["sample_id"]) <= set(gens["sample_id"]), train["sample_id"]
    finally:
        sim.kill()


# -- processes -----------------------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def test_kill_9_of_the_demo_leaves_no_simulator_behind(tmp_path: Path):
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [EAGLE3, "demo", "--shards", "0000", "--sim-arg=--token-latency-ms", "--sim-arg=30"],
            cwd=PROJECT_ROOT,
            env=command_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sim: psutil.Process | None = None
        try:
            m = wait_for_log(log, r"simulator \(eagle3-sim\) at http://127\.0\.0\.1:(\d+), pid (\d+)", proc, 120)
            port, sim_pid = int(m.group(1)), int(m.group(2))
            sim = psutil.Process(sim_pid)
            assert sim in psutil.Process(proc.pid).children(recursive=True)  # the demo's own child
            deadline = time.monotonic() + 60
            while _port_free(port):  # up and listening
                assert time.monotonic() < deadline and sim.is_running(), log.read_text()[-3000:]
                time.sleep(0.1)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGKILL)  # the demo process only, no chance to clean up
            proc.wait(10)
            _, alive = psutil.wait_procs([sim], timeout=5)
            took = time.monotonic() - t0
            assert not alive, f"simulator {sim_pid} still running 5 s after kill -9 of the demo"
            deadline = time.monotonic() + 5
            while not _port_free(port):
                assert time.monotonic() < deadline, f"port {port} still held 5 s after kill -9 of the demo"
                time.sleep(0.1)
            print(f"simulator gone and port {port} free {took:.2f}s after kill -9 of the demo")
        finally:
            _kill_group(proc.pid)  # the demo's other helpers, if any
            if sim is not None and sim.is_running():
                sim.kill()
            proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_eagle3_ui_stops_with_everything_it_started(tmp_path: Path, sig: signal.Signals):
    port = free_port()
    log = tmp_path / "ui.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [EAGLE3, "ui", "--port", str(port)],
            cwd=PROJECT_ROOT,
            env=command_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        family: list[psutil.Process] = []
        try:
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"UI not answering in 90 s:\n{log.read_text()[-3000:]}"
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            family = psutil.Process(proc.pid).children(recursive=True)
            cmdlines = [" ".join(p.cmdline()) for p in family]
            assert any("dagster dev" in c or "dagster', 'dev" in c or " -m dagster dev" in c for c in cmdlines), (
                cmdlines
            )
            assert any("eagle3_dagster.sim" in c or "eagle3-sim" in c for c in cmdlines), cmdlines
            t0 = time.monotonic()
            proc.send_signal(sig)  # to `eagle3 ui` only (a SIGTERM from a supervisor, or kill -INT)
            proc.wait(30)
            _, alive = psutil.wait_procs(family, timeout=max(0.1, 30 - (time.monotonic() - t0)))
            took = time.monotonic() - t0
            assert not alive, f"still running 30 s after {sig.name}: {alive}\n{log.read_text()[-3000:]}"
            print(f"eagle3 ui and its {len(family)} descendants gone {took:.1f}s after {sig.name}")
        finally:
            if proc.poll() is None:
                _kill_group(proc.pid)
            for p in family:  # whatever a failed stop left behind
                if p.is_running():
                    p.kill()
            proc.wait(10)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert _port_free(port)
