"""Materialize the graph on a Dagster instance from Python: ingest once, then each shard.

Used by `eagle3 demo` and by the end-to-end tests, so what they exercise is the real graph,
its real checks and a real instance (runs show up in the UI afterwards).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import psutil

from ..config import PartitionKeyError
from .asset_names import REPORT_ASSET, REPORT_NOT_WRITTEN, REPORT_WRITTEN, SHARD_ASSETS, AssetName, stage_assets
from .console import one_line_console_logger
from .metadata import JUDGED_KEY
from .pools import GENERATE_POOL

# Dagster's console logger defaults to DEBUG (every engine event); progress and results are INFO.
QUIET = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


# Runs started from Python here are executed by this process (in-process executor). If the process
# dies (SIGKILL, OOM, a lost node), Dagster keeps the run STARTED and its claimed "sglang" pool slot
# forever: with a pool limit of 2, two such deaths stall every later generation step. These tags
# let the next run on this host recognise a dead owner and give the slot back.
HOST_TAG = "eagle3/host"
PID_TAG = "eagle3/pid"
PID_STARTED_TAG = "eagle3/pid_started"
# Every run of one materialize_graph call (ingest, each shard, publish) carries the same value: the
# shards' generation steps share one endpoint wait through it (generate/run_wait.py).
GRAPH_RUN_TAG = "eagle3/graph_run"
BACKFILL_TAG = "dagster/backfill"  # Dagster's own tag on every run of a backfill
PARENT_RUN_TAG = "dagster/parent_run_id"  # set on a re-execution (which inherits its parent's tags)
# The UI lists a job's runs by job name AND this tag (its code location, as workspace.yaml's entry is named:
# "<repository>@<module>:<attribute>"); a run executed in process carries it only when given.
REPOSITORY_LABEL_TAG = ".dagster/repository"
UI_REPOSITORY_LABEL = "__repository__@eagle3_dagster.definitions:defs"


def graph_run_key(tags: Mapping[str, str], run_id: str) -> str:
    """Which shards share one endpoint wait: those of one materialize_graph call, else of one backfill, else
    of one Dagster run. A re-execution (someone fixed the fleet and retries) waits on its own."""
    if PARENT_RUN_TAG in tags:
        return run_id
    return tags.get(GRAPH_RUN_TAG) or tags.get(BACKFILL_TAG) or run_id


def owner_tags() -> dict[str, str]:
    me = psutil.Process()
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(me.pid), PID_STARTED_TAG: f"{me.create_time():.3f}"}


def _owner_alive(tags: Mapping[str, str]) -> bool:
    try:
        proc = psutil.Process(int(tags[PID_TAG]))
        # a recycled pid belongs to a process created later than the run's owner
        return abs(proc.create_time() - float(tags[PID_STARTED_TAG])) < 0.01
    except (psutil.NoSuchProcess, KeyError, ValueError):
        return False


def free_pool_slots(instance: dg.DagsterInstance, run_id: str) -> None:
    """Give back the pool slots a dead run still holds. Dagster 1.13 frees them only from the daemon's run
    monitoring (`free_slots_after_run_end_seconds`), through this same storage call; the demo and the
    tests run without a daemon, and without it two killed runs leave the `sglang` pool stalled
    (tests/reliability/test_fault_matrix.py). No public instance method does this in 1.13."""
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)


def prime_pools(instance: dg.DagsterInstance, pools: Sequence[str] = (GENERATE_POOL,)) -> list[str]:
    """Give each pool without a limit yet its row at the instance's `default_limit`, before any run claims a slot.

    Dagster 1.13 creates a pool's row on the first claim. On PostgreSQL, shard runs claiming it at the same
    moment on a fresh instance race on that insert, and one run fails (`UniqueViolation ...
    concurrency_limits_concurrency_key_key`, seen with four shard runs at once:
    tests/reliability/test_postgres_pool.py). This makes the storage call the first claim would make (same row,
    same `using_default_limit`) once, from one process: at instance set-up and at the start of each graph run.
    A pool that has a row (a limit set with `dagster instance concurrency set`) is left as it is. Returns the
    pools it created; a failure (another process created it meanwhile) is logged, and the claim does it then."""
    storage = instance.event_log_storage
    if instance.global_op_concurrency_default_limit is None or not storage.supports_global_concurrency_limits:
        return []
    created = []
    for pool in sorted(set(pools) - set(storage.get_concurrency_keys())):
        try:
            storage.initialize_concurrency_limit_to_default(pool)
            created.append(pool)
        except Exception as e:  # the first claim creates it, as it would without this
            logging.getLogger(__name__).warning("pool %s: its limit row was not created ahead of the runs: %s", pool, e)
    return created


def reap_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Fail the unfinished runs of this host whose owning process is gone, and free their pool slots.

    Only runs carrying our owner tags are touched; runs launched by the daemon or `dg launch` are
    watched by Dagster's own run monitoring (docs/scale-out.md).
    """
    host = socket.gethostname()
    unfinished = instance.get_runs(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING], tags={HOST_TAG: host}
        )
    )
    reaped = []
    for run in unfinished:
        if run.tags.get(PID_TAG) == str(os.getpid()) or _owner_alive(run.tags):
            continue
        instance.report_run_failed(
            run,
            f"the process that ran this run (pid {run.tags.get(PID_TAG)} on {host}) is gone; "
            "marked failed and its concurrency slots freed before a new run",
        )
        free_pool_slots(instance, run.run_id)
        reaped.append(run.run_id)
    return reaped


