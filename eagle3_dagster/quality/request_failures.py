"""The per-shard failure budget: requests that failed leave no row for the gate's row-level expectations to
judge, so their rate is judged here, as one shard-level outcome of the generations gate. Every failure in
errors.parquet counts, and the description counts apart the permanent ones (not sent again) and the
retryable ones (the next run sends them again: a refused answer, a stall, a server error body).

Over `max_failed_rate` the outcome is critical (the gate fails: the shard is left out of snapshots and
the manifest names the rate and the top reason); above 0 but within the budget it is a failed warning.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..generate.request_errors import is_permanent_reason
from ..secret import printable
from .gate import ExpectationOutcome, GateResult

FAILURE_BUDGET_KEY = "request_failure_rate"
DEFAULT_MAX_FAILED_RATE = 0.01


def failure_budget_outcome(
    *,
    requested: int,
    failed: int,
    errors_by_kind: Mapping[str, int],
    failure_details: Mapping[str, str],
    max_failed_rate: float,
) -> ExpectationOutcome:
    """The shard's failed requests against its budget (`failed / requested`); the description counts the
    permanent and the retryable ones apart."""
    if not 0.0 <= max_failed_rate <= 1.0:
        raise ValueError(f"max_failed_rate must be within [0, 1], got {max_failed_rate}")
    rate = failed / requested if requested else 0.0
    over = rate > max_failed_rate
    top = max(sorted(errors_by_kind), key=lambda k: errors_by_kind[k]) if errors_by_kind else None
    name = f"request failure rate {rate:.2%} (budget {max_failed_rate:.2%})"
    if top is not None:
        name += f", top reason {top}={errors_by_kind[top]:,}"
    if failed:
        detail = failure_details.get(top or "", "")
        description = (
            f"{failed:,} of {requested:,} requests failed ("
            + _by_permanence(errors_by_kind)
            + ")"
            + (f"; last {top}: {printable(detail)[:200]}" if detail else "")
            + (
                ": over the shard's max_failed_rate, the shard is left out of snapshots"
                if over
                else ": within max_failed_rate (a warning)"
            )
            + "; the rows are in the shard's errors.parquet"
        )
    else:
        description = f"none of the {requested:,} requests failed"
    return ExpectationOutcome(
        name=name,
        severity="critical" if over else "warning",
        mostly=1.0 - max_failed_rate,
        pass_rate=1.0 - rate,
        unexpected_count=failed,
        success=failed == 0,
        description=description,
        key=FAILURE_BUDGET_KEY,
        expectation_type="request_failure_budget",
        evaluated=requested,
        level="shard",
        observed_value=round(rate, 6),
    )


def _by_permanence(errors_by_kind: Mapping[str, int]) -> str:
    """`1 permanent, not sent again: http_400=1; 2 retryable, the next run sends them again: stall=2`"""
    ranked = sorted(errors_by_kind.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = []
    for permanent, what in ((True, "permanent, not sent again"), (False, "retryable, the next run sends them again")):
        part = [(k, v) for k, v in ranked if is_permanent_reason(k) == permanent]
        if part:
            total = sum(v for _, v in part)
            parts.append(f"{total:,} {what}: " + ", ".join(f"{k}={v:,}" for k, v in part))
    return "; ".join(parts)


CONTEXT_FIT_KEY = "context_overflow"


def context_fit_outcome(
    *, requested: int, fitted: int, skipped: int, context_length: int | None, max_new_tokens: int, mode: str
) -> ExpectationOutcome:
    """Prompts whose prompt + max_new_tokens exceeded the server's context length (generate/context_fit.py):
    a warning naming how many were sent with a lowered max_new_tokens (their traces are shorter) and how
    many were not sent (context_overflow, also in the failure budget)."""
    n = fitted + skipped
    ctx = f"{context_length:,}" if context_length is not None else "unknown"
    name = f"prompt + max_new_tokens {max_new_tokens:,} within the context length {ctx}"
    if n:
        description = (
            f"{n:,} of {requested:,} prompts exceed it ({mode} mode): {fitted:,} sent with max_new_tokens lowered to "
            f"context - prompt tokens, {skipped:,} not sent (reason context_overflow in errors.parquet)"
        )
    else:
        description = f"every sent prompt fits with max_new_tokens {max_new_tokens:,}"
    return ExpectationOutcome(
        name=name,
        severity="warning",
        mostly=1.0,
        pass_rate=1.0 - (n / requested if requested else 0.0),
        unexpected_count=n,
        success=n == 0,
        description=description,
        key=CONTEXT_FIT_KEY,
        expectation_type="context_overflow",
        evaluated=requested,
        level="shard",
        observed_value={"fitted": fitted, "skipped": skipped, "context_length": context_length},
    )


def with_outcome(result: GateResult, outcome: ExpectationOutcome) -> GateResult:
    """The gate result with one more outcome; a failed critical one fails the gate."""
    result.outcomes = [*result.outcomes, outcome]
    if outcome.severity == "critical" and not outcome.success:
        result.success = False
    return result
