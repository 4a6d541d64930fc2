"""Automation: the jobs, the nightly schedule, the sensors and the snapshot freshness check.

What the daemon does, night by night (every step is a plain Dagster run, visible in the UI):

1. `nightly_regeneration` (schedule, EAGLE3_NIGHTLY_CRON in EAGLE3_NIGHTLY_TZ) launches the `ingest`
   job tagged `eagle3/nightly`; `prompt_source_sensor` does the same when a source file is added or
   changes. The ingest run's id names the night (`eagle3/night`).
2. `nightly` (one sensor, reading the night's runs on every tick) moves the latest night on, asking the
   sequencer every graph run asks (orchestration/sequence.py `next_runs`, on the state of the night's runs:
   run statuses and check evaluations, orchestration/run_records.py): after its successful ingest run, one
   `shard_pipeline` run per shard partition (tokenize -> generate -> train, each gated by blocking checks),
   all tagged with the night; once EVERY shard passed, the `publish` job (`training_dataset`: snapshot,
   LATEST, exports). A night with a failed shard (a gate failed, the server was down, ...) publishes
   nothing: LATEST is unchanged, the failed runs are red, and `nightly_failed` names each failed run of the
   night on its tick. The night's state is its runs, so a tick that was missed (daemon restart) is made good
   by the next one, and a shard re-run that passes lets the night publish after all.
3. Last, whatever happened (published, a shard lost, the ingest failed), the same sensor launches the
   `report` job: the gates' Data Docs and the offline HTML report from what is stored, so a night that
   published nothing shows why too.
4. A night is open from its ingest run until its report ran: the schedule and the source sensor do not
   start another while one is open.
5. `training_dataset:freshness_check` (an ERROR asset check, evaluated by the `snapshot_freshness` sensor
   and after every publish) fails when the last publish is older than EAGLE3_SNAPSHOT_MAX_AGE
   (default 26h), so a night that did not publish turns red the next day.

A partial snapshot is never published by the night; launch the `publish` job with `allow_partial: true` in
its config (the launchpad) to publish one by hand.

Only public Dagster API: per-partition RunRequests from a sensor that declares the jobs it requests
(the daemon rejects asset-graph-subset requests from sensors without an asset selection).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import dagster as dg

from ..config import Settings
from ..ingest.fingerprint import SourceListingError, source_files_fingerprint
from ..orchestration.asset_names import REPORT_ASSET, SHARD_ASSETS, AssetName, stage_assets
from ..orchestration.partitions import shard_keys
from ..orchestration.run_records import IN_PROGRESS, combine, run_state
from ..orchestration.sequence import GraphState, Job, NextRun, RunState, next_runs

NIGHTLY_TAG = "eagle3/nightly"
NIGHT_TAG = "eagle3/night"  # the id of the ingest run that started the night
PARTITION_TAG = "dagster/partition"
FRESHNESS_SENSOR = "snapshot_freshness"
NIGHTLY_SENSOR = "nightly"

# ------------------------------------------------------------------------------------------- jobs

ingest_job = dg.define_asset_job(
    "ingest",
    selection=stage_assets("ingest"),
    description="Read every prompt source and rebuild the combined `prompts` table.",
)

shard_pipeline_job = dg.define_asset_job(
    "shard_pipeline",
    selection=dg.AssetSelection.assets(*SHARD_ASSETS),
    description="tokenize -> generate -> train for one shard (a partition); backfill it for all shards.",
)

publish_job = dg.define_asset_job(
    "publish",
    selection=dg.AssetSelection.assets(AssetName.TRAINING_DATASET),
    description="Assemble a `training_dataset` snapshot from the gated shards, move LATEST, write the exports.",
)

report_job = dg.define_asset_job(
    "report",
    selection=dg.AssetSelection.assets(REPORT_ASSET),
    description="Render the offline HTML quality report (`quality_report`) from the stored gate results and snapshots.",
)

# Every job a night runs (`nightly` launches them in this order); `nightly_failed` watches them all.
NIGHT_JOBS = (ingest_job, shard_pipeline_job, publish_job, report_job)

# ----------------------------------------------------------------------------------- night logic


def latest_night(instance: dg.DagsterInstance) -> dg.DagsterRun | None:
    """The newest tagged ingest run (nightly or source change): it starts a night and its id names it."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=ingest_job.name, tags={NIGHTLY_TAG: "true"}), limit=1)
    return runs[0] if runs else None


@dataclass(frozen=True)
class Night:
    """A night's runs as the sequencer sees them, and the newest of its runs other than a report (a report
    run is the night's last only when it is newer: a re-run shard or publish asks for another)."""

    id: str
    state: GraphState
    newest_run: str


