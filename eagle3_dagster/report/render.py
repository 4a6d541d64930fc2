"""The quality report's HTML: one self-contained page from a ReportModel (pure; no I/O).

Every string that comes from data (expectation names, reasons, versions, paths) is HTML-escaped.
Links to GX Data Docs validation pages are relative when the report sits inside the work dir
(`<work_dir>/reports/index.html`, next to `gx/`), file:// URIs otherwise, and left out when the
page no longer exists (pruned by EAGLE3_GX_KEEP_VALIDATIONS).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..storage import PathLike
from . import charts
from .acceptance import acceptance_section
from .candidates import candidates_section
from .decontamination import decontamination_section
from .model import GATE_ASSET, ExpectationIssue, GateCell, ReportModel, ShardRow
from .plan import plan_section
from .probes import probes_section
from .turns import turns_section

# --------------------------------------------------------------------------------------------- render

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:1.5em;color:#1d1d1f}
h1{font-size:1.4em;margin:0 0 .3em} h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}
h3{font-size:1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;margin:.4em 0} th,td{border:1px solid #ccc;padding:.35em .6em;vertical-align:top;text-align:left}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.meta td{border:none;padding:.1em .8em .1em 0} .small{font-size:.85em;color:#555}
.badge{display:inline-block;font-weight:bold;padding:.05em .5em;border-radius:3px}
.PASS{background:#d8f5d8;color:#135c13} .FAIL{background:#fbd5d5;color:#8a1111}
.notrun{background:#eee;color:#555} .EMPTY{background:#e3ecf7;color:#1d3f66} .unreadable{background:#fde9c8;color:#7a4b00} .WARN{background:#fff1c2;color:#6b5200}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
.charts{display:flex;flex-wrap:wrap;gap:12px;margin:.5em 0} svg.chart{border:1px solid #ddd;max-width:100%;height:auto}
.alert{border-left:5px solid #c62828;background:#fdecea;padding:.6em .9em;margin:.8em 0}
.warnbox{border-left:5px solid #b58900;background:#fff8e1;padding:.6em .9em;margin:.8em 0}
.okbox{border-left:5px solid #2e7d32;background:#edf7ed;padding:.6em .9em;margin:.8em 0}
details>summary{cursor:pointer;font-weight:bold;margin:.4em 0}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _is_within(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def link_href(target: Path, report_path: Path, work_dir: Path) -> str:
    """Relative (URL-quoted) when the report is inside the work dir, else an absolute file:// URI."""
    report_dir = report_path.resolve().parent
    if _is_within(report_dir, work_dir) and _is_within(target, work_dir):
        rel = os.path.relpath(target.resolve(), report_dir)
        return "/".join(quote(part) for part in rel.split(os.sep))
    return target.resolve().as_uri()


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _issue_text(i: ExpectationIssue) -> str:
    parts: list[str] = []
    obs = i.observed_value
    if i.evaluated and (i.level == "row" or obs is None):
        up = i.unexpected_percent or 0.0
        parts.append(
            f"{i.unexpected_count} of {i.evaluated} rows unexpected ({up:.1f}%); pass rate "
            f"{_pct(i.pass_rate)} &lt; mostly {_pct(i.mostly)}"
        )
    if obs is not None:
        if not isinstance(obs, str):
            try:
                obs = json.dumps(obs, default=str)
            except (TypeError, ValueError):
                obs = str(obs)
        if len(obs) > 300:
            obs = obs[:300] + "…"
        parts.append(f"observed value <code>{_e(obs)}</code>" + (f" (mostly {_pct(i.mostly)})" if i.mostly < 1 else ""))
    return "; ".join(parts) or "failed (no observed value)"


def _badge(status: str, text: str | None = None) -> str:
    cls = {"not run": "notrun"}.get(status, status)
    return f'<span class="badge {_e(cls)}">{_e(text or status)}</span>'


