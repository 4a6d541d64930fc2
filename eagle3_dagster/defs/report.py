"""The offline HTML quality report as its own asset: `quality_report`.

The gated steps (tokenize, generate, train, publish) only validate and store their gate results; this
asset builds the GX Data Docs from them (once per run: pruned, the new pages, the index) and renders
<work_dir>/reports/index.html from everything stored, after them. The `report` job (defs/automation.py) runs it: the demo's and the nightly's
last run, whatever the publish run's outcome, so a night that published nothing still shows why.
"""

from datetime import timedelta
from pathlib import Path

import dagster as dg

from ..config import Settings
from ..orchestration.asset_names import ASSET_GROUP, REPORT_ASSET, STAGE_TAG
from ..orchestration.resources import PipelineSettings
from ..quality.gx_docs import build_data_docs
from ..report.html import write_report

STAGE = "report"
REPORT_NOT_WRITTEN = "quality report not written"  # a failed write: the step's failure says so (the run is red)


def report_metadata(path: Path) -> dict[str, dg.MetadataValue]:
    """The metadata entry naming where the report is (the ingest step points at it)."""
    return {"quality_report": dg.MetadataValue.path(str(path))}


def data_docs(log: dg.DagsterLogManager, pipeline: PipelineSettings, keep: int) -> Path | None:
    """The gates' GX Data Docs, built once for the run: the stored results pruned to the newest `keep` per suite
    (EAGLE3_GX_KEEP_VALIDATIONS; 0 keeps all), the pages they lack, the index. Docs are a view: a failure is a
    warning naming the cause, and the report is still written."""
    try:
        return build_data_docs(pipeline.gx_context_dir, keep)
    except Exception as e:
        log.warning(f"GX Data Docs not built: {type(e).__name__}: {e}")
        return None


def render_report(
    log: dg.DagsterLogManager,
    pipeline: PipelineSettings,
    profile_name: str | None,
    n_shards: int,
    max_age: timedelta,
) -> Path:
    """Write the report from everything stored; a write that fails is logged and fails the step (its
    failure says REPORT_NOT_WRITTEN and why), so neither the run nor the summary claims a report this run
    did not write."""
    try:
        path = write_report(
            pipeline.data_path, pipeline.work_path, n_shards=n_shards, profile=profile_name, max_age=max_age
        )
    except Exception as e:
        line = f"{REPORT_NOT_WRITTEN}: {type(e).__name__}: {e}"
        log.warning(line)
        raise dg.Failure(description=line, allow_retries=False) from None
    log.info(f"quality report: {path}")
    return path


def quality_report_asset(s: Settings) -> dg.AssetsDefinition:
    """`quality_report` over shards 0 .. n_shards-1 (the partitions of the same definitions), pruning the GX
    results and judging LATEST's age by the settings `s`."""
    n_shards, keep, max_age = s.shards.n_shards, s.stages.gx_keep_validations, s.shards.snapshot_max_age

    @dg.asset(
        name=REPORT_ASSET,
        group_name=ASSET_GROUP,
        deps=["tokenized_prompts", "generations", "training_samples", "training_dataset"],
        description="The offline HTML quality report (<work_dir>/reports/index.html): publish/drift, charts, shards x "
        "gates with their Data Docs pages, failures, quarantine, snapshots. Rendered from the stored gate results "
        "after the gated steps (the `report` job); the gates' GX Data Docs are built first (pruned, new pages, index).",
        kinds={"html"},
        tags={STAGE_TAG: STAGE},
    )
    def quality_report(context: dg.AssetExecutionContext, pipeline: PipelineSettings) -> dg.MaterializeResult:
        docs = data_docs(context.log, pipeline, keep)
        path = render_report(context.log, pipeline, pipeline.profile().name, n_shards, max_age)
        metadata: dict[str, dg.MetadataValue] = {"path": dg.MetadataValue.path(str(path))}
        if docs is not None:
            metadata["data_docs"] = dg.MetadataValue.url("file://" + str(docs))
        return dg.MaterializeResult(metadata=metadata)

    return quality_report


def build_defs(s: Settings) -> dg.Definitions:
    return dg.Definitions(assets=[quality_report_asset(s)])
