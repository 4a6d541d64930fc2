"""Run the graph on a Dagster instance from this process: ingest, each shard, the snapshot, the report.

Used by `eagle3 demo`, `eagle3 backfill` and the end-to-end tests, so what they exercise is the real graph,
its real checks and a real instance. The order and the publish rule are sequence.next_runs' (the nightly
sensor asks the same function); each run is executed here as a run of the UI's code location
(in_process.py: `make ui` shows them on its first screen) and judged from the instance's records
(run_records.py). Also here: what a run executed in a process that died leaves behind (its pool slots).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import dagster as dg
import psutil

from ..config import PartitionKeyError
from .asset_names import REPORT_ASSET, SHARD_ASSETS, AssetName, stage_assets
from .console import one_line_console_logger
from .in_process import REPOSITORY_LABEL_TAG, UI_REPOSITORY_LABEL, execute_as_ui_run
from .pools import GENERATE_POOL
from .run_records import RunRecord, logged_warnings, read_run
from .sequence import GraphState, Job, NextRun, RunState, next_runs

__all__ = ["REPOSITORY_LABEL_TAG", "UI_REPOSITORY_LABEL", "GraphOutcome", "ShardOutcome", "materialize_graph"]

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
    definitions were built with: `graph_shard_keys`, or `partitions.shard_keys(s.shards.n_shards)`)."""
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

    @classmethod
    def of(cls, record: RunRecord) -> ShardOutcome:
        done = sorted(a for a in record.materialized if a in SHARD_ASSETS)
        return cls(
            shard=record.partition or "",
            success=record.status == dg.DagsterRunStatus.SUCCESS,
            checks={name: v.passed for name, v in record.checks.items()},
            materialized=done,
            skipped_or_failed=[a for a in SHARD_ASSETS if a not in done],
            run_id=record.run_id,
            failed_checks=record.failed_checks,
            errors=record.errors,
            not_judged=record.not_judged,
        )


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
    # the quality report's run failed (its error): the report on disk is an earlier run's
    report_error: str | None = None
    report_run_id: str = ""
    data_docs: str | None = None  # the GX Data Docs index the report built
    # why this graph run asked for no snapshot (a shard did not pass, the ingest failed); "" when it did
    not_published: str = ""
    left_out: list[str] = field(default_factory=list)  # the failed shards a partial snapshot left out (asked for)

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

    def take(self, job: Job, record: RunRecord, warnings: list[str]) -> None:
        """One finished run of this graph run, as the instance recorded it."""
        self.logged_warnings += warnings
        if job is Job.INGEST:
            self.ingest_success, self.ingest_run_id = record.status == dg.DagsterRunStatus.SUCCESS, record.run_id
            self.ingest_failed_checks, self.ingest_errors = record.failed_checks, record.errors
        elif job is Job.SHARD:
            self.shards.append(ShardOutcome.of(record))
        elif job is Job.PUBLISH:
            self.publish_success = record.status == dg.DagsterRunStatus.SUCCESS
            self.publish_run_id = record.run_id
            self.publish_checks = {
                name.split(":", 1)[1]: (v.passed, v.severity, v.description) for name, v in record.checks.items()
            }
            self.publish_failed_checks, self.publish_errors = record.failed_checks, record.errors
            version = record.materialized.get(AssetName.TRAINING_DATASET, {}).get("version")
            self.snapshot_version = None if version is None else str(version)
        elif job is Job.REPORT:
            self.report_run_id = record.run_id
            if record.status != dg.DagsterRunStatus.SUCCESS:  # its step's failure says why ("step: why")
                why = [e.split(": ", 1)[-1] for e in record.errors]
                self.report_error = "; ".join(why) or f"the report run {record.status.value}"
            docs = record.materialized.get(REPORT_ASSET, {}).get("data_docs")
            self.data_docs = str(docs).removeprefix("file://") if docs else None


def _with_job(defs: dg.Definitions, job: Job, resources: Mapping[str, Any]) -> dg.JobDefinition:
    """The definitions' job `job`. Definitions a test builds from some of the project's assets carry none of
    its jobs (nor their resources): for them the job is defined here, over the same selection as
    defs/automation.py defines it, with `resources` bound."""
    if not any(getattr(j, "name", None) == job.value for j in defs.jobs or []):
        selection = {
            Job.INGEST: stage_assets("ingest"),
            Job.SHARD: dg.AssetSelection.assets(*SHARD_ASSETS),
            Job.PUBLISH: dg.AssetSelection.assets(AssetName.TRAINING_DATASET),
            Job.REPORT: dg.AssetSelection.assets(REPORT_ASSET),
        }[job]
        own = dg.Definitions(jobs=[dg.define_asset_job(job.value, selection)], resources=dict(resources))
        defs = dg.Definitions.merge(dg.Definitions(assets=defs.assets, asset_checks=defs.asset_checks), own)
    return defs.resolve_job_def(job.value)


