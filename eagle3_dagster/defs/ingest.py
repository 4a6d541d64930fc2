"""Ingest wiring: one asset per prompt-source YAML, and the combined, deduplicated `prompts`."""

import re
from typing import Any

import dagster as dg
import polars as pl

from ..config import Settings
from ..ingest import SourceSpec, combine_sources, ingest_source, load_source_specs
from ..ingest.decontaminate import DEFAULT_OVERLAP_THRESHOLD
from ..ingest.errors import EmptySourceError
from ..ingest.health import assess
from ..ingest.pipeline import EvalSet
from ..ingest.preview import prompts_preview_markdown
from ..orchestration.asset_names import ASSET_GROUP, STAGE_TAG, AssetName
from ..orchestration.metadata import to_metadata
from ..orchestration.resources import PipelineSettings
from ..plan.actual import plan_headlines
from ..plan.build import read_plan
from ..report.html import default_report_path
from ..storage import display_uri, read_parquet
from .report import report_metadata

STAGE = "ingest"
SOURCE_CHECK = "source_yield"  # non-blocking WARN check on every source__<name>


def source_asset_name(spec: SourceSpec) -> str:
    return "source__" + re.sub(r"[^A-Za-z0-9_]", "_", spec.name)


def source_description(spec: SourceSpec) -> str:
    role = (
        ". Eval set (role: eval): never tokenized or generated; the prompts stage quarantines training prompts "
        "that overlap it"
        if spec.role == "eval"
        else ". Probe set (role: probe): generated again for every drafter the fleet runs, never trained on"
        if spec.role == "probe"
        else ""
    )
    return (
        f"Prompt source `{spec.name}` ({spec.format}): {display_uri(spec.path)}. "
        f"Licence: {spec.licence or 'not stated'}{role}"
    )


def source_yield_check(counts: Any, health: Any) -> dg.AssetCheckResult:
    """The source's WARN check: no prompt at all (allowed empty) or a reject rate over its limit."""
    return dg.AssetCheckResult(
        check_name=SOURCE_CHECK,
        passed=not (health.empty or health.rate_exceeded),
        severity=dg.AssetCheckSeverity.WARN,
        description="; ".join(health.problems)
        or f"reject rate {health.reject_rate:.1%} within {health.max_reject_rate:.0%}",
        metadata={
            "reject_rate": float(round(health.reject_rate, 4)),
            "max_reject_rate": health.max_reject_rate,
            "accepted": counts.accepted,
            "read": counts.read,
            "rejects_by_reason": dg.MetadataValue.json(counts.rejects_by_reason),
        },
    )


def _source_asset(spec: SourceSpec, n_shards: int) -> dg.AssetsDefinition:
    name = source_asset_name(spec)

    @dg.asset(
        name=name,
        group_name=ASSET_GROUP,
        description=source_description(spec),
        kinds={"parquet"},
        tags={STAGE_TAG: STAGE},
        check_specs=[
            dg.AssetCheckSpec(
                SOURCE_CHECK,
                asset=name,
                blocking=False,
                description=f"WARN when the source yields no prompt (allow_empty: true) or rejects more than "
                f"max_reject_rate ({spec.max_reject_rate:.0%}) of what it reads; with no accepted prompt "
                "and no allow_empty the asset itself fails.",
            )
        ],
    )
    def _asset(context: dg.AssetExecutionContext, pipeline: PipelineSettings) -> dg.MaterializeResult:
        out_dir = pipeline.data_path / "sources" / spec.name
        try:
            # an empty source (unless allowed) fails here and writes nothing: the previous outputs stay
            counts = ingest_source(spec, out_dir, n_shards=n_shards, require_accepted=not spec.allow_empty)
        except EmptySourceError as e:
            context.log.error(str(e))
            raise dg.Failure(description=str(e)) from None
        context.log.info(
            f"source {spec.name}: read {counts.read:,} = accepted {counts.accepted:,} + rejected "
            f"{counts.rejected:,} + duplicates {counts.duplicates:,} + sampled out {counts.sampled_out:,}"
        )
        health = assess(spec, counts)
        for problem in health.problems:
            context.log.warning(problem)
        return dg.MaterializeResult(
            metadata={
                **to_metadata(counts),
                "reject_rate": float(round(health.reject_rate, 4)),
                "path": dg.MetadataValue.path(str(out_dir)),
                # where the prompts came from: the YAML's path or glob (a URI without its query)
                "source_path": display_uri(spec.path),
                "licence": spec.licence or "not stated",
                **report_metadata(default_report_path(pipeline.work_path)),
            },
            check_results=[source_yield_check(counts, health)],
        )

    return _asset


