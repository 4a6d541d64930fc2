"""The gated-shard asset factory: what every shard asset shares is defined once, from its spec."""

from __future__ import annotations

from types import SimpleNamespace

import dagster as dg
import pytest

from eagle3_dagster.orchestration.asset_names import STAGE_TAG
from eagle3_dagster.orchestration.partitions import shard_partitions
from eagle3_dagster.orchestration.shard_asset import (
    GatedShard,
    ShardAssetSpec,
    ShardStep,
    gated_shard_asset,
    run_gated_step,
)
from eagle3_dagster.stopping import StopRequested

SPEC = ShardAssetSpec(
    name="widgets",
    gate="widgets",
    stage="make",
    deps=("parts",),
    description="test widgets",
    pool="sglang",
    retry_policy=dg.RetryPolicy(max_retries=2),
    resources=frozenset({"pipeline", "sglang"}),
    no_retry=(StopRequested,),
)


def _stopped(step: ShardStep) -> GatedShard:
    raise StopRequested("stop requested (SIGTERM)")


def test_the_spec_makes_a_partitioned_pooled_retried_asset_with_its_gate_checks():
    asset = gated_shard_asset(SPEC, shard_partitions(3))(_stopped)
    assert asset.key == dg.AssetKey("widgets") and asset.partitions_def == shard_partitions(3)
    assert list(asset.partitions_def.get_partition_keys()) == ["0000", "0001", "0002"]
    assert asset.op.pool == "sglang" and asset.op.retry_policy == dg.RetryPolicy(max_retries=2)
    assert {"pipeline", "sglang"} <= asset.required_resource_keys
    assert [(c.name, c.blocking) for c in asset.check_specs] == [("widgets_gate", True)]
    spec = next(iter(asset.specs))
    assert spec.tags[STAGE_TAG] == "make" and [d.asset_key for d in spec.deps] == [dg.AssetKey("parts")]


def test_a_stage_error_a_retry_would_repeat_fails_the_step_without_retries():
    pipeline = SimpleNamespace(profile=lambda: SimpleNamespace(name="p"))
    context = SimpleNamespace(resources=SimpleNamespace(pipeline=pipeline), partition_key="0002")
    with pytest.raises(dg.Failure) as e:
        run_gated_step(SPEC, _stopped, context)  # type: ignore[arg-type]
    assert e.value.allow_retries is False
    assert e.value.description == "widgets shard 0002: StopRequested: stop requested (SIGTERM)"