def night_state(instance: dg.DagsterInstance, night_run: dg.DagsterRun, expected: Sequence[str]) -> Night:
    """The state of the night `night_run` started, from its runs' records (orchestration/run_records.py)."""
    night = night_run.run_id
    runs = [r.dagster_run for r in instance.get_run_records(filters=dg.RunsFilter(tags={NIGHT_TAG: night}))]
    others = [r for r in runs if r.job_name != report_job.name]  # newest first

    def state(job: str, shard: str | None = None) -> RunState:
        return combine(
            run_state(instance, r) for r in others if r.job_name == job and r.tags.get(PARTITION_TAG, shard) == shard
        )

    # the report is the night's last run only when nothing ran after it
    last_report = runs[0] if runs and runs[0].job_name == report_job.name else None
    return Night(
        night,
        GraphState(
            ingest=run_state(instance, night_run),
            shards={k: state(shard_pipeline_job.name, k) for k in expected},
            publish=state(publish_job.name),
            report=run_state(instance, last_report) if last_report is not None else RunState.NOT_RUN,
        ),
        others[0].run_id if others else night,
    )


def night_ended(instance: dg.DagsterInstance, night: str) -> bool:
    """A night ends with its report: the sequencer runs it last, whatever happened before (sequence.py), so
    the night's newest run is a finished report run."""
    newest = instance.get_runs(filters=dg.RunsFilter(tags={NIGHT_TAG: night}), limit=1)
    return bool(newest) and newest[0].job_name == report_job.name and newest[0].status not in IN_PROGRESS


def night_request(night: Night, run: NextRun) -> dg.RunRequest:
    """A run the sequencer asked for, as the sensor's request: tagged with the night, keyed so that a later
    tick asking again launches nothing (a report: once per state of the night's other runs)."""
    tags = {NIGHTLY_TAG: "true", NIGHT_TAG: night.id}
    if run.job is Job.SHARD:
        key = f"{night.id}:{run.shard}"
        return dg.RunRequest(run_key=key, job_name=shard_pipeline_job.name, partition_key=run.shard, tags=tags)
    if run.job is Job.PUBLISH:
        return dg.RunRequest(run_key=f"publish:{night.id}", job_name=publish_job.name, tags=tags)
    return dg.RunRequest(run_key=f"report:{night.id}:{night.newest_run}", job_name=report_job.name, tags=tags)


def _nightly_in_progress(instance: dg.DagsterInstance) -> list[str]:
    """What of a night is still going on: unfinished tagged runs, or a night between two of its runs.

    Between a successful ingest and its shard runs (and between the last shard run and the publish, and
    before the report) nothing is running; a night that has not ended (its report, last) is still open, so a
    schedule or source-sensor tick landing there does not start a second, overlapping night.
    """
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=list(IN_PROGRESS), tags={NIGHTLY_TAG: "true"}), limit=5)
    if runs:
        return [f"{r.job_name}:{r.run_id[:8]}" for r in runs]
    night = latest_night(instance)
    if night is None or night_ended(instance, night.run_id):
        return []
    return [f"night {night.run_id[:8]} (between its runs; the `{NIGHTLY_SENSOR}` sensor moves it on)"]


# --------------------------------------------------------------------------------------- schedule


def build_nightly_schedule(cron: str, timezone: str) -> dg.ScheduleDefinition:
    """The nightly schedule at `cron` in `timezone` (EAGLE3_NIGHTLY_CRON / EAGLE3_NIGHTLY_TZ: 02:00 UTC)."""

    @dg.schedule(
        name="nightly_regeneration",
        job=ingest_job,
        cron_schedule=cron,
        execution_timezone=timezone,
        tags={NIGHTLY_TAG: "true"},
        description="Nightly: re-ingest prompt sources; the `nightly` sensor then regenerates every shard and "
        "snapshots. Skips a tick while the previous night is still running.",
        default_status=dg.DefaultScheduleStatus.STOPPED,
    )
    def nightly_regeneration(context: dg.ScheduleEvaluationContext):
        busy = _nightly_in_progress(context.instance)
        if busy:
            return dg.SkipReason(f"the previous night is still running ({', '.join(busy)}); not starting another")
        return dg.RunRequest(tags={NIGHTLY_TAG: "true"})

    return nightly_regeneration


# ---------------------------------------------------------------------------------------- sensors


