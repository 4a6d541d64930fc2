"""What a run did, read back from the Dagster instance: its status, its asset check evaluations, its
materializations, its failed steps and the warnings its steps logged.

The run driver (orchestration/run.py) and the nightly sensor (defs/automation.py) judge a run the same
way, from these records: `run_state` is the state the sequencer (orchestration/sequence.py) decides on.
Nothing here parses a log line's text to learn an outcome.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import dagster as dg

from .metadata import JUDGED_KEY
from .sequence import RunState

IN_PROGRESS = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)
MAX_LOGGED = 10  # warnings a run contributes to a summary; the rest are counted, in the run's log


@dataclass(frozen=True)
class CheckVerdict:
    """One asset check evaluation of a run."""

    passed: bool
    severity: str  # "ERROR" | "WARN"
    description: str
    judged: bool = True  # False: it passed without judging anything (metadata `judged: false`, metadata.JUDGED_KEY)


@dataclass
class RunRecord:
    """One run as the instance recorded it."""

    run_id: str
    job: str
    status: dg.DagsterRunStatus
    partition: str | None = None
    checks: dict[str, CheckVerdict] = field(default_factory=dict)  # "asset:check" -> verdict
    materialized: dict[str, Mapping[str, object]] = field(default_factory=dict)  # asset -> its metadata values
    errors: list[str] = field(default_factory=list)  # one line per failed step: "step: why"

    @property
    def failed_checks(self) -> dict[str, str]:
        """ "asset:check" -> severity ("ERROR" | "WARN") of every check that failed."""
        return {name: v.severity for name, v in self.checks.items() if not v.passed}

    @property
    def not_judged(self) -> list[str]:
        """ "asset:check" of every check that passed without judging anything."""
        return [name for name, v in self.checks.items() if not v.judged]

    @property
    def state(self) -> RunState:
        return state_of(self.status, self.failed_checks.values())


def state_of(status: dg.DagsterRunStatus, failed_severities: Iterable[str]) -> RunState:
    """A run's state for the sequencer: passed = succeeded with no failed ERROR check."""
    if status in IN_PROGRESS:
        return RunState.RUNNING
    if status == dg.DagsterRunStatus.SUCCESS and "ERROR" not in failed_severities:
        return RunState.PASSED
    return RunState.FAILED


def _check_name(ev: dg.AssetCheckEvaluation) -> str:
    return f"{ev.asset_key.to_user_string()}:{ev.check_name}"


def _check_evaluations(instance: dg.DagsterInstance, run_id: str) -> Iterable[dg.AssetCheckEvaluation]:
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        data = entry.dagster_event.event_specific_data if entry.dagster_event else None
        if isinstance(data, dg.AssetCheckEvaluation):
            yield data


def _judged(ev: dg.AssetCheckEvaluation) -> bool:
    """False for a check that says it judged nothing (its metadata `judged: false`)."""
    judged = ev.metadata.get(JUDGED_KEY)
    return getattr(judged, "value", judged) is not False


def _words(message: str) -> str:
    """ "dagster.<module path>.Failure: ..." / "eagle3_dagster.ingest.errors.IngestFileError: ...":
    the user's words, without the exception's module path."""
    return re.sub(r"^[A-Za-z_][\w.]*\.(\w+): ", "", message.strip())


def _failed_steps(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """One line per failed step: the step and the first line of its error (dg.Failure: the description)."""
    out = []
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        event = entry.dagster_event
        err = getattr(event.event_specific_data, "error", None) if event else None
        # an unexpected exception is wrapped ("Error occurred while executing op ..."): its cause says why
        while err is not None and _words(err.message).startswith("Error occurred while executing") and err.cause:
            err = err.cause
        msg = _words(err.message if err else "failed")
        out.append(f"{event.step_key if event else '?'}: {msg.splitlines()[0] if msg else 'failed'}")
    return out


def _materialized(instance: dg.DagsterInstance, run_id: str) -> dict[str, Mapping[str, object]]:
    out: dict[str, Mapping[str, object]] = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        mat = entry.asset_materialization
        if mat is not None:
            out[mat.asset_key.to_user_string()] = {k: v.value for k, v in mat.metadata.items()}
    return out


def read_run(instance: dg.DagsterInstance, run_id: str) -> RunRecord:
    """Everything the driver reports of one run, from the instance's run and event records."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise LookupError(f"run {run_id} is not in the instance")
    return RunRecord(
        run_id=run_id,
        job=run.job_name,
        status=run.status,
        partition=run.tags.get("dagster/partition"),
        checks={
            _check_name(ev): CheckVerdict(bool(ev.passed), ev.severity.value, ev.description or "", _judged(ev))
            for ev in _check_evaluations(instance, run_id)
        },
        materialized=_materialized(instance, run_id),
        errors=_failed_steps(instance, run_id) if run.status != dg.DagsterRunStatus.SUCCESS else [],
    )


def run_state(instance: dg.DagsterInstance, run: dg.DagsterRun) -> RunState:
    """The state of a run from its status; a successful one's check evaluations are read (a failed ERROR
    check that did not block the run still fails it for the sequencer)."""
    if run.status != dg.DagsterRunStatus.SUCCESS:
        return state_of(run.status, ())
    return state_of(run.status, [ev.severity.value for ev in _check_evaluations(instance, run.run_id) if not ev.passed])


def combine(states: Iterable[RunState]) -> RunState:
    """The state of a step with several runs (a shard re-run): passed if one passed, else running if one
    runs, else failed; not run without any run."""
    seen = set(states)
    for st in (RunState.PASSED, RunState.RUNNING, RunState.FAILED):
        if st in seen:
            return st
    return RunState.NOT_RUN


def logged_warnings(instance: dg.DagsterInstance, run_id: str, what: str) -> list[str]:
    """The WARNING lines the steps of a run logged (not Dagster's own events), distinct, in order, as
    "<what>: <first line>", at most MAX_LOGGED (then how many more)."""
    seen: dict[str, None] = {}
    for rec in instance.all_logs(run_id):
        if rec.dagster_event is not None or not rec.user_message:
            continue
        level = rec.level if isinstance(rec.level, int) else logging.getLevelName(str(rec.level))
        if level == logging.WARNING:
            seen.setdefault(rec.user_message.strip().splitlines()[0], None)
    lines = [f"{what}: {m}" for m in list(seen)[:MAX_LOGGED]]
    if len(seen) > MAX_LOGGED:
        lines.append(f"{what}: {len(seen) - MAX_LOGGED} more distinct warning(s) in run {run_id} (`make ui`)")
    return lines
