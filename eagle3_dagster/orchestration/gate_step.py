"""The gated shard step's result: the shard's per-row feature frame validated with the stage's GX suite
(`mostly` semantics), the gate result stored and the step's MaterializeResult with its asset checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from ..quality import run_gate, write_gate_result
from ..storage import write_frame_atomic


@dataclass(frozen=True)
class GatedShard:
    """What a stage hands back to be gated: the per-row features the gate validates, and what to report."""

    features: pl.DataFrame
    metadata: Mapping[str, Any]
    quarantine: Path | None = None  # where rows failing a critical expectation are written (None: not written)
    outcomes: tuple[Any, ...] = ()  # shard-level outcomes judged outside the suite, stored with the gate's
    checks: tuple[dg.AssetCheckResult, ...] = ()  # check results of the asset's own extra checks


def gated_result(
    pipeline: Any, gate: str, shard: int, profile: Any, gated: GatedShard, *, headlines: tuple[Any, ...] = ()
) -> tuple[Any, dg.MaterializeResult]:
    """Validate the shard's feature frame (`gated.features`) with expectations/<gate>.json, store the gate
    result (blocks later consumers), write the rows failing a critical expectation to `gated.quarantine` if
    given (metadata `quarantined`); return (the gate result, the step's MaterializeResult with its checks).
    `gated.outcomes`: shard-level outcomes judged outside the suite (the request failure budget), stored and
    reported with the gate's; a failed critical one fails the gate. (`gated.checks` are the caller's.)"""
    from ..quality.request_failures import with_outcome
    from .gates import gate_check_results

    result = run_gate(
        gate,
        gated.features,
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
        profile=profile,
    )
    for outcome in gated.outcomes:  # shard-level outcomes judged outside the suite (quality/request_failures.py)
        result = with_outcome(result, outcome)
    write_gate_result(pipeline.data_path, gate, shard, result)
    metadata = dict(gated.metadata)
    if gated.quarantine is not None:
        write_frame_atomic(result.row_failures, gated.quarantine)
        metadata = {**metadata, "quarantined": result.row_failures.height}
    return result, dg.MaterializeResult(
        metadata=metadata,
        check_results=gate_check_results(gate, result, headlines),
    )
