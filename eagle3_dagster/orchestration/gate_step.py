"""The gated shard step's result: the shard's per-row feature frame validated with the stage's GX suite
(`mostly` semantics), the gate result stored and the step's MaterializeResult with its asset checks."""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl

from ..quality import run_gate, write_gate_result
from ..storage import write_frame_atomic


def gated_result(  # noqa: PLR0913
    context: Any,
    pipeline: Any,
    gate: str,
    shard: int,
    features: pl.DataFrame,
    profile: Any,
    *,
    metadata: dict[str, Any],
    headlines: tuple[Any, ...] = (),
    quarantine: Any = None,
    extra_outcomes: tuple[Any, ...] = (),
) -> tuple[Any, dg.MaterializeResult]:
    """Validate the shard's feature frame with expectations/<gate>.json, store the gate result (blocks later
    consumers), write the rows failing a critical expectation to `quarantine` if given
    (metadata `quarantined`); return (the gate result, the step's MaterializeResult with its checks).
    `extra_outcomes`: shard-level outcomes judged outside the suite (the request failure budget), stored and
    reported with the gate's; a failed critical one fails the gate."""
    from ..quality.request_failures import with_outcome
    from .gates import gate_check_results

    result = run_gate(
        gate,
        features,
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
        profile=profile,
    )
    for outcome in extra_outcomes:  # shard-level outcomes judged outside the suite (quality/request_failures.py)
        result = with_outcome(result, outcome)
    write_gate_result(pipeline.data_path, gate, shard, result)
    if quarantine is not None:
        write_frame_atomic(result.row_failures, quarantine)
        metadata = {**metadata, "quarantined": result.row_failures.height}
    return result, dg.MaterializeResult(
        metadata=metadata,
        check_results=gate_check_results(gate, result, headlines),
    )
