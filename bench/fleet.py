"""Benchmark: is the fleet kept busy across a multi-shard backfill launched through the real daemon?

    .venv/bin/python bench/fleet.py [--shards 16] [--workers 2] [--prompts-per-shard 64]
                                    [--max-running 8] [--token-latency-ms 25] [--output-tokens N]
                                    [--work DIR] [--only backfill|single]

Two phases in the same run, on one instance and one daemon, exactly as a user runs a backfill
(EAGLE3_N_SHARDS is --shards + 1: the last shard is the single-shard phase, so nothing is cached
between the phases; the simulators are restarted before each, so their counters are the phase's):

1. `--workers` simulator processes (`eagle3-sim`, real HTTP) with `--max-running-requests`
   slots each and `--token-latency-ms` per output token (one JSON answer per request).
2. `eagle3 check` with EAGLE3_SGLANG_URL naming them: it probes their /server_info and writes the
   instance's `sglang` pool and run-queue limits (orchestration/pools.py) into dagster.yaml.
3. `dagster-daemon run` on that instance; the `ingest` job launched through the run queue
   (`dagster job launch`); then the shard partitions backfilled through the GraphQL mutation the
   UI's "Materialize -> Launch backfill" dialog sends (`launchPartitionBackfill` with the three
   shard assets and the partition names), executed by `dagster-graphql` against the workspace:
   the backfill daemon turns it into one run per shard, the run queue starts them.
4. The figure, from the simulators' counters (`/_sim/stats`):
       fleet busy = Σ completion_tokens * token latency / (Σ slots * (last answer - first request))
   i.e. the share of the fleet's slot-time spent decoding, between the first request and the last
   answer of the phase. `slot_busy` beside it is the same from the time requests held a slot.

Phase `single` backfills the extra shard alone (its tail is what a single shard loses); phase
`backfill` the other `--shards` in one backfill. Last stdout line: one JSON object with both
figures, the pool sizing, the most `generations` steps that ran at once (from the instance's event
log), the runs' start/end times, and the load average (a loaded machine slows the Dagster
processes, not the simulated GPUs).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# bench/ holds tokenize.py, which shadows the stdlib module when bench/ is sys.path[0].
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from eagle3_dagster.config import PROJECT_ROOT, apply_project_env_defaults
from eagle3_dagster.sim.process import SimProcess, free_port, start_simulator

BIN = Path(sys.executable).parent
SHARD_ASSETS = ("tokenized_prompts", "generations", "training_samples")
BACKFILL_MUTATION = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}
"""
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}


def write_source(assets: Path, n_prompts: int) -> None:
    """A prompt source of `n_prompts` distinct questions, with the project's model profiles."""
    (assets / "sources" / "data").mkdir(parents=True, exist_ok=True)
    shutil.copytree(PROJECT_ROOT / "assets" / "models", assets / "models", dirs_exist_ok=True)
    rows = (
        json.dumps({"messages": [{"role": "user", "content": f"Fleet question {i}: what is {i} times {i % 97 + 3}?"}]})
        for i in range(n_prompts)
    )
    (assets / "sources" / "data" / "fleet.jsonl").write_text("\n".join(rows) + "\n")
    (assets / "sources" / "fleet.yaml").write_text("path: data/fleet.jsonl\nformat: openai\nlicence: bench\n")


def start_workers(n: int, args: argparse.Namespace, logs: Path) -> list[SimProcess]:
    sim_args = [
        "--log-level",
        "WARNING",
        "--max-running-requests",
        str(args.max_running),
        "--token-latency-ms",
        str(args.token_latency_ms),
        "--drain-timeout",
        "2",
    ]
    if args.output_tokens:
        sim_args += ["--output-tokens-mean", str(args.output_tokens)]
    return [start_simulator(port=free_port(), extra_args=sim_args, log_dir=logs) for _ in range(n)]


def _run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> str:
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def _wait(what: str, cond: Any, timeout: float, daemon: subprocess.Popen, log: Path, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(
                f"the daemon exited ({daemon.returncode}) waiting for {what}:\n{log.read_text()[-4000:]}"
            )
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}:\n{log.read_text()[-4000:]}")


