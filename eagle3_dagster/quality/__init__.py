"""Quality gates: polars feature frames, GX gates (suites in expectations/); the report is in report/.

No Dagster imports here: the asset checks in eagle3_dagster/defs/ call these functions.
"""

from .features import generation_features, prompt_features, tool_marker_grammar, training_features
from .gate import (
    ExpectationOutcome,
    GateConsistencyError,
    GateFailedError,
    GateResult,
    gate_result_path,
    quarantined_ids,
    read_gate_result,
    require_gate_passed,
    run_gate,
    write_gate_result,
)
from .suites import GATES, SuiteError, load_suite

__all__ = [
    "GATES",
    "ExpectationOutcome",
    "GateConsistencyError",
    "GateFailedError",
    "GateResult",
    "SuiteError",
    "gate_result_path",
    "generation_features",
    "load_suite",
    "prompt_features",
    "quarantined_ids",
    "read_gate_result",
    "require_gate_passed",
    "run_gate",
    "tool_marker_grammar",
    "training_features",
    "write_gate_result",
]
