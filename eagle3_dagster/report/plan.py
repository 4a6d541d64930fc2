"""The report's "Plan vs actual" section: the last `eagle3 plan` (data/plan/plan.json) beside what the
tables hold now (eagle3_dagster/plan/actual.py). Shown only when a plan exists."""

from __future__ import annotations

import html
from typing import Any


def _num(v: Any) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if isinstance(v, (int, float)) else html.escape(str(v))


def _ratio(planned: Any, actual: Any) -> str:
    if not isinstance(planned, (int, float)) or not isinstance(actual, (int, float)) or not planned:
        return "—"
    return f"{actual / planned:.2f}"


def plan_section(view: dict[str, Any] | None) -> list[str]:
    if not view:
        return []
    e = html.escape
    h = [
        "<h2>Plan vs actual</h2>",
        f'<div class="small">plan of {e(str(view["created_at"]))} (<code>eagle3 plan</code>); output tokens from '
        f"{e(str(view.get('output_basis') or '?'))}, throughput {e(str(view.get('throughput_basis') or '?'))}; "
        "actual requests, output tokens and time: generations stored since the plan</div>",
        "<table><tr><th>figure</th><th>planned</th><th>actual</th><th>actual / planned</th></tr>",
    ]
    for r in view["rows"]:
        h.append(
            f'<tr><td>{e(r["metric"])}</td><td class="num">{_num(r["planned"])}</td>'
            f'<td class="num">{_num(r["actual"])}</td><td class="num">{_ratio(r["planned"], r["actual"])}</td></tr>'
        )
    h.append("</table>")
    return h