def _cell_html(c: GateCell, report_path: Path, work_dir: Path, blocked_by: str | None = None) -> str:
    if c.status == "not run":
        note = f'<div class="small">blocked: the <code>{_e(blocked_by)}</code> gate failed</div>' if blocked_by else ""
        return f"<td>{_badge('not run')}{note}</td>"
    if c.status == "unreadable":
        return f'<td>{_badge("unreadable")}<div class="small">{_e(c.error)}</div></td>'
    warnings = [i for i in c.issues if i.severity != "critical"]
    failed = [i for i in c.issues if i.severity == "critical"]
    parts = [_badge(c.status, "empty" if c.status == "EMPTY" else None)]
    if warnings:
        parts.append(" " + _badge("WARN", f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}"))
    parts.append(f'<div class="small">ran {_e(c.created_at)}</div>')
    parts.append(f'<div class="small">{c.n_rows} rows, {c.n_quarantined} quarantined</div>')
    links = []
    if c.issues or c.reasons:
        links.append(f'<a href="#{_e(c.anchor)}">details</a>')
    if c.docs_page is not None:
        links.append(f'<a href="{_e(link_href(c.docs_page, report_path, work_dir))}">Data Docs</a>')
    if links:
        parts.append(f'<div class="small">{" · ".join(links)}</div>')
    if failed:
        parts.append(
            '<div class="small">failed: ' + ", ".join(f"<code>{_e(i.key or i.name)}</code>" for i in failed) + "</div>"
        )
    return "<td>" + "".join(parts) + "</td>"


def _details_html(row: ShardRow) -> list[str]:
    out: list[str] = []
    for g, c in row.cells.items():
        if not (c.issues or c.reasons):
            continue
        out.append(
            f'<h3 id="{_e(c.anchor)}">shard {_e(row.shard)} · gate <code>{_e(g)}</code> '
            f"(on <code>{_e(c.asset)}</code>) {_badge(c.status)}</h3>"
        )
        if c.issues:
            out.append("<table><tr><th>expectation</th><th>key</th><th>severity</th><th>result</th></tr>")
            for i in sorted(c.issues, key=lambda i: (i.severity != "critical", i.name)):
                sev = _badge("FAIL", "critical") if i.severity == "critical" else _badge("WARN", i.severity)
                out.append(
                    f"<tr><td>{_e(i.name)}</td><td><code>{_e(i.key)}</code></td><td>{sev}</td>"
                    f"<td>{_issue_text(i)}</td></tr>"
                )
            out.append("</table>")
        if c.reasons:
            out.append(
                f'<div class="small">quarantined rows by reason ({c.n_quarantined} rows; a row may have several)</div>'
            )
            out.append(_counts_table(c.reasons))
    return out


def _counts_table(counts: dict[str, int]) -> str:
    rows = "".join(f'<tr><td>{_e(r)}</td><td class="num">{n}</td></tr>' for r, n in counts.items())
    return f"<table><tr><th>reason</th><th>rows</th></tr>{rows}</table>"


def shard_fragments(
    row: ShardRow, summary: dict[str, Any] | None, report_path: Path, work: Path, gates: tuple[str, ...]
) -> dict[str, str]:
    """One shard's parts of the page (each "" when the shard has none): its row of the gates table,
    its failure details, its distribution charts and its other-rejects rows."""
    cells, failed = [], None
    for g in gates:  # gates in pipeline order: a failed gate blocks the later stages
        cells.append(_cell_html(row.cells[g], report_path, work, blocked_by=failed))
        if row.cells[g].status == "FAIL" and failed is None:
            failed = g
    other = [
        f'<tr><td>{_e(row.shard)}</td><td>{_e(lab)}</td><td>{_e(r)}</td><td class="num">{n}</td></tr>'
        for lab, c in row.other_rejects.items()
        for r, n in c.items()
    ]
    return {
        "row": f'<tr><th id="shard-{_e(row.shard)}">{_e(row.shard)}</th>' + "".join(cells) + "</tr>",
        "details": "\n".join(_details_html(row)),
        "charts": "\n".join(charts.shard_section(row.shard, summary)) if summary is not None else "",
        "other": "\n".join(other),
    }


def render(model: ReportModel, report_path: PathLike) -> str:
    """The report as one HTML document (no scripts, no external resources)."""
    rp = Path(os.fspath(report_path))
    frags = [
        shard_fragments(row, model.shard_summaries.get(row.shard), rp, model.work_dir, model.gates)
        for row in model.shards
    ]
    h = _head(model, rp)
    h.extend(plan_section(model.plan))
    h.extend(charts.top_section(model))
    h.extend(_sources_section(model))
    h.extend(decontamination_section(model.decontamination))
    h.extend(_gates_section(model, frags))
    h.extend(charts.source_gate_section(model))
    h.extend(_shard_charts(model, frags))
    h.extend(turns_section(model.turns))
    h.extend(acceptance_section(model.acceptance))
    h.extend(probes_section(model.probes))
    h.extend(candidates_section(model.candidates))
    h.extend(_other_section(frags))
    h.extend(_snapshots_section(model))
    h.append(
        '<p class="small">Written by eagle3-dagster from data/gates/&lt;gate&gt;/shard=NNNN.json, the '
        "rejects/quarantine Parquet files and data/snapshots/*/manifest.json; regenerate with "
        "<code>eagle3 report</code>.</p>"
    )
    h.append("</body></html>")
    return "\n".join(h) + "\n"


def _head(model: ReportModel, rp: Path) -> list[str]:
    """The document head and the table of what the report covers (profile, dirs, counts, LATEST, Data Docs)."""
    work = model.work_dir
    counts = model.counts()
    h: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>eagle3 data-quality report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>eagle3 data-quality report</h1>",
        '<table class="meta">',
        f"<tr><td>model profile</td><td><code>{_e(', '.join(model.profiles) or 'unknown')}</code></td></tr>",
        f"<tr><td>data dir</td><td><code>{_e(model.data_dir)}</code></td></tr>",
        f"<tr><td>work dir</td><td><code>{_e(work)}</code></td></tr>",
        f"<tr><td>generated at</td><td>{_e(model.generated_at)}</td></tr>",
        f"<tr><td>gate results</td><td>{counts['PASS']} passed, {counts['FAIL']} failed, {counts['not run']} not run"
        + (f", {counts['EMPTY']} empty (0 rows)" if counts.get("EMPTY") else "")
        + (f", {counts['unreadable']} unreadable" if counts.get("unreadable") else "")
        + "</td></tr>",
        "<tr><td>LATEST snapshot</td><td>"
        + (
            (_badge("FAIL", "stale") if model.latest.stale else _badge("PASS", "fresh"))
            + " "
            + _e(model.latest.describe(for_page=True))
            if model.latest
            else _badge("not run", "none") + " nothing published yet"
        )
        + "</td></tr>",
    ]
    if model.data_docs_index is not None:
        h.append(
            f'<tr><td>GX Data Docs</td><td><a href="{_e(link_href(model.data_docs_index, rp, work))}">index</a>'
            ' <span class="small">(its tables need scripts from the internet; the per-validation '
            "links below are static pages)</span></td></tr>"
        )
    h.append("</table>")
    return h


