"""The quality report's "Candidate drafters" section: every stored comparison of a candidate drafter with
production's (drafters/run.py, `<data>/probes/comparisons/`), newest first: the candidate's identity and
lineage, the decision with its reasons, and a per-source interval chart and table.

    collect_candidates(data) -> list[dict]     (the stored comparison documents)
    candidates_section(docs) -> list[str]      (HTML lines; [] when there is none)
"""

from __future__ import annotations

import html
import math
from typing import Any

from ..drafters.store import read_comparisons
from ..drafters.text import identity_line
from ..storage import DataPath
from . import svg


def collect_candidates(data: DataPath) -> list[dict[str, Any]]:
    return read_comparisons(data)


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _num(v: Any) -> float:
    return float(v) if v is not None else math.nan


def _f(v: Any, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(float(v), fmt)


def _chart(doc: dict[str, Any]) -> str:
    rows = [*(doc.get("sources") or []), *([doc["overall"]] if doc.get("overall") else [])]
    margin = (doc.get("rule") or {}).get("margin")
    return svg.intervals(
        f"accept length, candidate - production ({_f(rows[-1].get('confidence', 0.95), '.0%')} interval)",
        [
            (
                str(r["source"]),
                _num(r["difference"]),
                _num((r.get("interval") or [None])[0]),
                _num((r.get("interval") or [None, None])[1]),
                str(r["verdict"]),
            )
            for r in rows
        ],
        x_label="tokens per verify step",
        marks={"margin": float(margin)} if margin is not None else {},
    )


def _table(doc: dict[str, Any]) -> list[str]:
    h = [
        "<table><tr><th>probe source</th><th>prompts</th><th>production</th><th>candidate</th><th>difference</th>"
        "<th>interval</th><th>verdict</th><th>accept rate (production → candidate)</th><th>note</th></tr>"
    ]
    for r in [*(doc.get("sources") or []), *([doc["overall"]] if doc.get("overall") else [])]:
        lo, hi = r.get("interval") or (None, None)
        rate = (
            f"{_f(r['production_accept_rate'])} → {_f(r['candidate_accept_rate'])}"
            if r.get("rate_difference") is not None
            else "not compared"
        )
        h.append(
            f'<tr><td><code>{_e(r["source"])}</code></td><td class="num">{r["prompts"]}</td>'
            f'<td class="num">{_f(r["production_accept_length"])}</td><td class="num">{_f(r["candidate_accept_length"])}</td>'
            f'<td class="num">{_f(r["difference"], "+.3f")}</td><td>[{_f(lo, "+.3f")}, {_f(hi, "+.3f")}]</td>'
            f"<td>{_e(r['verdict'])}</td><td>{_e(rate)}</td><td>{_e(r.get('too_few') or '')}</td></tr>"
        )
    h.append("</table>")
    return h


def _one(doc: dict[str, Any]) -> list[str]:
    cand = doc.get("candidate") or {}
    decision = str(doc.get("decision", "?"))
    badge = "PASS" if decision == "promote" else "FAIL"
    h = [
        f'<h3><code>{_e(cand.get("drafter_id", "?"))}</code> <span class="badge {badge}">{_e(decision.upper())}</span> '
        f'<span class="small">{_e(doc.get("compared_at", ""))}</span></h3>',
        f"<p><b>{_e(doc.get('headline') or doc.get('refused') or '')}</b></p>",
        f'<p class="small">{_e(identity_line("candidate", cand))}<br>{_e(identity_line("production", doc.get("production")))}</p>',
        "<ul>" + "".join(f"<li>{_e(r)}</li>" for r in doc.get("reasons") or []) + "</ul>",
    ]
    if doc.get("overall"):
        h.append(_chart(doc))
        h.extend(_table(doc))
    if doc.get("notes"):
        h.append('<ul class="small">' + "".join(f"<li>{_e(n)}</li>" for n in doc["notes"]) + "</ul>")
    return h


def candidates_section(docs: list[dict[str, Any]]) -> list[str]:
    if not docs:
        return []
    h = [
        '<h2 id="candidate-drafters">Candidate drafters</h2>',
        "<p>Every comparison of a candidate drafter with production's on the probe sets (<code>eagle3 drafters "
        "compare</code>, the <code>drafter_comparison</code> asset), newest first: accept length per probe source "
        "and overall, the difference with its paired bootstrap interval, and the decision by "
        "<code>expectations/drafter_promotion.json</code>.</p>",
    ]
    for doc in docs:
        h.extend(_one(doc))
    return h
