"""One factory for the gated shard assets (tokenize, generate, train): the asset body is the stage's call.

Everything a shard step shares lives here once: the partitions it is given, the pool and retry policy, the
gate's asset checks, resources, turning a stage error into a loud `dg.Failure`, and, after the stage
has run, the gate over its per-row features (stored, quarantined rows written, checks and metadata
returned). A stage's body receives a `ShardStep` and returns a `GatedShard`: its features, metadata,
quarantine path and any shard-level outcomes or extra check results.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from ..profiles import ModelProfile
from ..storage import parse_shard_key, shard_dir
from .asset_names import ASSET_GROUP, STAGE_TAG
from .gate_step import GatedShard, gated_result
from .gates import HeadlineCheck, gate_check_specs
from .resources import PipelineSettings


@dataclass(frozen=True)
class ShardStep:
    """One shard's step as its stage sees it: the context, the pipeline settings, the shard and its profile."""

    context: dg.AssetExecutionContext
    pipeline: PipelineSettings
    shard: int
    profile: ModelProfile

    @property
    def data(self) -> Any:
        return self.pipeline.data_path

    @property
    def key(self) -> str:
        return f"{self.shard:04d}"

    @property
    def log(self) -> Any:
        return self.context.log

    def resource(self, name: str) -> Any:
        return getattr(self.context.resources, name)

    def folder(self, table: str) -> Any:
        """The shard's folder of `table` (local or object storage)."""
        return shard_dir(self.data, table, self.shard)


@dataclass(frozen=True)
class ShardAssetSpec:
    """The definition of a gated shard asset; the factory adds partitions, group, kinds and the gate's checks."""

    name: str
    gate: str  # expectations/<gate>.json
    stage: str  # the `eagle3/stage` tag
    deps: tuple[str, ...]
    description: str
    headlines: tuple[HeadlineCheck, ...] = ()
    extra_checks: tuple[dg.AssetCheckSpec, ...] = ()
    pool: str | None = None
    retry_policy: dg.RetryPolicy | None = None
    resources: frozenset[str] = frozenset({"pipeline"})
    # stage errors a retry would only repeat (a bounded wait already spent, a refusal, a stop request)
    no_retry: tuple[type[BaseException], ...] = field(default=())

    def check_specs(self) -> list[dg.AssetCheckSpec]:
        return [*gate_check_specs(self.name, self.gate, self.headlines), *self.extra_checks]


StageBody = Callable[[ShardStep], GatedShard]


def run_gated_step(spec: ShardAssetSpec, body: StageBody, context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """Run the stage's body for the context's shard, then gate what it produced."""
    pipeline: PipelineSettings = context.resources.pipeline
    step = ShardStep(context, pipeline, parse_shard_key(context.partition_key), pipeline.profile())
    try:
        gated = body(step)
    except spec.no_retry as e:
        raise dg.Failure(
            description=f"{spec.name} shard {step.key}: {type(e).__name__}: {e}", allow_retries=False
        ) from e
    _, result = gated_result(pipeline, spec.gate, step.shard, step.profile, gated, headlines=spec.headlines)
    if gated.checks:
        result = result._replace(check_results=[*(result.check_results or []), *gated.checks])
    return result


def gated_shard_asset(
    spec: ShardAssetSpec, partitions: dg.PartitionsDefinition
) -> Callable[[StageBody], dg.AssetsDefinition]:
    """Decorator: a stage body (ShardStep -> GatedShard) as the gated asset `spec` describes, over `partitions`
    (orchestration/partitions.shard_partitions of the settings the definitions are built from)."""

    def build(body: StageBody) -> dg.AssetsDefinition:
        @dg.asset(
            name=spec.name,
            group_name=ASSET_GROUP,
            deps=list(spec.deps),
            partitions_def=partitions,
            pool=spec.pool,
            retry_policy=spec.retry_policy,
            check_specs=spec.check_specs(),
            description=spec.description,
            kinds={"parquet"},
            tags={STAGE_TAG: spec.stage},
            required_resource_keys=set(spec.resources),
        )
        def shard_asset(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
            return run_gated_step(spec, body, context)

        return shard_asset

    return build