def _sources_section(model: ReportModel) -> list[str]:
    """Prompt sources: read/accepted/rejected and the reject-rate threshold of each."""
    h: list[str] = []
    if model.sources:
        h.append("<h2>Prompt sources</h2>")
        h.append(
            "<table><tr><th>source</th><th>read</th><th>accepted</th><th>rejected</th><th>reject rate</th>"
            "<th>threshold</th><th>status</th><th>rejects by reason</th></tr>"
        )
        for src in model.sources:
            reasons = ", ".join(f"{r} {n}" for r, n in sorted(src.rejects_by_reason.items(), key=lambda kv: -kv[1]))
            why = (
                ("no accepted prompt" if src.accepted == 0 else "reject rate above threshold")
                if src.status == "WARN"
                else None
            )
            h.append(
                f"<tr><td><code>{_e(src.name)}</code>"
                + (f' <span class="small">{src.role} set</span>' if src.role in ("eval", "probe") else "")
                + f'</td><td class="num">{src.read}</td>'
                f'<td class="num">{src.accepted}</td><td class="num">{src.rejected}</td>'
                f'<td class="num">{_pct(src.reject_rate)}</td><td class="num">{_pct(src.max_reject_rate)}</td>'
                f"<td>{_badge(src.status, why)}</td><td>{_e(reasons)}</td></tr>"
            )
        h.append("</table>")
    return h


