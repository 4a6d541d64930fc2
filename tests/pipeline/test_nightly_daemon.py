"""The nightly regeneration under the REAL Dagster daemon, turned on through the CLI as a user would.

`dagster-daemon run` (which starts its own code server) on a project-local instance, the simulator
on 127.0.0.1, a cron set to three minutes from about two minutes on, every schedule and sensor started with
`dagster schedule|sensor start --start-all`. Part 1: a prompt source is added; the chain ingest -> every
shard -> publish runs by itself and the new LATEST snapshot holds the new source's rows; no schedule or
sensor tick failed. Part 2: the simulator is stopped; the night fails loudly (failed shard runs, the
`nightly_failed` sensor names them, the freshness check on training_dataset fails) and LATEST is unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import polars as pl
import psutil
import pytest
from sim_ctl import Sim

from eagle3_dagster.app.instance import INSTANCE_YAML
from eagle3_dagster.config import PROJECT_ROOT

# Minutes of a real daemon (cron ticks, sensor hops, a failing night): `make test-full`. Every decision it
# watches is tested in `make test` in-process (tests/pipeline/test_sequence.py, test_schedules.py).
pytestmark = [pytest.mark.integration, pytest.mark.full]

BIN = Path(sys.executable).parent
MARK = "EAGLE3_TEST_NIGHTLY_DAEMON"  # set in every process this test starts, to find stragglers
FAST = {
    "EAGLE3_N_SHARDS": "2",
    "EAGLE3_EXECUTOR": "in_process",
    "EAGLE3_NIGHTLY_TZ": "UTC",  # the cron's minutes are computed in UTC (_cron_from)
    "EAGLE3_SENSOR_INTERVAL_S": "5",
    "EAGLE3_SNAPSHOT_MAX_AGE": "30s",
    "EAGLE3_ENDPOINT_WAIT_S": "5",
}  # a generation step gives up on a dead server after 5 s (x3 step attempts)


def _cron_from(after_s: float) -> tuple[str, float]:
    """A cron (in UTC, EAGLE3_NIGHTLY_TZ in FAST) that fires at three minutes of each hour, the first of them
    the first whole minute at least `after_s` from now, and that first tick's time: the schedule fires a few
    times in the test, not a night every minute (each night is four runs, and under load they pile up)."""
    tick = (int(time.time() + after_s) // 60 + 1) * 60
    m = time.gmtime(tick).tm_min
    return f"{m},{(m + 1) % 60},{(m + 2) % 60} * * * *", float(tick)


def _jsonl(path: Path, prompts: list[str]) -> None:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n" for p in prompts))


def _source(assets: Path, name: str, prompts: list[str]) -> None:
    _jsonl(assets / "sources" / "data" / f"{name}.jsonl", prompts)
    (assets / "sources" / f"{name}.yaml").write_text(f"path: data/{name}.jsonl\nformat: openai\nlicence: test\n")


def _stragglers(token: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get(MARK) == token:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _ticks(instance: dg.DagsterInstance) -> dict[str, list]:
    out = {}
    for state in instance.all_instigator_state():
        out[state.instigator_name] = list(instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=500))
    return out


def _latest(data: Path) -> str | None:
    f = data / "snapshots" / "LATEST"
    return f.read_text().strip() if f.exists() else None


def _snapshot_sources(data: Path, version: str) -> dict[str, int]:
    files = sorted((data / "snapshots" / version / "training_samples").glob("*.parquet"))
    if not files:
        return {}
    df = pl.concat([pl.read_parquet(f, columns=["source"]) for f in files])
    return dict(df.group_by("source").len().iter_rows())


def _freshness_evaluations(instance: dg.DagsterInstance) -> list[tuple[float, bool]]:
    key = dg.AssetCheckKey(dg.AssetKey("training_dataset"), "freshness_check")
    recs = instance.event_log_storage.get_asset_check_execution_history(key, limit=100)
    out = []
    for r in recs:
        ev = r.event and r.event.dagster_event and r.event.dagster_event.event_specific_data
        if ev is not None and hasattr(ev, "passed"):
            out.append((r.event.timestamp, bool(ev.passed)))
    return out


def _wait(what: str, cond, timeout: float, daemon: subprocess.Popen, daemon_log: Path, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise AssertionError(
                f"the daemon exited ({daemon.returncode}) while waiting for: {what}\n" + daemon_log.read_text()[-6000:]
            )
        got = cond()
        if got:
            return got
        time.sleep(interval)
    tail = daemon_log.read_text()[-6000:] if daemon_log.exists() else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for: {what}\n--- daemon log tail ---\n{tail}")


# Its own waits bound it (540 + 360 + 60 + 120 + at most 150 s, each failing with the daemon log's tail); the
# suite-wide 600 s would cut it short on a busy machine (make test runs it at the lowest priority).
@pytest.mark.timeout(1400)
def test_nightly_under_the_real_daemon_publishes_then_fails_loudly(tmp_path: Path) -> None:
    t0 = time.monotonic()
    assets, data, home = tmp_path / "assets", tmp_path / "data", tmp_path / "dagster_home"
    (assets / "sources" / "data").mkdir(parents=True)
    shutil.copytree(PROJECT_ROOT / "assets" / "models", assets / "models")
    _source(assets, "base", ["What is 2 + 2?", "Name a prime number larger than 10."])
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    dg.DagsterInstance.from_config(str(home)).dispose()  # create the SQLite storage now: daemon and CLI would race
    token = f"{os.getpid()}-{time.time_ns()}"
    logs = tmp_path / "logs"
    logs.mkdir()

    sim = Sim(log_path=logs / "sim.log", env={MARK: token})
    cron, cron_tick = _cron_from(after_s=75)  # after the daemon and the CLI calls below have turned it on
    env = {
        **os.environ,
        **FAST,
        "EAGLE3_NIGHTLY_CRON": cron,
        MARK: token,
        "DAGSTER_HOME": str(home),
        "EAGLE3_ASSETS_DIR": str(assets),
        "EAGLE3_DATA_DIR": str(data),
        "EAGLE3_SGLANG_URL": sim.url,
        "PYTHONUNBUFFERED": "1",
    }
    daemon_log = logs / "daemon.log"
    daemon = None
    try:
        with open(daemon_log, "wb") as out:
            daemon = subprocess.Popen(
                [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                cwd=PROJECT_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Turn everything on through the CLI, as the README says: sensors first (a run-status sensor
        # only sees runs that end after its first tick), then the schedule.
        for kind in ("sensor", "schedule"):
            r = subprocess.run(
                [str(BIN / "dagster"), kind, "start", "--start-all", "-w", "workspace.yaml"],
                cwd=PROJECT_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert r.returncode == 0, f"dagster {kind} start --start-all failed:\n{r.stdout}\n{r.stderr}"
        t_on = time.monotonic() - t0
        _source(
            assets,
            "extra",
            ["Nightly marker question one?", "Nightly marker question two?", "Nightly marker question three?"],
        )

        with dg.DagsterInstance.from_config(str(home)) as instance:
            # ---------------------------------------------------------------- part 1: it regenerates
            def published_with_extra():
                done = instance.get_runs(dg.RunsFilter(job_name="publish", statuses=[dg.DagsterRunStatus.SUCCESS]))
                v = _latest(data)
                return (done, v) if done and v and _snapshot_sources(data, v).get("extra") == 3 else None

            publish, version = _wait(
                "a successful publish run whose LATEST snapshot holds the new source's 3 rows",
                published_with_extra,
                540,
                daemon,
                daemon_log,
            )
            t_published = time.monotonic() - t0
            assert _snapshot_sources(data, version) == {"base": 2, "extra": 3}
            manifest = json.loads((data / "snapshots" / version / "manifest.json").read_text())
            assert manifest["rows"] == 5 and [s["included"] for s in manifest["shards"]] == [True, True]

            # the chain ran as daemon runs: ingest -> one shard run per shard -> publish, tied by the night tag
            assert all(r.tags.get("dagster/sensor_name") == "nightly" for r in publish)
            night = publish[0].tags["eagle3/night"]
            shards = instance.get_runs(dg.RunsFilter(job_name="shard_pipeline", tags={"eagle3/night": night}))
            assert sorted(r.tags["dagster/partition"] for r in shards) == ["0000", "0001"]
            assert all(
                r.status == dg.DagsterRunStatus.SUCCESS and r.tags.get("dagster/sensor_name") == "nightly"
                for r in shards
            )
            ingest = instance.get_run_by_id(night)
            assert ingest.job_name == "ingest" and ingest.status == dg.DagsterRunStatus.SUCCESS
            starters = {
                r.tags.get("dagster/schedule_name") or r.tags.get("dagster/sensor_name")
                for r in instance.get_runs(dg.RunsFilter(job_name="ingest"))
            }
            assert "prompt_source_sensor" in starters

            # no tick of any schedule or sensor failed
            ticks = _ticks(instance)
            failed = {
                n: [t.error.message if t.error else "" for t in ts if t.status.value == "FAILURE"]
                for n, ts in ticks.items()
            }
            assert not any(failed.values()), f"failed ticks: {failed}"
            assert any(t.status.value == "SUCCESS" for t in ticks["nightly"])
            assert any(ok for _, ok in _freshness_evaluations(instance)), "the freshness check never passed"

            # ---------------------------------------------------------------- part 2: a broken night is loud
            sim.kill()
            t_kill = time.time()
            latest_before = _latest(data)
            _source(assets, "late", ["A prompt that arrives while the server is down?"])

            def failed_night():
                recs = instance.get_run_records(
                    dg.RunsFilter(job_name="shard_pipeline", statuses=[dg.DagsterRunStatus.FAILURE])
                )
                return [r.dagster_run for r in recs if r.end_time and r.end_time > t_kill]

            failed_runs = _wait("a failed shard run after the simulator stopped", failed_night, 360, daemon, daemon_log)
            bad_nights = {r.tags["eagle3/night"] for r in failed_runs}
            _wait(
                "nightly_failed saying the night published nothing",
                lambda: [
                    t
                    for t in _ticks(instance)["nightly_failed"]
                    if t.skip_reason
                    and "nothing published, LATEST unchanged" in t.skip_reason
                    and any(n in t.skip_reason for n in bad_nights)
                ],
                60,
                daemon,
                daemon_log,
            )
            _wait(
                "the freshness check on training_dataset failing",
                lambda: [e for e in _freshness_evaluations(instance) if e[0] > t_kill and not e[1]],
                120,
                daemon,
                daemon_log,
            )
            assert _latest(data) == latest_before
            for n in bad_nights:
                assert not instance.get_runs(dg.RunsFilter(job_name="publish", tags={"eagle3/night": n})), (
                    f"night {n} had a failed shard run but was published"
                )
            # the cron fired too (a night of its own, on a dead server by now); no tick of any schedule or sensor failed
            _wait(
                f"a tick of nightly_regeneration (cron {cron!r} UTC)",
                lambda: _ticks(instance).get("nightly_regeneration"),
                max(cron_tick - time.time(), 0) + 75,
                daemon,
                daemon_log,
            )
            ticks = _ticks(instance)
            assert {
                "nightly_regeneration",
                "nightly",
                "nightly_failed",
                "prompt_source_sensor",
                "snapshot_freshness",
            } <= set(ticks)
            failed = {
                n: [t.error.message if t.error else "" for t in ts if t.status.value == "FAILURE"]
                for n, ts in ticks.items()
            }
            assert not any(failed.values()), f"failed ticks: {failed}"
            t_loud = time.monotonic() - t0
        print(
            f"nightly daemon test: automation on at {t_on:.0f}s, published at {t_published:.0f}s, "
            f"{len(failed_runs)} failed shard run(s) and a failed freshness check at {t_loud:.0f}s"
        )
    finally:
        if daemon is not None:
            _kill_group(daemon)
        sim.kill()
        # The daemon starts its code server (and that server the run workers) in their own sessions;
        # they would exit on their own once the daemon's heartbeats stop. Stop them now, by pid.
        left = _stragglers(token)
        for p in left:
            p.terminate()
        _, alive = psutil.wait_procs(left, timeout=10)
        for p in alive:
            p.kill()
        psutil.wait_procs(alive, timeout=5)
    assert not _stragglers(token), "processes started by this test still running after cleanup"
