"""Publishing: `training_dataset` snapshots + exports, nightly regeneration, prompt-source sensor.

Nightly: the `nightly_regeneration` schedule launches the `ingest` job (tagged); when that run
succeeds, `nightly_fanout` requests one asset backfill of every shard of the shard pipeline plus
`training_dataset`, which Dagster runs in dependency order (all shards, then the snapshot). The
runs are incremental because generation skips cache keys it already stored.
"""


import glob
import hashlib
import os
from pathlib import Path

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset

from ..config import settings
from ..quality import read_gate_result
from ..train.export import EXPORTERS
from ..train.snapshot import build_snapshot
from .gates import refresh_quality_report, report_metadata
from .partitions import N_SHARDS
from .resources import PipelineSettings, SGLangFleet

GROUP = "publish"
NIGHTLY_TAG = "eagle3/nightly"
FANOUT_ASSETS = ("tokenized_prompts", "generations", "training_samples", "training_dataset")


@dg.asset(
    name="training_dataset",
    group_name=GROUP,
    deps=["training_samples"],
    description="A versioned snapshot of every gated shard (copied, with a manifest: rows, sha256 per file, shards "
    "included/excluded and why, gate results, config), plus SpecForge and conversations exports.",
    kinds={"parquet", "json"},
    tags={"eagle3/stage": "publish"},
)
def training_dataset(
    context: dg.AssetExecutionContext, pipeline: PipelineSettings, sglang: SGLangFleet
) -> dg.MaterializeResult:
    data = pipeline.data_path
    profile = pipeline.profile()
    keep = settings().snapshot_retention
    config = {
        "profile": profile.name,
        "profile_fingerprint": profile.fingerprint(),
        "max_new_tokens": pipeline.max_new_tokens or profile.sampling.max_new_tokens,
        "regen_seed": sglang.regen_seed,
        "n_shards": N_SHARDS,
    }
    snap = build_snapshot(
        data, range(N_SHARDS), lambda g, k: read_gate_result(data, g, k), config=config, keep=keep, exporters=EXPORTERS
    )
    excluded = {d.shard: d.reason for d in snap.shards if not d.included}
    context.log.info(f"snapshot {snap.version}: {snap.rows} rows, excluded {excluded or 'none'}")
    if excluded:
        context.log.warning(f"shards left out of snapshot {snap.version}: {excluded}")
    report = refresh_quality_report(context, pipeline, profile.name)
    if report is not None:
        context.log.info(f"quality report: {report}")
    return dg.MaterializeResult(
        metadata={
            "version": snap.version,
            "new_snapshot": snap.created,
            "rows": snap.rows,
            "shards_included": dg.MetadataValue.json([d.shard for d in snap.shards if d.included]),
            "shards_excluded": dg.MetadataValue.json(excluded),
            "removed_by_retention": dg.MetadataValue.json(snap.removed_by_retention),
            "exports": dg.MetadataValue.json(snap.manifest.get("exports", {})),
            "manifest": dg.MetadataValue.path(str(snap.path / "manifest.json")),
            "path": dg.MetadataValue.path(str(snap.path)),
            **report_metadata(report),
        },
        data_version=dg.DataVersion(snap.version),
    )


ingest_job = dg.define_asset_job(
    "ingest",
    selection=dg.AssetSelection.groups("ingest"),
    description="Read every prompt source and rebuild the combined `prompts` table.",
)

def build_nightly_schedule(cron: str | None = None, timezone: str | None = None) -> dg.ScheduleDefinition:
    """Cron and timezone default from EAGLE3_NIGHTLY_CRON / EAGLE3_NIGHTLY_TZ (02:00 UTC)."""
    return dg.ScheduleDefinition(
        name="nightly_regeneration",
        job=ingest_job,
        cron_schedule=cron or settings().nightly_cron,
        execution_timezone=timezone or settings().nightly_tz,
        tags={NIGHTLY_TAG: "true"},
        description="Nightly: re-ingest prompt sources; `nightly_fanout` then regenerates every shard and snapshots.",
        default_status=dg.DefaultScheduleStatus.STOPPED,
    )