def launch_backfill(partitions: list[str], env: dict[str, str]) -> str:
    """The UI's backfill: launchPartitionBackfill for the shard assets over `partitions`; its id."""
    params = {
        "assetSelection": [{"path": [a]} for a in SHARD_ASSETS],
        "partitionNames": partitions,
        "fromFailure": False,
        "tags": [{"key": "eagle3/bench", "value": "fleet"}],
    }
    out = _run(
        [
            str(BIN / "dagster-graphql"),
            "-w",
            "workspace.yaml",
            "-t",
            BACKFILL_MUTATION,
            "-v",
            json.dumps({"backfillParams": params}),
        ],
        env,
    )
    first = next(ln for ln in out.splitlines() if ln.startswith("{"))  # the result; log lines may follow
    answer = json.loads(first)["data"]["launchPartitionBackfill"]
    if answer["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"launchPartitionBackfill: {answer}")
    return answer["backfillId"]


def step_intervals(instance: Any, run_ids: list[str], step: str = "generations") -> list[tuple[float, float]]:
    """(start, end) of each run's `step` from the event log: STEP_START to STEP_SUCCESS/FAILURE."""
    import dagster as dg

    out = []
    kinds = {dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE}
    for rid in run_ids:
        start = None
        for rec in instance.all_logs(rid, of_type=kinds):
            if rec.step_key != step or rec.dagster_event is None:
                continue
            if rec.dagster_event.event_type == dg.DagsterEventType.STEP_START:
                start = rec.timestamp
            elif start is not None:
                out.append((start, rec.timestamp))
                start = None
    return out


def max_concurrent(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at the same time)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def fleet_busy(stats: list[dict[str, Any]], token_latency_ms: float) -> dict[str, Any]:
    """fleet busy = Σ tokens * latency / (Σ slots * wall from the first request to the last answer)."""
    firsts = [s["first_request_at"] for s in stats if s["first_request_at"]]
    lasts = [s["last_answer_at"] for s in stats if s["last_answer_at"]]
    if not firsts or not lasts:
        raise RuntimeError(f"the simulators answered nothing: {stats}")
    wall = max(lasts) - min(firsts)
    slots = sum(s["max_running_requests"] for s in stats)
    tokens = sum(s["completion_tokens"] for s in stats)
    return {
        "fleet_busy": round(tokens * token_latency_ms / 1000 / (slots * wall), 4),
        "slot_busy": round(sum(s["slot_seconds"] for s in stats) / (slots * wall), 4),
        "wall_s": round(wall, 2),
        "completion_tokens": tokens,
        "requests": sum(s["items"] for s in stats),
        "slots": slots,
        "ideal_s": round(tokens * token_latency_ms / 1000 / slots, 2),
    }


class Fleet:
    """The simulators, `eagle3 check`, the daemon and the ingest run of one bench: set up once."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.home, self.logs = args, work / "dagster_home", work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.daemon_log = self.logs / "daemon.log"
        self.sims = start_workers(args.workers, args, self.logs)
        self.daemon: subprocess.Popen | None = None
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(self.home),
            "EAGLE3_ASSETS_DIR": str(work / "assets"),
            "EAGLE3_DATA_DIR": str(work / "data"),
            "EAGLE3_N_SHARDS": str(args.shards + 1),  # the extra (last) shard is the single-shard phase
            "EAGLE3_SGLANG_URL": ",".join(s.url for s in self.sims),
            "EAGLE3_EXECUTOR": args.executor,
            "EAGLE3_STREAM": "1" if args.stream else "0",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self) -> str:
        """`eagle3 check` (sizes the pool from the simulators), the daemon, the ingest run; the check's pool line."""
        import dagster as dg

        check_line = _run([str(BIN / "eagle3"), "check"], self.env).strip().splitlines()[-1]
        with open(self.daemon_log, "wb") as out:
            self.daemon = subprocess.Popen(
                [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                cwd=PROJECT_ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _run([str(BIN / "dagster"), "job", "launch", "-j", "ingest", "-w", "workspace.yaml"], self.env)
        with dg.DagsterInstance.from_config(str(self.home)) as instance:

            def ingested() -> bool:
                runs = instance.get_runs(dg.RunsFilter(job_name="ingest"))
                if runs and runs[0].status.value in ("FAILURE", "CANCELED"):
                    raise RuntimeError(f"the ingest run failed:\n{self.daemon_log.read_text()[-4000:]}")
                return bool(runs) and runs[0].status.value == "SUCCESS"

            self._wait("the ingest run", ingested, 600)
        return check_line

    def _wait(self, what: str, cond: Any, timeout: float) -> Any:
        assert self.daemon is not None
        return _wait(what, cond, timeout, self.daemon, self.daemon_log)

    def backfill(self, partitions: list[str]) -> dict[str, Any]:
        """Backfill `partitions` (the UI's mutation) on freshly restarted simulators; the figures."""
        import dagster as dg

        for sim in self.sims:  # fresh counters: first request and last answer are this backfill's
            sim.restart()
        t_launch = time.time()
        backfill = launch_backfill(partitions, self.env)
        with dg.DagsterInstance.from_config(str(self.home)) as instance:

            def finished() -> list[Any] | None:
                recs = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill}))
                done = [r for r in recs if r.dagster_run.status.value in FINISHED]
                return recs if len(done) == len(partitions) and len(recs) == len(partitions) else None

            recs = self._wait(f"{len(partitions)} shard runs of backfill {backfill}", finished, self.args.timeout)
            gens = step_intervals(instance, [r.dagster_run.run_id for r in recs])
        runs = sorted(
            (
                {
                    "shard": r.dagster_run.tags.get("dagster/partition"),
                    "status": r.dagster_run.status.value,
                    "start": round(r.start_time or 0.0, 3),
                    "end": round(r.end_time or 0.0, 3),
                }
                for r in recs
            ),
            key=lambda r: r["start"],
        )
        stats = [httpx.get(s.url + "/_sim/stats", timeout=10).json() for s in self.sims]
        return {
            **fleet_busy(stats, self.args.token_latency_ms),
            "shards": len(partitions),
            "failed_shards": [r["shard"] for r in runs if r["status"] != "SUCCESS"],
            "max_concurrent_generations": max_concurrent(gens),
            "max_concurrent_runs": max_concurrent([(r["start"], r["end"]) for r in runs]),
            "backfill_to_first_request_s": round(min(s["first_request_at"] for s in stats) - t_launch, 2),
            "runs": runs,
            "generations_steps": [[round(a, 3), round(b, 3)] for a, b in sorted(gens)],
        }

    def stop(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            os.killpg(self.daemon.pid, signal.SIGTERM)
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.daemon.pid, signal.SIGKILL)
        for s in self.sims:
            s.stop(timeout=5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/fleet.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="simulator processes (SGLang servers)")
    ap.add_argument("--prompts-per-shard", type=int, default=64, help="mean prompts per shard (hash sharding)")
    ap.add_argument("--max-running", type=int, default=8, help="--max-running-requests of each simulator")
    ap.add_argument(
        "--token-latency-ms", type=float, default=25.0, help="a shard's generation must outlast a run's set-up"
    )
    ap.add_argument(
        "--output-tokens", type=int, default=None, help="grow outputs to about N tokens (simulator; default ~260)"
    )
    ap.add_argument("--executor", default="in_process", choices=("in_process", "multiprocess"))
    ap.add_argument("--stream", action="store_true", help="stream answers (SSE; costs client and simulator CPU)")
    ap.add_argument("--only", choices=("backfill", "single"), default=None)
    ap.add_argument("--work", type=Path, default=None, help="keep everything here (default: a temp dir, removed)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for a phase's runs")
    args = ap.parse_args(argv)
    apply_project_env_defaults()  # the shared offline tokenizer, as `eagle3` and `make` use
    work = args.work or Path(tempfile.mkdtemp(prefix="eagle3-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    write_source(work / "assets", (args.shards + 1) * args.prompts_per_shard)
    keys = [f"{i:04d}" for i in range(args.shards + 1)]
    t0 = time.time()
    result: dict[str, Any] = {"bench": "fleet", "workers": args.workers, "max_running": args.max_running}
    fleet = Fleet(args, work)
    try:
        result["pool"] = fleet.start()
        if args.only in (None, "single"):
            result["single"] = fleet.backfill(keys[-1:])
            brief = {k: v for k, v in result["single"].items() if k not in ("runs", "generations_steps")}
            print(f"[fleet] single shard: {json.dumps(brief)}", flush=True)
        if args.only in (None, "backfill"):
            result["backfill"] = fleet.backfill(keys[:-1])
    finally:
        fleet.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result["fleet_busy_backfill"] = result.get("backfill", {}).get("fleet_busy")
    result["fleet_busy_single"] = result.get("single", {}).get("fleet_busy")
    result["target"] = 0.95
    result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    result["cpus"] = os.cpu_count()
    result["bench_wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
