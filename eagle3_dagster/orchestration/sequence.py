"""The order a graph run goes in, and its one publish rule: which runs come next, given the runs so far.

One plain function, `next_runs`, decides for every way the graph runs: the demo and `eagle3 backfill`
(orchestration/run.py executes what it returns in this process, then asks again) and the nightly sensor
(defs/automation.py turns what it returns into run requests on each tick). No Dagster here: the callers
read the state of their runs (run status, asset check evaluations: orchestration/run_records.py) and
hand it over as a `GraphState`.

The order: ingest; then every shard (one `shard_pipeline` run each); then the snapshot (`publish`);
then the quality report, always last, whatever happened before it (a failed ingest, a shard lost, a
snapshot refused), so the report shows why. A stop asked for ends the graph run: nothing more starts.

The publish rule: a snapshot is published only when every shard passed (its run succeeded and none of
its ERROR checks failed). When a shard did not, or the graph run covers only some shards (`--shards`),
nothing is published unless a partial snapshot was asked for explicitly (`allow_partial`: `--allow-partial`, or the publish job's
run config); the snapshot then names the shards it left out and why (its manifest and data card).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Job(StrEnum):
    """The project's jobs, in the order a graph run goes (defs/automation.py defines them)."""

    INGEST = "ingest"
    SHARD = "shard_pipeline"
    PUBLISH = "publish"
    REPORT = "report"


class RunState(StrEnum):
    """Where one run of the graph stands (a shard with several runs: its best run, run_records.combine)."""

    NOT_RUN = "not run"
    RUNNING = "running"  # queued, starting, started or canceling
    PASSED = "passed"  # succeeded, and no ERROR check failed
    FAILED = "failed"  # failed or canceled, or an ERROR check failed


FINISHED = (RunState.PASSED, RunState.FAILED)


@dataclass(frozen=True)
class GraphState:
    """The runs of one graph run so far. A None step is not part of this graph run (a test's definitions
    without the report; a run that does not ingest or does not publish)."""

    ingest: RunState | None
    shards: Mapping[str, RunState]  # shard key -> its state, every shard of the graph run
    publish: RunState | None
    report: RunState | None
    allow_partial: bool = False  # a partial snapshot was asked for explicitly
    stopping: bool = False  # a stop was asked for (Ctrl-C, SIGTERM): nothing more starts
    # the graph run's shards are every shard of its definitions (False: `--shards` picked some; a snapshot
    # of them would leave the others out, so it is a partial one)
    covers_every_shard: bool = True


@dataclass(frozen=True)
class NextRun:
    job: Job
    shard: str | None = None  # the partition of a shard run
    allow_partial: bool = False  # a publish run that may leave failed shards out (named in the snapshot)


@dataclass(frozen=True)
class Step:
    """What to do now: start `runs` (all at once; none: wait for the running ones), or nothing ever again
    (`done`). `why`: one line for a person (what is awaited, or how the graph run ended); `not_published`:
    why no snapshot is asked for (empty when one is, or when this graph run does not publish)."""

    runs: tuple[NextRun, ...] = ()
    done: bool = False
    why: str = ""
    not_published: str = ""
    left_out: tuple[str, ...] = field(default=())  # the failed shards a partial snapshot leaves out


def _names(keys: list[str]) -> str:
    return ", ".join(keys) if len(keys) <= 8 else f"{', '.join(keys[:8])} and {len(keys) - 8} more"


def publish_decision(state: GraphState) -> tuple[NextRun | None, str, tuple[str, ...]]:
    """The publish run this graph run asks for once its shards finished (None: none), why none when none,
    and the shards a partial one leaves out. The one publish rule (see the module)."""
    failed = [k for k, st in state.shards.items() if st is RunState.FAILED]
    if not failed and not state.covers_every_shard and not state.allow_partial:
        return (
            None,
            f"not published: this run covers shard(s) {_names(list(state.shards)) or 'none'} only (--shards); a "
            "snapshot needs every shard (a partial snapshot of these needs --allow-partial)",
            (),
        )
    if not failed:  # (asked for, the request goes along: shards of the definitions outside this run may be missing)
        return NextRun(Job.PUBLISH, allow_partial=state.allow_partial), "", ()
    passed = [k for k, st in state.shards.items() if st is RunState.PASSED]
    if not state.allow_partial:
        return (
            None,
            f"not published: shard(s) {_names(failed)} did not pass; a snapshot is published only when every "
            "shard passed (a partial snapshot needs --allow-partial)",
            (),
        )
    if not passed:
        return None, f"not published: no shard passed (shard(s) {_names(failed)} failed)", ()
    return NextRun(Job.PUBLISH, allow_partial=True), "", tuple(failed)


def _report(state: GraphState, why: str, not_published: str = "", left_out: tuple[str, ...] = ()) -> Step:
    """The report, last of all: once nothing else runs (a publish launched by hand included); the end once
    it ran, or when there is none."""
    running = [name for name, st in (("ingest", state.ingest), ("publish", state.publish)) if st is RunState.RUNNING]
    running += [f"shard {k}" for k, st in state.shards.items() if st is RunState.RUNNING]
    if running:
        return Step(why=f"{why}; waiting for {', '.join(running)}", not_published=not_published, left_out=left_out)
    if state.report is RunState.NOT_RUN:
        return Step((NextRun(Job.REPORT),), why=why, not_published=not_published, left_out=left_out)
    if state.report is RunState.RUNNING:
        return Step(why=f"{why}; the report is running", not_published=not_published, left_out=left_out)
    return Step(done=True, why=why, not_published=not_published, left_out=left_out)


def next_runs(state: GraphState) -> Step:
    """The runs to start next, given the state of the runs so far (see the module for the order and the rule)."""
    if state.stopping:
        return Step(done=True, why="stopped: no further run starts")
    if state.ingest is RunState.NOT_RUN:
        return Step((NextRun(Job.INGEST),), why="ingest")
    if state.ingest is RunState.RUNNING:
        return Step(why="waiting for the ingest run")
    if state.ingest is RunState.FAILED:
        return _report(state, "the ingest failed: no shard runs", "not published: the ingest failed")
    waiting = [k for k, st in state.shards.items() if st not in FINISHED]
    new = [k for k, st in state.shards.items() if st is RunState.NOT_RUN]
    if new:
        return Step(tuple(NextRun(Job.SHARD, k) for k in new), why=f"shard run(s) {_names(new)}")
    if waiting:
        return Step(why=f"waiting for shard run(s) {_names(waiting)}")
    if state.publish is None:
        return _report(state, "every shard run finished")
    publish, not_published, left_out = publish_decision(state)
    if publish is None:
        return _report(state, not_published, not_published)
    if state.publish is RunState.NOT_RUN:
        leaving = f" (leaving out {_names(list(left_out))})" if left_out else ""
        return Step((publish,), why=f"publish{leaving}", left_out=left_out)
    if state.publish is RunState.RUNNING:
        return Step(why="waiting for the publish run", left_out=left_out)
    return _report(state, f"publish {state.publish.value}", left_out=left_out)
