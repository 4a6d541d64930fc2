"""Automation: the jobs, the nightly schedule, the sensors and the snapshot freshness check.

What the daemon does, night by night (every step is a plain Dagster run, visible in the UI):

1. `nightly_regeneration` (schedule, EAGLE3_NIGHTLY_CRON in EAGLE3_NIGHTLY_TZ) launches the `ingest`
   job tagged `eagle3/nightly`; `prompt_source_sensor` does the same when a source file is added or
   changes. The ingest run's id names the night (`eagle3/night`).
2. `nightly_fanout` (run-status sensor on a successful tagged ingest run) launches one
   `shard_pipeline` run per shard partition (tokenize -> generate -> train, each gated by blocking
   checks), all tagged with the night.
3. `nightly_publish` (run-status sensor on a successful shard run) launches the `publish` job
   (`training_dataset`: snapshot, LATEST, exports) once EVERY shard run of that night succeeded. A
   night with a failed shard (a gate failed, the server was down, ...) publishes nothing: LATEST is
   unchanged, the failed runs are red, and `nightly_failed` names each failed run of the night on
   its tick.
4. `nightly_report` (after a successful publish) and `nightly_report_after_failure` (after a failed
   shard or publish run of a night) launch the `report` job: `quality_report` renders the offline
   HTML report from what is stored, so a night that published nothing shows why too.
5. `training_dataset:freshness_check` (an ERROR asset check, evaluated by the `snapshot_freshness` sensor
   and after every publish) fails when the last publish is older than EAGLE3_SNAPSHOT_MAX_AGE
   (default 26h), so a night that did not publish turns red the next day.

Only public Dagster API: per-partition RunRequests from run-status sensors that declare the job
they request (the daemon rejects asset-graph-subset requests from sensors without an asset
selection, which is what the first version of the fan-out did).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping

import dagster as dg

from ..config import settings
from ..ingest.fingerprint import SourceListingError, source_files_fingerprint
from ..orchestration.partitions import shard_partitions
from .common import stage_assets
from .report import REPORT_ASSET

NIGHTLY_TAG = "eagle3/nightly"
NIGHT_TAG = "eagle3/night"  # the id of the ingest run that started the night
SHARD_ASSETS = ("tokenized_prompts", "generations", "training_samples")
PUBLISH_ASSET = "training_dataset"
FRESHNESS_SENSOR = "snapshot_freshness"

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
    selection=dg.AssetSelection.assets(PUBLISH_ASSET),
    description="Assemble a `training_dataset` snapshot from the gated shards, move LATEST, write the exports.",
)

report_job = dg.define_asset_job(
    "report",
    selection=dg.AssetSelection.assets(REPORT_ASSET),
    description="Render the offline HTML quality report (`quality_report`) from the stored gate results and snapshots.",
)

# ----------------------------------------------------------------------------------- night logic

IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def night_verdict(expected: list[str], status_by_shard: Mapping[str, list[str]]) -> tuple[str, list[str]]:
    """Whether a night may publish, from the statuses of its shard runs (several runs per shard: a re-run).

    Returns ("publish", []) when every expected shard has a successful run; ("failed", shards)
    when a shard's runs are all finished and none succeeded; else ("waiting", shards still open).
    """
    failed, waiting = [], []
    for shard in expected:
        statuses = status_by_shard.get(shard, [])
        if "SUCCESS" in statuses:
            continue
        if not statuses or any(s not in ("FAILURE", "CANCELED") for s in statuses):
            waiting.append(shard)
        else:
            failed.append(shard)
    if failed:
        return "failed", failed
    if waiting:
        return "waiting", waiting
    return "publish", []


PENDING_NIGHT_S = 15 * 60  # a night whose ingest ended this recently and has no publish/failure yet is in flight


def _nightly_in_progress(instance: dg.DagsterInstance) -> list[str]:
    """What of a night is still going on: unfinished tagged runs, or a night between two of its runs.

    Between a successful ingest and its shard runs (and between the last shard run and the publish)
    nothing is running for a few seconds; without the second rule a schedule or source-sensor tick
    landing there would start a second, overlapping night.
    """
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=IN_PROGRESS, tags={NIGHTLY_TAG: "true"}), limit=5)
    if runs:
        return [f"{r.job_name}:{r.run_id[:8]}" for r in runs]
    last = instance.get_run_records(
        filters=dg.RunsFilter(
            job_name=ingest_job.name, statuses=[dg.DagsterRunStatus.SUCCESS], tags={NIGHTLY_TAG: "true"}
        ),
        limit=1,
    )
    if not last or not last[0].end_time or time.time() - last[0].end_time > PENDING_NIGHT_S:
        return []
    night = last[0].dagster_run.run_id
    ended = instance.get_runs(
        filters=dg.RunsFilter(job_name=publish_job.name, tags={NIGHT_TAG: night}), limit=1
    ) or instance.get_runs(
        filters=dg.RunsFilter(
            job_name=shard_pipeline_job.name,
            tags={NIGHT_TAG: night},
            statuses=[dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED],
        ),
        limit=1,
    )
    return [] if ended else [f"night {night[:8]} (between its runs)"]


# --------------------------------------------------------------------------------------- schedule


def build_nightly_schedule(cron: str | None = None, timezone: str | None = None) -> dg.ScheduleDefinition:
    """Cron and timezone default from EAGLE3_NIGHTLY_CRON / EAGLE3_NIGHTLY_TZ (02:00 UTC)."""

    @dg.schedule(
        name="nightly_regeneration",
        job=ingest_job,
        cron_schedule=cron or settings().nightly_cron,
        execution_timezone=timezone or settings().nightly_tz,
        tags={NIGHTLY_TAG: "true"},
        description="Nightly: re-ingest prompt sources; `nightly_fanout` then regenerates every shard and "
        "`nightly_publish` snapshots. Skips a tick while the previous night is still running.",
        default_status=dg.DefaultScheduleStatus.STOPPED,
    )
    def nightly_regeneration(context: dg.ScheduleEvaluationContext):
        busy = _nightly_in_progress(context.instance)
        if busy:
            return dg.SkipReason(f"the previous night is still running ({', '.join(busy)}); not starting another")
        return dg.RunRequest(tags={NIGHTLY_TAG: "true"})

    return nightly_regeneration


nightly_regeneration = build_nightly_schedule()

# ---------------------------------------------------------------------------------------- sensors


@dg.run_status_sensor(
    name="nightly_fanout",
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[ingest_job],
    request_job=shard_pipeline_job,
    minimum_interval_seconds=settings().sensor_interval_s,
    description="After a successful tagged `ingest` run (nightly or source change), one `shard_pipeline` run per "
    "shard; `nightly_publish` snapshots when all of them succeeded.",
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def nightly_fanout(context: dg.RunStatusSensorContext) -> Iterator[dg.RunRequest | dg.SkipReason]:
    run = context.dagster_run
    if run.tags.get(NIGHTLY_TAG) != "true":
        yield dg.SkipReason(f"ingest run {run.run_id} was not a nightly or source-change run")
        return
    night = run.run_id
    for shard in shard_partitions.get_partition_keys():
        yield dg.RunRequest(
            run_key=f"{night}:{shard}", partition_key=shard, tags={NIGHTLY_TAG: "true", NIGHT_TAG: night}
        )


@dg.run_status_sensor(
    name="nightly_publish",
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[shard_pipeline_job],
    request_job=publish_job,
    minimum_interval_seconds=settings().sensor_interval_s,
    description="When every shard run of a night succeeded, publish the snapshot (`publish` job). A night with a "
    "failed shard publishes nothing (LATEST unchanged; the freshness check turns red).",
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def nightly_publish(context: dg.RunStatusSensorContext) -> dg.RunRequest | dg.SkipReason:
    night = context.dagster_run.tags.get(NIGHT_TAG)
    if not night:
        return dg.SkipReason(f"shard run {context.dagster_run.run_id} is not part of a night")
    runs = context.instance.get_runs(filters=dg.RunsFilter(job_name=shard_pipeline_job.name, tags={NIGHT_TAG: night}))
    by_shard: dict[str, list[str]] = {}
    for r in runs:
        by_shard.setdefault(r.tags.get("dagster/partition", ""), []).append(r.status.value)
    verdict, shards = night_verdict(list(shard_partitions.get_partition_keys()), by_shard)
    if verdict == "failed":
        msg = f"night {night}: shard run(s) {', '.join(shards)} failed; nothing published, LATEST unchanged"
        context.log.error(msg)
        return dg.SkipReason(msg)
    if verdict == "waiting":
        return dg.SkipReason(f"night {night}: waiting for shard(s) {', '.join(shards)}")
    return dg.RunRequest(run_key=f"publish:{night}", tags={NIGHTLY_TAG: "true", NIGHT_TAG: night})


@dg.run_status_sensor(
    name="nightly_failed",
    run_status=dg.DagsterRunStatus.FAILURE,
    monitored_jobs=[ingest_job, shard_pipeline_job, publish_job],
    minimum_interval_seconds=settings().sensor_interval_s,
    description="Names every failed run of a night on its tick (and in the daemon log at ERROR): the night "
    "published nothing and LATEST is unchanged.",
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def nightly_failed(context: dg.RunStatusSensorContext) -> dg.SkipReason:
    run = context.dagster_run
    if run.tags.get(NIGHTLY_TAG) != "true":
        return dg.SkipReason(f"{run.job_name} run {run.run_id} failed outside the nightly automation")
    night = run.tags.get(NIGHT_TAG) or run.run_id  # an ingest run names its own night
    shard = run.tags.get("dagster/partition")
    what = f"{run.job_name} run {run.run_id}" + (f" (shard {shard})" if shard else "")
    msg = f"night {night}: {what} FAILED; nothing published, LATEST unchanged"
    context.log.error(msg)
    return dg.SkipReason(msg)


def build_report_sensor(name: str, status: dg.DagsterRunStatus, jobs: list) -> dg.SensorDefinition:
    """A run-status sensor that renders the quality report once a night's run of `jobs` ends with `status`."""

    @dg.run_status_sensor(
        name=name,
        run_status=status,
        monitored_jobs=jobs,
        request_job=report_job,
        minimum_interval_seconds=settings().sensor_interval_s,
        description=f"After a nightly {' or '.join(j.name for j in jobs)} run ends in {status.value}, render the "
        "quality report (`report` job).",
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def report_sensor(context: dg.RunStatusSensorContext) -> dg.RunRequest | dg.SkipReason:
        run = context.dagster_run
        night = run.tags.get(NIGHT_TAG)
        if run.tags.get(NIGHTLY_TAG) != "true" or not night:
            return dg.SkipReason(f"{run.job_name} run {run.run_id} is not part of a night")
        return dg.RunRequest(run_key=f"report:{run.run_id}", tags={NIGHTLY_TAG: "true", NIGHT_TAG: night})

    return report_sensor


nightly_report = build_report_sensor("nightly_report", dg.DagsterRunStatus.SUCCESS, [publish_job])
nightly_report_after_failure = build_report_sensor(
    "nightly_report_after_failure", dg.DagsterRunStatus.FAILURE, [shard_pipeline_job, publish_job]
)


@dg.sensor(
    name="prompt_source_sensor",
    job=ingest_job,
    minimum_interval_seconds=settings().sensor_interval_s,
    description="Launches a (tagged) ingest run when prompt-source files are added or change; the fan-out and the "
    "publish follow as for a night. Waits (keeps the change) while a night is running.",
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def prompt_source_sensor(context: dg.SensorEvaluationContext):
    try:
        fp = source_files_fingerprint(settings().sources_dir)
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


# -------------------------------------------------------------------------------------- freshness


def build_freshness(max_age=None) -> tuple[list[dg.AssetChecksDefinition], dg.SensorDefinition]:
    """The `training_dataset` freshness check (ERROR when the last publish is older than max_age) and its sensor.

    Dagster 1.13 marks these factories "superseded" by FreshnessPolicy; they are kept because their
    result is an asset check (red in the UI, stored with the run history, asserted by tests) and
    their sensor runs under the ordinary daemon, with no instance setting to switch on.
    """
    age = max_age or settings().snapshot_max_age
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        checks = list(
            dg.build_last_update_freshness_checks(
                assets=[PUBLISH_ASSET],
                lower_bound_delta=age,
                severity=dg.AssetCheckSeverity.ERROR,
            )
        )
        sensor = dg.build_sensor_for_freshness_checks(
            freshness_checks=checks,
            name=FRESHNESS_SENSOR,
            minimum_interval_seconds=settings().sensor_interval_s,
        )
    return checks, sensor


freshness_checks, snapshot_freshness = build_freshness()

JOBS = [ingest_job, shard_pipeline_job, publish_job, report_job]
SCHEDULES = [nightly_regeneration]
SENSORS = [
    nightly_fanout,
    nightly_publish,
    nightly_failed,
    nightly_report,
    nightly_report_after_failure,
    prompt_source_sensor,
    snapshot_freshness,
]


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(asset_checks=freshness_checks, jobs=JOBS, schedules=SCHEDULES, sensors=SENSORS)
