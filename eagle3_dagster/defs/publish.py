"""Publishing: `training_dataset` snapshots + exports.

The nightly schedule, the sensors and the jobs that run this asset live in defs/automation.py.
"""


import dagster as dg

from ..config import settings
from ..quality import read_gate_result
from ..train.export import EXPORTERS
from ..train.snapshot import build_snapshot
from .gates import refresh_quality_report, report_metadata
from .metadata import to_metadata
from .partitions import N_SHARDS
from .resources import PipelineSettings, SGLangFleet

GROUP = "publish"


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