def cancel_own_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark this process's unfinished runs CANCELING (a stop was asked for: Ctrl-C, SIGTERM).

    The in-process executor then ends the interrupted run as CANCELED, not as a failure.
    """
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING],
            tags={HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())},
        )
    )
    for run in runs:
        instance.report_run_canceling(
            run, message="stop requested (Ctrl-C / SIGTERM): the run is canceled; a rerun resumes from what was stored"
        )
    return [r.run_id for r in runs]


def graph_shard_keys(defs: dg.Definitions) -> list[str]:
    """The shard keys of `defs`: the partitions of its shard assets ([] for a test's definitions without one)."""
    for asset in defs.assets or []:
        if isinstance(asset, dg.AssetsDefinition) and asset.partitions_def is not None:
            if any(dg.AssetKey(name) in asset.keys for name in SHARD_ASSETS):
                return list(asset.partitions_def.get_partition_keys())
    return []


def check_shard_keys(shards: list[str] | None, valid: list[str]) -> None:
    """Refuse unknown shard keys before anything is written, listing the valid ones (the partitions the
    definitions were built with: `graph_shard_keys`, or `partitions.shard_keys(s.n_shards)`)."""
    bad = [k for k in shards or [] if k not in valid]
    if bad:
        shown = ", ".join(valid) if len(valid) <= 16 else f"{', '.join(valid[:8])}, ..., {valid[-1]}"
        raise PartitionKeyError(
            f"unknown shard key(s) {', '.join(repr(k) for k in bad)}; valid keys ({len(valid)}, from EAGLE3_N_SHARDS): {shown}"
        )


@dataclass
class ShardOutcome:
    shard: str
    success: bool
    checks: dict[str, bool] = field(default_factory=dict)  # "asset:check" -> passed
    materialized: list[str] = field(default_factory=list)
    skipped_or_failed: list[str] = field(default_factory=list)
    run_id: str = ""
    failed_checks: dict[str, str] = field(default_factory=dict)  # "asset:check" -> "ERROR" | "WARN"
    errors: list[str] = field(default_factory=list)  # one line per failed step: "step: message"
    not_judged: list[str] = field(default_factory=list)  # "asset:check" that passed with judged: false

    @property
    def ok(self) -> bool:
        """The run succeeded and no ERROR-severity check failed (WARN ones are warnings)."""
        return self.success and "ERROR" not in self.failed_checks.values()


@dataclass
class GraphOutcome:
    ingest_success: bool
    ingest_run_id: str
    shards: list[ShardOutcome]
    publish_success: bool | None = None  # None: not attempted
    snapshot_version: str | None = None
    # the publish run's asset checks (publish_gate, drift_gate): name -> (passed, severity, description)
    publish_checks: dict[str, tuple[bool, str, str]] = field(default_factory=dict)
    publish_run_id: str = ""
    reaped_runs: list[str] = field(default_factory=list)  # dead runs failed and freed before starting
    stopped: bool = False  # a stop was requested: the remaining shards and the snapshot were not started
    ingest_failed_checks: dict[str, str] = field(default_factory=dict)  # "asset:check" -> "ERROR" | "WARN"
    ingest_errors: list[str] = field(default_factory=list)
    publish_failed_checks: dict[str, str] = field(default_factory=dict)
    publish_errors: list[str] = field(default_factory=list)
    # WARNING lines the runs' steps logged ("<run>: <message>"), in run order, at most MAX_LOGGED a run
    logged_warnings: list[str] = field(default_factory=list)
    # the quality report's last write failed (the warning's text): the report on disk is an earlier run's
    report_error: str | None = None

    @property
    def success(self) -> bool:
        """The data steps succeeded (data_success) and the quality report was written."""
        return self.data_success and self.report_error is None

    @property
    def data_success(self) -> bool:
        """Every run succeeded and no ERROR-severity check failed anywhere (ingest, shards, publish)."""
        no_errors = "ERROR" not in (*self.ingest_failed_checks.values(), *self.publish_failed_checks.values())
        return (
            self.ingest_success
            and all(s.ok for s in self.shards)
            and self.publish_success is not False
            and no_errors
            and not self.stopped
        )

    @property
    def warnings(self) -> list[str]:
        """Failed WARN-severity checks, as "asset:check" names (shard checks prefixed with the shard)."""
        out = [c for c, sev in self.ingest_failed_checks.items() if sev == "WARN"]
        out += [f"shard {s.shard} {c}" for s in self.shards for c, sev in s.failed_checks.items() if sev == "WARN"]
        out += [c for c, sev in self.publish_failed_checks.items() if sev == "WARN"]
        return out + self.logged_warnings

    def note_logs(self, instance: dg.DagsterInstance, run_id: str, what: str) -> None:
        """Take in one run's logged warnings and what became of its quality report writes."""
        warnings, report = run_log_warnings(instance, run_id, what)
        self.logged_warnings += warnings
        if report is not None:
            self.report_error = report or None


MAX_LOGGED = 10  # warnings a run contributes to the summary; the rest are counted, in the run's log


def run_log_warnings(instance: dg.DagsterInstance, run_id: str, what: str) -> tuple[list[str], str | None]:
    """The WARNING lines the steps of a run logged (not Dagster's own events), distinct, in order, as
    "<what>: <first line>"; and the run's last quality-report outcome: the failure, "" (written) or None."""
    seen: dict[str, None] = {}
    report: str | None = None
    for rec in instance.all_logs(run_id):
        if rec.dagster_event is not None or not rec.user_message:
            continue
        level = rec.level if isinstance(rec.level, int) else logging.getLevelName(str(rec.level))
        msg = rec.user_message.strip().splitlines()[0]
        if msg.startswith(REPORT_WRITTEN):
            report = ""
        if level != logging.WARNING:
            continue
        if msg.startswith(REPORT_NOT_WRITTEN):
            report = msg
        seen.setdefault(msg, None)
    lines = [f"{what}: {m}" for m in list(seen)[:MAX_LOGGED]]
    if len(seen) > MAX_LOGGED:
        lines.append(f"{what}: {len(seen) - MAX_LOGGED} more distinct warning(s) in run {run_id} (`make ui`)")
    return lines, report


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for ev in result.get_asset_check_evaluations():
        out[f"{ev.asset_key.to_user_string()}:{ev.check_name}"] = bool(ev.passed)
    return out


def _not_judged(result: dg.ExecuteInProcessResult) -> list[str]:
    """The checks that passed without judging anything (metadata `judged: false`, metadata.JUDGED_KEY)."""
    out = []
    for ev in result.get_asset_check_evaluations():
        judged = ev.metadata.get(JUDGED_KEY)
        if judged is not None and getattr(judged, "value", judged) is False:
            out.append(f"{ev.asset_key.to_user_string()}:{ev.check_name}")
    return out


def _failed_checks(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    return {
        f"{ev.asset_key.to_user_string()}:{ev.check_name}": ev.severity.value
        for ev in result.get_asset_check_evaluations()
        if not ev.passed
    }


def _words(message: str) -> str:
    """ "dagster.<module path>.Failure: ..." / "eagle3_dagster.ingest.errors.IngestFileError: ...":
    the user's words, without the exception's module path."""
    return re.sub(r"^[A-Za-z_][\w.]*\.(\w+): ", "", message.strip())


def _errors(result: dg.ExecuteInProcessResult) -> list[str]:
    """One line per failed step: the step and the first line of its error (dg.Failure: the description)."""
    out = []
    for ev in result.get_step_failure_events():
        err = ev.step_failure_data.error
        # an unexpected exception is wrapped ("Error occurred while executing op ..."): its cause says why
        while err is not None and _words(err.message).startswith("Error occurred while executing") and err.cause:
            err = err.cause
        msg = _words(err.message if err else "failed")
        out.append(f"{ev.step_key}: {msg.splitlines()[0] if msg else 'failed'}")
    return out


def run_named_job(
    defs: dg.Definitions,
    job: str,
    selection: dg.AssetSelection,
    *,
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any] | None,
    partition_key: str | None,
    run_config: Mapping[str, Any],
    tags: Mapping[str, str],
) -> dg.ExecuteInProcessResult:
    """One run of the project's job `job` (ingest, shard_pipeline, publish), in this process: the UI's Jobs
    and Runs pages show its history under that name. Definitions without that job (a test's own) get an
    ad-hoc run of `selection`. The console shows one line per event, the stack traces stay in the event log."""
    try:
        job_def = defs.resolve_job_def(job)
    except Exception:
        res = {**(defs.resources or {}), **(resources or {})}
        assets: list[Any] = list(defs.assets or [])
        return dg.materialize(
            assets,
            selection=selection,
            partition_key=partition_key,
            instance=instance,
            resources=res,
            raise_on_error=False,
            run_config=dict(run_config),
            tags=dict(tags),
        )
    return job_def.with_logger_defs({"console": one_line_console_logger}).execute_in_process(
        run_config=dict(run_config),
        instance=instance,
        partition_key=partition_key,
        raise_on_error=False,
        tags={**tags, REPOSITORY_LABEL_TAG: UI_REPOSITORY_LABEL},
        resources=dict(resources or {}),
    )


@dataclass
class GraphRunner:
    """The runs of one materialize_graph call: the same definitions, instance, resources, config and tags."""

    defs: dg.Definitions
    instance: dg.DagsterInstance
    resources: dict[str, Any] | None
    run_config: Mapping[str, Any]
    tags: Mapping[str, str]

    def run(self, job: str, selection: dg.AssetSelection, partition_key: str | None) -> dg.ExecuteInProcessResult:
        return run_named_job(
            self.defs,
            job,
            selection,
            instance=self.instance,
            resources=self.resources,
            partition_key=partition_key,
            run_config=self.run_config,
            tags=self.tags,
        )

    def shard(self, key: str) -> ShardOutcome:
        """One shard's tokenize -> generate -> train run."""
        r = self.run("shard_pipeline", dg.AssetSelection.assets(*SHARD_ASSETS), key)
        done = sorted({e.asset_key.to_user_string() for e in r.get_asset_materialization_events() if e.asset_key})
        return ShardOutcome(
            shard=key,
            success=r.success,
            checks=_checks(r),
            materialized=done,
            skipped_or_failed=[a for a in SHARD_ASSETS if a not in done],
            run_id=r.run_id,
            failed_checks=_failed_checks(r),
            errors=_errors(r),
            not_judged=_not_judged(r),
        )

    def publish(self, outcome: GraphOutcome, stop: Callable[[], bool]) -> None:
        """The snapshot run, recorded on `outcome`: its checks, errors, warnings and the version published."""
        r = self.run("publish", dg.AssetSelection.assets(AssetName.TRAINING_DATASET), None)
        outcome.publish_success = r.success
        outcome.publish_run_id = r.run_id
        for ev in r.get_asset_check_evaluations():
            outcome.publish_checks[ev.check_name] = (bool(ev.passed), ev.severity.value, ev.description or "")
        outcome.publish_failed_checks, outcome.publish_errors = _failed_checks(r), _errors(r)
        outcome.note_logs(self.instance, r.run_id, "publish")
        outcome.stopped = stop()  # a stop during publish: honoured before LATEST moved, or came after it
        for mev in r.get_asset_materialization_events():
            version = mev.materialization.metadata.get("version")
            outcome.snapshot_version = getattr(version, "value", None)

    def report(self, outcome: GraphOutcome) -> None:
        """The quality report run (its own asset: the gated steps never render it), recorded on `outcome`."""
        r = self.run("report", dg.AssetSelection.assets(REPORT_ASSET), None)
        outcome.note_logs(self.instance, r.run_id, "report")
        if not r.success and outcome.report_error is None:  # a crash before the report step could log why
            outcome.report_error = f"{REPORT_NOT_WRITTEN}: " + "; ".join(_errors(r) or ["the report run failed"])


def _ingest_failed(r: dg.ExecuteInProcessResult, reaped: list[str], instance: dg.DagsterInstance) -> GraphOutcome:
    """The outcome of a graph that ends after its ingest run: the ingest failed, or a stop came during it."""
    early = GraphOutcome(
        False,
        r.run_id,
        [],
        reaped_runs=reaped,
        ingest_failed_checks={} if r.success else _failed_checks(r),
        ingest_errors=[] if r.success else _errors(r),
        stopped=r.success,
    )
    early.note_logs(instance, r.run_id, "ingest")
    return early


def materialize_graph(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    shards: list[str] | None = None,
    resources: dict[str, Any] | None = None,
    run_ingest: bool = True,
    run_publish: bool = False,
    run_config: dict[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> GraphOutcome:
    """Ingest, then each shard's tokenize -> generate -> train run, then (optionally) the snapshot, then the
    quality report (when a shard or the snapshot ran).

    A failed shard does not stop the others, and the snapshot step still runs: it records which
    shards it left out and why. When `should_stop()` turns true (Ctrl-C / SIGTERM), no further run
    is started: the outcome says `stopped`.
    """
    keys = graph_shard_keys(defs)  # the partitions these definitions were built with
    if shards is None and not keys:  # "every shard" of definitions without any: nothing would be generated
        raise ValueError("these definitions have no shard assets: a graph run over every shard would generate nothing")
    check_shard_keys(shards, keys)  # before anything is written: an unknown key lists the valid ones
    stop = should_stop or (lambda: False)
    reaped = reap_dead_runs(instance)
    prime_pools(instance)
    tags = {**owner_tags(), GRAPH_RUN_TAG: uuid.uuid4().hex}
    runner = GraphRunner(defs, instance, resources, run_config or QUIET, tags)
    ingest: dg.ExecuteInProcessResult | None = None
    if run_ingest:
        ingest = runner.run("ingest", stage_assets("ingest"), None)
        if not ingest.success or stop():
            return _ingest_failed(ingest, reaped, instance)
    outcomes = []
    for key in shards if shards is not None else keys:
        if stop():
            break
        outcomes.append(runner.shard(key))
    outcome = GraphOutcome(
        ingest.success if ingest else True,
        ingest.run_id if ingest else "",
        outcomes,
        reaped_runs=reaped,
        stopped=stop(),
        ingest_failed_checks=_failed_checks(ingest) if ingest else {},
        ingest_errors=_errors(ingest) if ingest else [],
    )
    if ingest:
        outcome.note_logs(instance, ingest.run_id, "ingest")
    for sh in outcomes:
        outcome.note_logs(instance, sh.run_id, f"shard {sh.shard}")
    if run_publish and not outcome.stopped:
        runner.publish(outcome, stop)
    if (outcomes or run_publish) and not outcome.stopped and has_asset(defs, REPORT_ASSET):
        runner.report(outcome)
    return outcome


def has_asset(defs: dg.Definitions, name: str) -> bool:
    """Whether `defs` holds the asset (a test's own definitions may leave the report out)."""
    return any(dg.AssetKey(name) in a.keys for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition))
