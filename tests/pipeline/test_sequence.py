"""The one sequencer (orchestration/sequence.py): which runs come next, given the runs so far.

The demo, `eagle3 backfill` and the nightly sensor all ask `next_runs`; here it is held to its rules on a
table of states, then on EVERY state of a two-shard graph run (ingest, shards, publish, report, partial or
not, stopping or not, over every shard or some: 16,000 states), so no combination can slip past the publish
rule or the report.
"""

from __future__ import annotations

import itertools

import pytest

from eagle3_dagster.defs.automation import NIGHT_JOBS
from eagle3_dagster.orchestration.sequence import GraphState, Job, NextRun, RunState, Step, next_runs

N, R, P, F = RunState.NOT_RUN, RunState.RUNNING, RunState.PASSED, RunState.FAILED
SHARD0, SHARD1 = "0000", "0001"


def _state(ingest, s0, s1, publish, report, partial=False, stopping=False, every=True) -> GraphState:
    return GraphState(
        ingest,
        {SHARD0: s0, SHARD1: s1},
        publish,
        report,
        allow_partial=partial,
        stopping=stopping,
        covers_every_shard=every,
    )


# (ingest, shard 0, shard 1, publish, report, allow_partial) -> the runs asked for (None: done)
TABLE = [
    # the order: ingest, then every shard at once, then publish, then the report
    ((N, N, N, N, N, False), (NextRun(Job.INGEST),)),
    ((R, N, N, N, N, False), ()),
    ((P, N, N, N, N, False), (NextRun(Job.SHARD, SHARD0), NextRun(Job.SHARD, SHARD1))),
    ((P, P, N, N, N, False), (NextRun(Job.SHARD, SHARD1),)),
    ((P, P, R, N, N, False), ()),
    ((P, P, P, N, N, False), (NextRun(Job.PUBLISH),)),
    ((P, P, P, R, N, False), ()),
    ((P, P, P, P, N, False), (NextRun(Job.REPORT),)),
    ((P, P, P, P, R, False), ()),
    ((P, P, P, P, P, False), None),
    # the report runs last whatever happened: a refused snapshot, a failed report ends it too
    ((P, P, P, F, N, False), (NextRun(Job.REPORT),)),
    ((P, P, P, F, F, False), None),
    # one rule: a failed shard publishes nothing, unless a partial snapshot was asked for
    ((P, P, F, N, N, False), (NextRun(Job.REPORT),)),
    ((P, F, F, N, N, False), (NextRun(Job.REPORT),)),
    ((P, P, F, N, N, True), (NextRun(Job.PUBLISH, allow_partial=True),)),
    ((P, F, F, N, N, True), (NextRun(Job.REPORT),)),  # nothing passed: nothing to publish
    # asked for, every shard of the run passed: the request goes along (the definitions' other shards may be missing)
    ((P, P, P, N, N, True), (NextRun(Job.PUBLISH, allow_partial=True),)),
    ((P, P, F, P, N, True), (NextRun(Job.REPORT),)),
    # a failed ingest: no shard runs, no snapshot; the report still says why
    ((F, N, N, N, N, False), (NextRun(Job.REPORT),)),
    ((F, N, N, N, P, False), None),
    # parts this graph run does not have: no ingest (shards of an earlier ingest), no snapshot, no report
    ((None, N, N, None, N, False), (NextRun(Job.SHARD, SHARD0), NextRun(Job.SHARD, SHARD1))),
    ((None, P, P, None, N, False), (NextRun(Job.REPORT),)),
    ((None, P, F, None, None, False), None),
    ((P, P, P, P, None, False), None),
]


@pytest.mark.parametrize(("state", "runs"), TABLE, ids=[f"{i:02d}" for i in range(len(TABLE))])
def test_the_table_of_states_and_their_next_runs(state, runs):
    step = next_runs(_state(*state))
    if runs is None:
        assert step.done and step.runs == (), step
    else:
        assert not step.done and step.runs == runs, step