@dataclass
class GraphRunner:
    """The runs of one materialize_graph call: the same definitions, instance, resources, config and tags.
    Each run is executed in this process as a run of the UI's code location (in_process.py), and what it did
    is read back from the instance (run_records.py)."""

    defs: dg.Definitions
    instance: dg.DagsterInstance
    resources: dict[str, Any] | None
    run_config: Mapping[str, Any]
    tags: Mapping[str, str]

    def execute(self, run: NextRun) -> RunRecord:
        resources = {**(self.defs.resources or {}), **(self.resources or {})}
        job_def = _with_job(self.defs, run.job, resources).with_logger_defs({"console": one_line_console_logger})
        config = dict(self.run_config)
        if run.allow_partial:  # training_dataset's config (defs/publish.py PublishConfig)
            config["ops"] = {AssetName.TRAINING_DATASET: {"config": {"allow_partial": True}}}
        run_id = execute_as_ui_run(
            job_def,
            instance=self.instance,
            resources=resources,
            run_config=config,
            partition_key=run.shard,
            tags=self.tags,
        )
        return read_run(self.instance, run_id)


@dataclass(frozen=True)
class GraphScope:
    """Which runs a graph run makes: the ingest, the shards (None: every shard of the definitions), the
    snapshot (`run_publish`), published partial when `allow_partial` asks for it."""

    shards: list[str] | None = None
    run_ingest: bool = True
    run_publish: bool = False
    allow_partial: bool = False


def graph_state(defs: dg.Definitions, scope: GraphScope) -> GraphState:
    """The state of a graph run (over `scope.shards`, None: every shard) before its first run. A call that
    runs no shard and no snapshot (an ingest alone) is no graph run: no report follows it; any other ends
    with the report (when the definitions have it)."""
    keys = graph_shard_keys(defs)
    chosen = keys if scope.shards is None else scope.shards
    report = has_asset(defs, REPORT_ASSET) and (bool(chosen) or scope.run_publish)
    return GraphState(
        ingest=RunState.NOT_RUN if scope.run_ingest else None,
        shards=dict.fromkeys(chosen, RunState.NOT_RUN),
        publish=RunState.NOT_RUN if scope.run_publish else None,
        report=RunState.NOT_RUN if report else None,
        allow_partial=scope.allow_partial,
        covers_every_shard=set(chosen) >= set(keys),
    )


def _after(state: GraphState, run: NextRun, record: RunRecord) -> GraphState:
    """The state once `run` finished as `record` says."""
    st = record.state
    if run.job is Job.INGEST:
        return replace(state, ingest=st)
    if run.job is Job.SHARD:
        return replace(state, shards={**state.shards, str(run.shard): st})
    if run.job is Job.PUBLISH:
        return replace(state, publish=st)
    return replace(state, report=st)


def materialize_graph(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    scope: GraphScope = GraphScope(),
    resources: dict[str, Any] | None = None,
    run_config: dict[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> GraphOutcome:
    """The graph in this process, in the order and by the publish rule of sequence.next_runs: ingest, then each
    shard's tokenize -> generate -> train run, then (with `scope.run_publish`) the snapshot, published only
    when every shard passed unless `scope.allow_partial` asks for a partial one, then the quality report, last.

    A failed shard does not stop the others. When `should_stop()` turns true (Ctrl-C / SIGTERM), no further
    run is started: the outcome says `stopped`.
    """
    keys = graph_shard_keys(defs)  # the partitions these definitions were built with
    shards = scope.shards
    if shards is None and not keys:  # "every shard" of definitions without any: nothing would be generated
        raise ValueError("these definitions have no shard assets: a graph run over every shard would generate nothing")
    check_shard_keys(shards, keys)  # before anything is written: an unknown key lists the valid ones
    stop = should_stop or (lambda: False)
    outcome = GraphOutcome(True, "", [], reaped_runs=reap_dead_runs(instance))
    prime_pools(instance)
    tags = {**owner_tags(), GRAPH_RUN_TAG: uuid.uuid4().hex}
    runner = GraphRunner(defs, instance, resources, run_config or QUIET, tags)
    state = graph_state(defs, scope)
    while not (step := next_runs(replace(state, stopping=stop()))).done:
        if not step.runs:  # a run executed here is finished when execute returns: nothing can be running
            raise RuntimeError(f"the graph run cannot go on: {step.why}")
        for run in step.runs:  # executed in turn
            if stop():
                break
            record = runner.execute(run)
            what = run.job.value if run.shard is None else f"shard {run.shard}"
            outcome.take(run.job, record, logged_warnings(instance, record.run_id, what))
            state = _after(state, run, record)
    outcome.stopped = stop()
    outcome.not_published, outcome.left_out = step.not_published, list(step.left_out)
    return outcome


def has_asset(defs: dg.Definitions, name: str) -> bool:
    """Whether `defs` holds the asset (a test's own definitions may leave the report out)."""
    return any(dg.AssetKey(name) in a.keys for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition))
