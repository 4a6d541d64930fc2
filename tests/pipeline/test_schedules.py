"""Nightly regeneration, evaluated the way the daemon evaluates it (the full daemon run: test_nightly_daemon.py).

The sensor ticks here go through `SensorDefinition.evaluate_tick`, which applies the daemon's checks on
what a sensor may request (the first fan-out passed a direct call and failed every real tick).
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid

import dagster as dg
import pytest

from eagle3_dagster import config
from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.definitions import defs
from eagle3_dagster.defs.automation import (
    NIGHT_TAG,
    NIGHTLY_SENSOR,
    NIGHTLY_TAG,
    build_freshness,
    build_nightly_schedule,
    build_prompt_source_sensor,
)
from eagle3_dagster.orchestration.resources import pipeline_resource

PART = "dagster/partition"


def prompt_source_sensor(context: dg.SensorEvaluationContext):
    """One tick of the source sensor as the definitions build it, watching the sources of the settings now."""
    s = config.settings()
    return build_prompt_source_sensor(s.storage.sources_dir, s.shards.sensor_interval_s)(context)


def test_schedule_launches_a_tagged_ingest_run_at_the_configured_time(monkeypatch):
    sched = build_nightly_schedule("30 3 * * *", "Europe/Paris")
    assert (sched.cron_schedule, sched.execution_timezone) == ("30 3 * * *", "Europe/Paris")
    with dg.instance_for_test() as instance:
        ctx = dg.build_schedule_context(
            instance=instance, scheduled_execution_time=dt.datetime(2026, 12, 2, 3, 30, tzinfo=dt.UTC)
        )
        reqs = sched.evaluate_tick(ctx).run_requests
    assert len(reqs) == 1 and reqs[0].tags[NIGHTLY_TAG] == "true"
    assert sched.job_name == "ingest"
    default = defs.get_schedule_def("nightly_regeneration")
    assert (default.cron_schedule, default.execution_timezone) == ("0 2 * * *", "UTC")
    # the environment knobs, validated with the variable's name, reach the definitions built from them
    monkeypatch.setenv("EAGLE3_NIGHTLY_CRON", "15 1 * * 1-5")
    monkeypatch.setenv("EAGLE3_NIGHTLY_TZ", "America/New_York")
    s = config.settings()
    env_sched = build_nightly_schedule(s.shards.nightly_cron, s.shards.nightly_tz)
    assert (env_sched.cron_schedule, env_sched.execution_timezone) == ("15 1 * * 1-5", "America/New_York")
    monkeypatch.setenv("EAGLE3_NIGHTLY_CRON", "every night")
    with pytest.raises(ValueError, match="EAGLE3_NIGHTLY_CRON.*'every night'"):
        config.settings()
    monkeypatch.setenv("EAGLE3_NIGHTLY_CRON", "0 2 * * *")
    monkeypatch.setenv("EAGLE3_NIGHTLY_TZ", "Mars/Olympus")
    with pytest.raises(ValueError, match="EAGLE3_NIGHTLY_TZ.*Mars/Olympus"):
        config.settings()


def test_schedule_skips_while_the_previous_night_runs():
    sched = build_nightly_schedule("* * * * *", "UTC")
    with dg.instance_for_test() as instance:
        instance.add_run(
            dg.DagsterRun(
                job_name="shard_pipeline",
                run_id="0" * 36,
                status=dg.DagsterRunStatus.STARTED,
                tags={NIGHTLY_TAG: "true"},
            )
        )
        data = sched.evaluate_tick(dg.build_schedule_context(instance=instance))
    assert not data.run_requests and "still running" in data.skip_message


@pytest.mark.integration  # execute_in_process on a test instance starts Dagster's compute-log helpers
def test_fanout_requests_every_shard_through_the_daemons_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_DATA_DIR", str(tmp_path / "data"))
    repo = defs.get_repository_def()
    sensor = defs.get_sensor_def(NIGHTLY_SENSOR)
    with dg.instance_for_test() as instance:
        night = repo.get_job("ingest").execute_in_process(
            instance=instance,
            tags={NIGHTLY_TAG: "true"},
            resources={"pipeline": pipeline_resource(settings(), data_dir=str(tmp_path / "data"))},
        )
        assert night.success
        # the daemon's path: a sensor tick over the instance's runs, its requests resolved against the jobs it
        # declares (a request it may not make raises here, as in the daemon)
        data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, repository_def=repo))
        # between the ingest run and its shard runs nothing runs, yet the night is in flight: no second night
        tick = build_nightly_schedule("* * * * *", "UTC").evaluate_tick(dg.build_schedule_context(instance=instance))
        assert not tick.run_requests and "between its runs" in tick.skip_message
    reqs = data.run_requests
    parts = repo.get_job("shard_pipeline").partitions_def.get_partition_keys()
    assert sorted(r.partition_key for r in reqs) == sorted(parts)
    assert all(r.job_name == "shard_pipeline" and r.tags[NIGHT_TAG] == night.run_id for r in reqs)
    assert all(r.tags["dagster/partition"] == r.partition_key for r in reqs)


def _add_run(instance: dg.DagsterInstance, job: str, status: dg.DagsterRunStatus, **tags: str) -> str:
    run = dg.DagsterRun(job_name=job, run_id=str(uuid.uuid4()), status=status, tags={NIGHTLY_TAG: "true", **tags})
    instance.add_run(run)
    return run.run_id


def test_one_sensor_publishes_a_night_only_when_every_shard_run_succeeded():
    repo = defs.get_repository_def()
    sensor = defs.get_sensor_def(NIGHTLY_SENSOR)
    shards = list(repo.get_job("shard_pipeline").partitions_def.get_partition_keys())
    with dg.instance_for_test() as instance:

        def tick() -> dg.SensorExecutionData:
            return sensor.evaluate_tick(dg.build_sensor_context(instance=instance, repository_def=repo))

        night = _add_run(instance, "ingest", dg.DagsterRunStatus.SUCCESS)
        assert sorted(r.partition_key for r in tick().run_requests) == shards
        for k in shards[:-1]:
            _add_run(instance, "shard_pipeline", dg.DagsterRunStatus.SUCCESS, **{NIGHT_TAG: night, PART: k})
        last = _add_run(instance, "shard_pipeline", dg.DagsterRunStatus.STARTED, **{NIGHT_TAG: night, PART: shards[-1]})
        waiting = tick()
        assert not waiting.run_requests and f"waiting for shard run(s) {shards[-1]}" in waiting.skip_message
        instance.report_run_failed(instance.get_run_by_id(last))
        failed = tick().run_requests  # the night ends without publishing: its report says why
        assert [(r.job_name, r.tags[NIGHT_TAG]) for r in failed] == [("report", night)]
        assert tick().run_requests == failed  # asked again on the next tick: the same key, launched once
        _add_run(instance, "shard_pipeline", dg.DagsterRunStatus.SUCCESS, **{NIGHT_TAG: night, PART: shards[-1]})
        publish = tick().run_requests  # the failed shard was re-run and succeeded: every shard has passed
        assert [(r.job_name, r.tags[NIGHT_TAG]) for r in publish] == [("publish", night)]
        run = _add_run(instance, "publish", dg.DagsterRunStatus.STARTED, **{NIGHT_TAG: night})
        assert not tick().run_requests  # no report while the publish runs
        instance.report_run_failed(instance.get_run_by_id(run))
        reported = tick().run_requests  # the publish run ended (here: failed), the report is rendered again
        assert [(r.job_name, r.run_key) for r in reported] == [("report", f"report:{night}:{run}")]
        assert reported[0].run_key != failed[0].run_key  # a new request, not one Dagster would skip
        _add_run(instance, "report", dg.DagsterRunStatus.SUCCESS, **{NIGHT_TAG: night})
        ended = tick()  # the report ran last: the night is over
        assert not ended.run_requests and f"night {night}: ended: publish failed" in ended.skip_message


def test_an_open_night_holds_the_next_one_until_its_report_ran():
    sched = build_nightly_schedule("* * * * *", "UTC")
    shards = list(defs.get_repository_def().get_job("shard_pipeline").partitions_def.get_partition_keys())
    with dg.instance_for_test() as instance:

        def next_night() -> dg.ScheduleExecutionData:
            return sched.evaluate_tick(dg.build_schedule_context(instance=instance))

        night = _add_run(instance, "ingest", dg.DagsterRunStatus.SUCCESS)
        _add_run(instance, "shard_pipeline", dg.DagsterRunStatus.SUCCESS, **{NIGHT_TAG: night, PART: "0000"})
        held = next_night()  # nothing runs, the night has not ended (its report is last): it is still open
        assert not held.run_requests and "between its runs" in held.skip_message
        for k in shards[1:]:
            _add_run(instance, "shard_pipeline", dg.DagsterRunStatus.SUCCESS, **{NIGHT_TAG: night, PART: k})
        _add_run(instance, "publish", dg.DagsterRunStatus.SUCCESS, **{NIGHT_TAG: night})
        assert not next_night().run_requests  # published, but its report has not run
        _add_run(instance, "report", dg.DagsterRunStatus.SUCCESS, **{NIGHT_TAG: night})
        assert len(next_night().run_requests) == 1
        second = _add_run(instance, "ingest", dg.DagsterRunStatus.SUCCESS)
        assert not next_night().run_requests
        _add_run(instance, "shard_pipeline", dg.DagsterRunStatus.FAILURE, **{NIGHT_TAG: second, PART: "0001"})
        assert not next_night().run_requests  # a shard lost: the night ends with its report, not before
        _add_run(instance, "report", dg.DagsterRunStatus.SUCCESS, **{NIGHT_TAG: second})
        assert len(next_night().run_requests) == 1


def test_freshness_check_and_its_sensor_are_defined_with_the_configured_age(monkeypatch):
    spec = {k.to_user_string() for k in defs.resolve_asset_graph().asset_check_keys}
    assert "training_dataset:freshness_check" in spec
    assert defs.get_sensor_def("snapshot_freshness") is not None
    monkeypatch.setenv("EAGLE3_SNAPSHOT_MAX_AGE", "90m")
    s = config.settings()
    assert s.shards.snapshot_max_age == dt.timedelta(minutes=90)
    checks, _ = build_freshness(s.shards.snapshot_max_age, s.shards.sensor_interval_s)
    (check_spec,) = list(checks[0].check_specs)
    assert check_spec.asset_key == dg.AssetKey("training_dataset")
    for bad in ("26", "-3h", "soon"):
        monkeypatch.setenv("EAGLE3_SNAPSHOT_MAX_AGE", bad)
        with pytest.raises(ValueError, match=f"EAGLE3_SNAPSHOT_MAX_AGE.*{bad!r}"):
            config.settings()
    monkeypatch.setenv("EAGLE3_SENSOR_INTERVAL_S", "0")
    with pytest.raises(ValueError, match="EAGLE3_SENSOR_INTERVAL_S"):
        config.settings()


def test_source_sensor_fires_on_new_or_changed_sources_only(tmp_path, monkeypatch):
    assets = tmp_path / "assets"
    shutil.copytree(PROJECT_ROOT / "assets", assets)
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    ctx = dg.build_sensor_context(cursor=None)
    first = prompt_source_sensor(ctx)
    assert isinstance(first, dg.RunRequest) and first.tags[NIGHTLY_TAG] == "true"
    ctx = dg.build_sensor_context(cursor=ctx.cursor)
    assert isinstance(prompt_source_sensor(ctx), dg.SkipReason)
    # a changed data file is noticed
    data = assets / "sources" / "data" / "demo_prompts.jsonl"
    data.write_text(data.read_text() + '{"messages": [{"role": "user", "content": "new prompt"}]}\n')
    ctx2 = dg.build_sensor_context(cursor=ctx.cursor)
    again = prompt_source_sensor(ctx2)
    assert isinstance(again, dg.RunRequest) and again.run_key != first.run_key
    # a new source file is noticed
    (assets / "sources" / "more.yaml").write_text("path: data/demo_prompts.jsonl\nformat: openai\n")
    ctx3 = dg.build_sensor_context(cursor=ctx2.cursor)
    assert isinstance(prompt_source_sensor(ctx3), dg.RunRequest)
    # ... but while a night runs the change waits (cursor kept), so it is not lost
    with dg.instance_for_test() as instance:
        instance.add_run(
            dg.DagsterRun(
                job_name="ingest", run_id="1" * 36, status=dg.DagsterRunStatus.STARTED, tags={NIGHTLY_TAG: "true"}
            )
        )
        (assets / "sources" / "more2.yaml").write_text("path: data/demo_prompts.jsonl\nformat: openai\n")
        busy = dg.build_sensor_context(cursor=ctx3.cursor, instance=instance)
        skip = prompt_source_sensor(busy)
        assert isinstance(skip, dg.SkipReason) and "waiting for the running night" in skip.skip_message
        assert busy.cursor == ctx3.cursor


def _failed_run(instance: dg.DagsterInstance, job_name: str, tags: dict[str, str]):
    @dg.op
    def boom() -> None:
        raise RuntimeError("the step failed")

    @dg.job(name=job_name)
    def job() -> None:
        boom()

    result = job.execute_in_process(instance=instance, tags=tags, raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE]
    return instance.get_run_by_id(result.run_id), failure


@pytest.mark.parametrize(
    ("job_name", "said"),
    [
        ("report", "FAILED; the night's quality report was not written"),
        ("publish", "FAILED; nothing published, LATEST unchanged"),
    ],
)
def test_nightly_failed_names_every_failed_run_of_a_night_the_report_included(job_name, said):
    """Every job a night runs is watched (the report too), and each failure says what the night lost by it."""
    from eagle3_dagster.defs.automation import NIGHT_JOBS, NIGHT_TAG, NIGHTLY_TAG, build_nightly_failed_sensor

    assert (
        {j.name for j in NIGHT_JOBS} == {j.name for j in defs.jobs} == {"ingest", "shard_pipeline", "publish", "report"}
    )
    sensor = build_nightly_failed_sensor(30)
    instance = dg.DagsterInstance.ephemeral()
    run, failure = _failed_run(instance, job_name, {NIGHTLY_TAG: "true", NIGHT_TAG: "night-7"})
    context = dg.build_run_status_sensor_context(
        sensor_name=sensor.name, dagster_event=failure, dagster_instance=instance, dagster_run=run
    )
    skip = sensor(context)
    assert skip.skip_message == f"night night-7: {job_name} run {run.run_id} {said}"


@pytest.mark.integration  # execute_in_process on a test instance starts Dagster's compute-log helpers
def test_a_run_that_succeeded_with_a_failed_error_check_has_not_passed():
    """The sensor judges a shard run as the demo does (orchestration/run_records.py): a run that succeeded but
    whose non-blocking ERROR check failed did not pass, so the night publishes nothing; a WARN one passes."""
    from eagle3_dagster.orchestration.run_records import read_run, run_state
    from eagle3_dagster.orchestration.sequence import RunState

    def job_with(severity: dg.AssetCheckSeverity) -> dg.JobDefinition:
        @dg.asset(check_specs=[dg.AssetCheckSpec("drift", asset="thing", blocking=False)])
        def thing():
            yield dg.MaterializeResult()
            yield dg.AssetCheckResult(check_name="drift", passed=False, severity=severity)

        return dg.Definitions(assets=[thing], jobs=[dg.define_asset_job("j", "thing")]).resolve_job_def("j")

    with dg.instance_for_test() as instance:
        for severity, want in (
            (dg.AssetCheckSeverity.ERROR, RunState.FAILED),
            (dg.AssetCheckSeverity.WARN, RunState.PASSED),
        ):
            result = job_with(severity).execute_in_process(instance=instance)
            run = instance.get_run_by_id(result.run_id)
            assert result.success and run.status == dg.DagsterRunStatus.SUCCESS
            assert run_state(instance, run) == want == read_run(instance, run.run_id).state
            assert read_run(instance, run.run_id).failed_checks == {"thing:drift": severity.value}