def build_nightly_sensor(n_shards: int, interval_s: int) -> dg.SensorDefinition:
    """The `nightly` sensor over the shard keys of `n_shards` shards (the partitions of the same definitions)."""
    expected = shard_keys(n_shards)

    @dg.sensor(
        name=NIGHTLY_SENSOR,
        jobs=[shard_pipeline_job, publish_job, report_job],
        minimum_interval_seconds=interval_s,
        description="Moves the latest tagged night on (nightly or source change), in the order and by the publish "
        "rule every graph run follows (orchestration/sequence.py): after its successful `ingest` run, one "
        "`shard_pipeline` run per shard; when every shard passed, the `publish` run; last, the `report` run. A "
        "night with a failed shard publishes nothing (LATEST unchanged; the freshness check turns red).",
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def nightly(context: dg.SensorEvaluationContext) -> Iterator[dg.RunRequest | dg.SkipReason]:
        night_run = latest_night(context.instance)
        if night_run is None:
            yield dg.SkipReason("nothing to move on: no nightly or source-change ingest run yet")
            return
        night = night_state(context.instance, night_run, expected)
        step = next_runs(night.state)
        if step.not_published and context.cursor != night.id:  # said once a night at ERROR; the report shows it
            context.log.error(f"night {night.id}: {step.not_published}; LATEST unchanged")
            context.update_cursor(night.id)
        if step.runs:
            yield from (night_request(night, run) for run in step.runs)
            return
        yield dg.SkipReason(f"night {night.id}: {'ended: ' if step.done else ''}{step.why}")

    return nightly


def build_nightly_failed_sensor(interval_s: int) -> dg.SensorDefinition:
    """The `nightly_failed` run-status sensor."""

    @dg.run_status_sensor(
        name="nightly_failed",
        run_status=dg.DagsterRunStatus.FAILURE,
        monitored_jobs=list(NIGHT_JOBS),
        minimum_interval_seconds=interval_s,
        description="Names every failed run of a night on its tick (and in the daemon log at ERROR): a failed "
        "ingest, shard or publish run means the night published nothing and LATEST is unchanged; a failed report "
        "run means the night's quality report was not written.",
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def nightly_failed(context: dg.RunStatusSensorContext) -> dg.SkipReason:
        run = context.dagster_run
        if run.tags.get(NIGHTLY_TAG) != "true":
            return dg.SkipReason(f"{run.job_name} run {run.run_id} failed outside the nightly automation")
        msg = failed_night_run_message(run.job_name, run.run_id, run.tags)
        context.log.error(msg)
        return dg.SkipReason(msg)

    return nightly_failed


def failed_night_run_message(job_name: str, run_id: str, tags: Mapping[str, str]) -> str:
    """What `nightly_failed` says of a failed run of a night: which run, and what the night lost by it."""
    night = tags.get(NIGHT_TAG) or run_id  # an ingest run names its own night
    shard = tags.get("dagster/partition")
    what = f"{job_name} run {run_id}" + (f" (shard {shard})" if shard else "")
    if job_name == report_job.name:
        return f"night {night}: {what} FAILED; the night's quality report was not written"
    return f"night {night}: {what} FAILED; nothing published, LATEST unchanged"


def build_prompt_source_sensor(sources_dir: Path, interval_s: int) -> dg.SensorDefinition:
    """`prompt_source_sensor`, watching the source YAMLs (and the files they name) of `sources_dir`."""

    @dg.sensor(
        name="prompt_source_sensor",
        job=ingest_job,
        minimum_interval_seconds=interval_s,
        description="Launches a (tagged) ingest run when prompt-source files are added or change; the fan-out and the "
        "publish follow as for a night. Waits (keeps the change) while a night is running.",
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def prompt_source_sensor(context: dg.SensorEvaluationContext):
        try:
            fp = source_files_fingerprint(sources_dir)
        except SourceListingError as e:
            return dg.SkipReason(f"cannot list a remote prompt source, will retry: {e}")
        if context.cursor == fp:
            return dg.SkipReason("prompt sources unchanged")
        try:
            busy = _nightly_in_progress(context.instance)
        except dg.DagsterInvariantViolationError:  # a bare test context without an instance
            busy = []
        if busy:
            return dg.SkipReason(f"prompt sources changed; waiting for the running night ({', '.join(busy)})")
        context.update_cursor(fp)
        return dg.RunRequest(run_key=f"sources-{fp}", tags={NIGHTLY_TAG: "true", "eagle3/sources": fp})

    return prompt_source_sensor


# -------------------------------------------------------------------------------------- freshness


def build_freshness(max_age: timedelta, interval_s: int) -> tuple[list[dg.AssetChecksDefinition], dg.SensorDefinition]:
    """The `training_dataset` freshness check (ERROR when the last publish is older than `max_age`) and its sensor,
    evaluated at most every `interval_s` seconds.

    Dagster 1.13 marks these factories "superseded" by FreshnessPolicy; they are kept because their
    result is an asset check (red in the UI, stored with the run history, asserted by tests) and
    their sensor runs under the ordinary daemon, with no instance setting to switch on.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        checks = list(
            dg.build_last_update_freshness_checks(
                assets=[AssetName.TRAINING_DATASET],
                lower_bound_delta=max_age,
                severity=dg.AssetCheckSeverity.ERROR,
            )
        )
        sensor = dg.build_sensor_for_freshness_checks(
            freshness_checks=checks,
            name=FRESHNESS_SENSOR,
            minimum_interval_seconds=interval_s,
        )
    return checks, sensor


def build_defs(s: Settings) -> dg.Definitions:
    """The jobs, the schedule, the sensors and the freshness check, configured from `s`."""
    interval = s.shards.sensor_interval_s
    freshness_checks, snapshot_freshness = build_freshness(s.shards.snapshot_max_age, interval)
    sensors = [
        build_nightly_sensor(s.shards.n_shards, interval),
        build_nightly_failed_sensor(interval),
        build_prompt_source_sensor(s.storage.sources_dir, interval),
        snapshot_freshness,
    ]
    return dg.Definitions(
        asset_checks=freshness_checks,
        jobs=list(NIGHT_JOBS),
        schedules=[build_nightly_schedule(s.shards.nightly_cron, s.shards.nightly_tz)],
        sensors=sensors,
    )