def test_a_failed_shard_says_why_nothing_is_published_and_a_partial_one_names_what_it_leaves_out():
    held = next_runs(_state(P, P, F, N, N))
    assert held.not_published.startswith("not published: shard(s) 0001 did not pass")
    assert "--allow-partial" in held.not_published
    partial = next_runs(_state(P, P, F, N, N, partial=True))
    assert partial.not_published == "" and partial.left_out == ("0001",)
    assert next_runs(_state(P, P, F, P, P, partial=True)).left_out == ("0001",)  # said to the end
    assert next_runs(_state(F, N, N, N, N)).not_published == "not published: the ingest failed"
    some = next_runs(_state(P, P, P, N, N, every=False))  # `--shards` picked some: a snapshot of them is partial
    assert some.runs == (NextRun(Job.REPORT),) and "covers shard(s) 0000, 0001 only (--shards)" in some.not_published
    assert next_runs(_state(P, P, P, N, N, partial=True, every=False)).runs == (
        NextRun(Job.PUBLISH, allow_partial=True),
    )


def test_a_stop_ends_the_graph_run_at_once():
    for state in (_state(N, N, N, N, N), _state(P, R, N, N, N), _state(P, P, P, P, N)):
        step = next_runs(GraphState(**{**state.__dict__, "stopping": True}))
        assert step.done and step.runs == () and step.why.startswith("stopped")


def _every_state():
    optional = (None, N, R, P, F)
    for ingest, s0, s1, publish, report, partial, stopping, every in itertools.product(
        optional, (N, R, P, F), (N, R, P, F), optional, optional, (False, True), (False, True), (False, True)
    ):
        yield _state(ingest, s0, s1, publish, report, partial, stopping, every)


def _check(state: GraphState, step: Step) -> None:
    shards = list(state.shards.values())
    asked = {run.job for run in step.runs}
    # a run is asked for only if it has not run yet, and never while a run it follows is unfinished
    for run in step.runs:
        mine = {
            Job.INGEST: state.ingest,
            Job.SHARD: state.shards.get(str(run.shard)),
            Job.PUBLISH: state.publish,
            Job.REPORT: state.report,
        }[run.job]
        assert mine is N, (state, step)
    if asked & {Job.SHARD, Job.PUBLISH, Job.REPORT}:
        assert state.ingest in (None, P) or (asked == {Job.REPORT} and state.ingest is F), (state, step)
    if Job.PUBLISH in asked:
        assert all(s in (P, F) for s in shards), (state, step)
        (publish,) = step.runs
        if F in shards:  # THE rule: a shard that did not pass publishes only a partial snapshot asked for
            assert state.allow_partial and P in shards and publish.allow_partial, (state, step)
        elif not state.covers_every_shard:  # some shards only: a partial snapshot, asked for
            assert state.allow_partial and publish.allow_partial, (state, step)
        else:
            assert publish.allow_partial == state.allow_partial, (state, step)
    if Job.REPORT in asked:  # the report is last: nothing else is unfinished or still to come
        assert step.runs == (NextRun(Job.REPORT),)
        assert state.ingest is not R and state.publish is not R, (state, step)
        if state.ingest is not F:
            assert all(s in (P, F) for s in shards), (state, step)
            whole = F not in shards and state.covers_every_shard
            publishable = whole or (state.allow_partial and (P in shards or F not in shards))
            assert not (state.publish is N and publishable), (state, step)
    if state.stopping:
        assert step.done and not step.runs, (state, step)
    elif step.done:  # the end: the report ran (or there is none), unless it could never come
        assert state.report not in (N, R), (state, step)
    elif not step.runs:  # waiting: something is running
        assert R in (state.ingest, *shards, state.publish, state.report), (state, step)


def test_every_state_of_a_two_shard_graph_run_keeps_the_rules():
    states = list(_every_state())
    assert len(states) == 5 * 4 * 4 * 5 * 5 * 2 * 2 * 2
    for state in states:
        _check(state, next_runs(state))


def test_the_sequencer_s_jobs_are_the_project_s_jobs_in_order():
    assert [j.name for j in NIGHT_JOBS] == [j.value for j in Job]