def log_combined(context: Any, counts: Any, evals: list[SourceSpec], probes: list[SourceSpec]) -> None:
    """What combining the sources did: the counts, and the prompts quarantined against eval and probe sets."""
    context.log.info(
        f"prompts: {counts.prompts:,} from {counts.sources} source(s) ({counts.read:,} read, "
        f"{counts.rejects:,} rejected, {counts.source_duplicates + counts.cross_source_duplicates:,} "
        f"duplicates, {counts.sampled_out:,} sampled out)"
    )
    if evals:
        context.log.info(
            f"decontamination: {counts.eval_overlap:,} training prompt(s) quarantined as eval_overlap "
            f"against {counts.eval_prompts:,} prompt(s) of {len(evals)} eval source(s) "
            f"({', '.join(s.name for s in evals)}); by training source: {counts.eval_overlap_by_source}"
        )
    if probes:
        context.log.info(
            f"probe sets ({', '.join(s.name for s in probes)}): generated for every drafter, never trained on; "
            f"{counts.probe_overlap:,} training prompt(s) quarantined as probe_overlap; by training source: "
            f"{counts.probe_overlap_by_source}"
        )


def build_ingest_assets(s: Settings) -> list[dg.AssetsDefinition]:
    """One asset per source YAML of `s.storage.sources_dir` and `prompts`, sharding into `s.shards.n_shards` shards."""
    n_shards = s.shards.n_shards
    specs = load_source_specs(s.storage.sources_dir)
    source_assets = [_source_asset(spec, n_shards) for spec in specs]
    # probe sets last: a training prompt equal to a probe prompt is quarantined (probe_overlap), not deduplicated
    names = [x.name for x in specs if x.role == "train"] + [x.name for x in specs if x.role == "probe"]
    evals = [x for x in specs if x.role == "eval"]
    probes = [x for x in specs if x.role == "probe"]

    @dg.asset(
        name=AssetName.PROMPTS,
        group_name=ASSET_GROUP,
        deps=[a.key for a in source_assets],
        description="All training sources combined: canonical conversations, cross-source duplicates removed, "
        "prompts overlapping a `role: eval` source quarantined (eval_overlap), stable shard per prompt.",
        kinds={"parquet"},
        tags={STAGE_TAG: STAGE},
    )
    def prompts(context: dg.AssetExecutionContext, pipeline: PipelineSettings) -> dg.MaterializeResult:
        data = pipeline.data_path
        eval_sets = [
            EvalSet(x.name, data / "sources" / x.name, x.overlap_threshold or DEFAULT_OVERLAP_THRESHOLD) for x in evals
        ]
        probe_sets = [
            EvalSet(x.name, data / "sources" / x.name, x.overlap_threshold or DEFAULT_OVERLAP_THRESHOLD) for x in probes
        ]
        counts = combine_sources(
            [data / "sources" / n for n in names],
            data / "prompts",
            n_shards=n_shards,
            eval_sets=eval_sets,
            control_text={x.name: x.control_text for x in specs},
            probe_sets=probe_sets,
        )
        out = data / "prompts" / "prompts.parquet"
        per_shard = (
            read_parquet(out, columns=["shard"]).group_by("shard").len().sort("shard").to_dicts()
            if out.exists()
            else []
        )
        log_combined(context, counts, evals, probes)
        # the last `eagle3 plan` for this data dir, beside what ingest produced (docs/plan.md)
        plan_meta, plan_warning = plan_headlines(read_plan(data), counts.prompts)
        if plan_warning:
            context.log.warning(plan_warning)
        return dg.MaterializeResult(
            metadata={
                **to_metadata(counts),
                **plan_meta,
                "rows_per_shard": dg.MetadataValue.json({f"{r['shard']:04d}": r["len"] for r in per_shard}),
                "n_shards": n_shards,
                "path": dg.MetadataValue.path(str(out)),
                "preview": dg.MetadataValue.md(
                    prompts_preview_markdown(read_parquet(out, n_rows=8) if out.exists() else pl.DataFrame())
                ),
                **report_metadata(default_report_path(pipeline.work_path)),
            }
        )

    return [*source_assets, prompts]


def build_defs(s: Settings) -> dg.Definitions:
    """One asset per source YAML (the list is read when the definitions are built) and `prompts`."""
    return dg.Definitions(assets=build_ingest_assets(s))