def _gates_section(model: ReportModel, frags: list[dict[str, str]]) -> list[str]:
    """The shards x gates table, then every failed or warned expectation and quarantine by reason."""
    h: list[str] = []
    h.append("<h2>Gates by shard</h2>")
    h.append(
        "<table><tr><th>shard</th>"
        + "".join(
            f'<th><code>{_e(g)}</code><div class="small">on {_e(GATE_ASSET.get(g, g))}</div></th>' for g in model.gates
        )
        + "</tr>"
    )
    h.extend(f["row"] for f in frags)
    h.append("</table>")
    if not model.shards:
        h.append("<p>No shards and no stored gate results yet.</p>")

    details = [f["details"] for f in frags if f["details"]]
    h.append("<h2>Failed and warned expectations, quarantine by reason</h2>")
    h.extend(details or ["<p>Every expectation passed on every shard that ran; nothing quarantined by a gate.</p>"])

    return h


def _shard_charts(model: ReportModel, frags: list[dict[str, str]]) -> list[str]:
    by_shard = {row.shard: f for row, f in zip(model.shards, frags)}
    shard_charts = [by_shard[k]["charts"] for k in sorted(by_shard) if by_shard[k]["charts"]]
    return [charts.SHARD_SECTIONS_TITLE, *shard_charts] if shard_charts else []


def _other_section(frags: list[dict[str, str]]) -> list[str]:
    other = [f["other"] for f in frags if f["other"]]
    if not other:
        return []
    return [
        "<h2>Other rejects, quarantine and flagged rows</h2>",
        "<table><tr><th>shard</th><th>table</th><th>reason</th><th>rows</th></tr>",
        *other,
        "</table>",
    ]


def _snapshots_section(model: ReportModel) -> list[str]:
    """Each snapshot: whether it is LATEST, published, drifted; its shards included or excluded and why."""
    h: list[str] = []
    h.append("<h2>Snapshots</h2>")
    if not model.snapshots:
        h.append("<p>No training_dataset snapshot published yet.</p>")
    for s in model.snapshots:
        inc = [x for x in s.shards if x["included"]]
        exc = [x for x in s.shards if not x["included"]]
        marks = (" (LATEST)" if s.latest else "") + ("" if s.published else " — held back, not published")
        if s.unpublished:
            marks += " — NOT published: LATEST was never switched to it (a publish stopped or killed before that; a rerun publishes it)"
        if s.drift_status not in ("none", "ok"):
            marks += f" — drift {s.drift_status}"
        h.append(f"<h3>snapshot <code>{_e(s.version)}</code>{_e(marks)}</h3>")
        h.append(
            f'<div class="small">created {_e(s.created_at)}; {s.rows} rows; {len(inc)} shard(s) included, '
            f"{len(exc)} excluded</div>"
        )
        h.append("<table><tr><th>shard</th><th>included</th><th>reason</th><th>rows</th></tr>")
        for x in s.shards:
            st = _badge("PASS", "included") if x["included"] else _badge("FAIL", "excluded")
            h.append(
                f"<tr><td>{_e(x['shard'])}</td><td>{st}</td><td>{_e(x['reason'])}</td>"
                f'<td class="num">{x["rows"]}</td></tr>'
            )
        h.append("</table>")
    return h