nightly_regeneration = build_nightly_schedule()


def fanout_request(asset_graph, tags: dict[str, str]) -> dg.RunRequest:
    keys = [dg.AssetKey(a) for a in FANOUT_ASSETS]
    return dg.RunRequest.for_asset_graph_subset(AssetGraphSubset.from_asset_keys(keys, asset_graph), tags=tags)


@dg.run_status_sensor(
    name="nightly_fanout",
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[ingest_job],
    request_jobs=[],
    description="After a successful tagged `ingest` run, backfill every shard and publish a snapshot.",
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def nightly_fanout(context: dg.RunStatusSensorContext):
    if context.dagster_run.tags.get(NIGHTLY_TAG) != "true":
        return dg.SkipReason("ingest run was not a nightly or source-change run")
    repo = context.repository_def
    assert repo is not None, "a run status sensor is evaluated with its repository"
    return fanout_request(repo.asset_graph, {NIGHTLY_TAG: "true", "eagle3/ingest_run": context.dagster_run.run_id})


class SourceListingError(RuntimeError):
    """A remote prompt source could not be listed (store unreachable, access denied): skip the tick."""


def source_files_fingerprint() -> str:
    """Hash of every prompt-source YAML and the data files it names.

    Local files: path + size + mtime (ns). Files named by a URI (s3://, gs://, memory://, ...): the
    display URI + size + mtime from the filesystem listing (S3: LastModified, whole seconds), plus
    for fsspec filesystems the store's version fields (ETag, md5, generation, ...) when `info()` has
    them (eagle3_dagster/ingest/remote.py:file_version). A remote glob that matches nothing, or a
    remote file that is missing, adds nothing (as a local one). A remote source that cannot be
    listed raises SourceListingError: the sensor skips that tick and keeps its cursor.
    """
    s = settings()
    h = hashlib.sha256()
    paths = set(s.sources_dir.rglob("*")) if s.sources_dir.exists() else set()
    remote_lines: list[str] = []
    try:
        from ..ingest import load_source_specs
        from ..ingest.remote import file_uri_to_path, file_version, is_remote, is_uri, list_remote

        for spec in load_source_specs(s.sources_dir):
            if is_remote(spec.path):
                try:
                    remote_lines.extend(file_version(f, info) for f, info in list_remote(spec.path, spec.name, allow_empty=True))
                except Exception as e:  # unreachable store, denied, ...: not a change
                    raise SourceListingError(f"source {spec.name!r}: {e}") from None
                continue
            raw = file_uri_to_path(spec.path) if is_uri(spec.path) else spec.path
            base = spec.base_dir or s.sources_dir
            pattern = raw if os.path.isabs(raw) else os.path.join(base, raw)
            paths.update(Path(p) for p in glob.glob(pattern, recursive=True))
    except SourceListingError:
        raise
    except Exception as e:  # a broken YAML is itself a change worth an ingest run, which reports it
        h.update(f"spec-error:{e}".encode())
    for p in sorted(paths):
        if p.is_file():
            st = p.stat()
            h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for line in sorted(remote_lines):
        h.update(f"{line}\n".encode())
    return h.hexdigest()[:32]


@dg.sensor(
    name="prompt_source_sensor",
    job=ingest_job,
    minimum_interval_seconds=60,
    description="Launches a (tagged) ingest run when prompt-source files are added or change; the fan-out follows.",
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def prompt_source_sensor(context: dg.SensorEvaluationContext):
    try:
        fp = source_files_fingerprint()
    except SourceListingError as e:
        return dg.SkipReason(f"cannot list a remote prompt source, will retry: {e}")
    if context.cursor == fp:
        return dg.SkipReason("prompt sources unchanged")
    context.update_cursor(fp)
    return dg.RunRequest(run_key=f"sources-{fp}", tags={NIGHTLY_TAG: "true", "eagle3/sources": fp})
