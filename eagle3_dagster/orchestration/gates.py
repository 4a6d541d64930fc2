"""Gate results -> blocking asset-check results.

A gate is one GX suite (expectations/<gate>.json) validated on a polars feature frame. Each
stage asset runs its gate in-step and reports it through `check_specs`, so a failed ERROR
check blocks every downstream asset in the same run; the stored gate result
(data/gates/<gate>/shard=NNNN.json) blocks consumers in later runs too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dagster as dg

EMPTY_NOTE = "the shard has 0 rows, so no expectation judged anything (not blocking, not a pass)"


@dataclass(frozen=True)
class HeadlineCheck:
    """A single expectation surfaced as its own asset check, by its name in the suite."""

    check_name: str
    expectation_key: str  # the stable `meta.key` of the expectation in the suite JSON
    description: str


def gate_check_specs(asset_name: str, gate: str, headlines: tuple[HeadlineCheck, ...]) -> list[dg.AssetCheckSpec]:
    specs = [
        dg.AssetCheckSpec(h.check_name, asset=asset_name, blocking=True, description=h.description) for h in headlines
    ]
    specs.append(
        dg.AssetCheckSpec(
            f"{gate}_gate",
            asset=asset_name,
            blocking=True,
            description=f"Every critical expectation of expectations/{gate}.json meets its `mostly` threshold.",
        )
    )
    return specs


def shard_values(values: dict[str, Any]) -> dg.TableMetadataValue:
    """One shard's numbers as a one-row table. A check's bare numeric metadata is plotted by Dagster's
    check page as one time series over every execution, i.e. across shards (a meaningless zigzag of
    shard sizes); a table is shown as the values of that execution only."""
    columns = [
        dg.TableColumn(k, "float" if isinstance(v, float) else "int" if isinstance(v, int) else "string")
        for k, v in values.items()
    ]
    return dg.MetadataValue.table([dg.TableRecord(values)], schema=dg.TableSchema(columns=columns))


def _outcome_metadata(o: Any) -> dict[str, Any]:
    return {
        "result": shard_values(
            {
                "pass_rate": float(o.pass_rate),
                "mostly": float(o.mostly),
                "unexpected_count": int(o.unexpected_count),
                "severity": str(o.severity),
            }
        )
    }


def gate_check_results(gate: str, result: Any, headlines: tuple[HeadlineCheck, ...]) -> list[dg.AssetCheckResult]:
    by_key = {o.key: o for o in result.outcomes}
    out: list[dg.AssetCheckResult] = []
    for h in headlines:
        o = by_key.get(h.expectation_key)
        if o is None:
            # A suite edited so that the headline expectation is gone must not pass silently.
            out.append(
                dg.AssetCheckResult(
                    check_name=h.check_name,
                    passed=False,
                    severity=dg.AssetCheckSeverity.ERROR,
                    description=f"expectation with key {h.expectation_key!r} is not in expectations/{gate}.json",
                )
            )
            continue
        empty = result.n_rows == 0 and o.success
        out.append(
            dg.AssetCheckResult(
                check_name=h.check_name,
                passed=bool(o.success),
                severity=dg.AssetCheckSeverity.ERROR if o.severity == "critical" else dg.AssetCheckSeverity.WARN,
                description=(f"EMPTY: {EMPTY_NOTE}; " if empty else "") + f"{o.name}: {o.description}",
                metadata={"status": "EMPTY" if empty else ("PASS" if o.success else "FAIL"), **_outcome_metadata(o)},
            )
        )
    failing = [o for o in result.outcomes if not o.success]
    meta: dict[str, Any] = {
        "status": result.status,  # EMPTY: passed on 0 rows (not blocking; nothing was judged)
        "result": shard_values({"rows": int(result.n_rows), "rows_failing_critical": int(result.row_failures.height)}),
        "failed_expectations": dg.MetadataValue.json(
            [{"name": o.name, "severity": o.severity, "pass_rate": o.pass_rate, "mostly": o.mostly} for o in failing]
        ),
        "expectations": dg.MetadataValue.md(outcomes_table(result.outcomes, n_rows=int(result.n_rows))),
    }
    if getattr(result, "data_docs_page", None):  # this run's own page, written by the run's quality report
        meta["data_docs_page"] = dg.MetadataValue.url("file://" + str(result.data_docs_page))
    out.append(
        dg.AssetCheckResult(
            check_name=f"{gate}_gate",
            passed=bool(result.success),
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"EMPTY: {EMPTY_NOTE}" if result.status == "EMPTY" else None,
            metadata=meta,
        )
    )
    return out


def outcomes_table(outcomes: Any, *, n_rows: int | None = None) -> str:
    lines = ["| expectation | severity | pass rate | mostly | unexpected | ok |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(
            f"| {o.name} | {o.severity} | {_rate(o, n_rows)} | {o.mostly} | {o.unexpected_count} | {'yes' if o.success else '**NO**'} |"
        )
    return "\n".join(lines)


def _rate(o: Any, n_rows: int | None) -> str:
    """The pass rate; for a row-level expectation that applied to no row, "empty" (a shard of 0 rows)
    or "skipped" (rows, but none the expectation applies to)."""
    if getattr(o, "evaluated", 1) or getattr(o, "level", "row") == "table":
        return f"{o.pass_rate:.4f}"
    return "empty" if n_rows == 0 else "skipped"
