"""The report's picture sections (HTML fragments around report/svg.py charts).

- top_section: the latest publish attempt (published / refused / held back, and why) and drift
  against the previous snapshot with before/after charts; then the distributions of the snapshot
  LATEST names (length histograms, finish reasons, rates, source mix).
- source_gate_section: per source x gate pass rates (rows not quarantined / rows), all shards.
- shard_sections: the same distribution charts per shard, in <details> (native HTML, no script).

Everything comes from stored JSON: data/gates/publish/last.json, snapshot manifests (`summary`,
`drift`), training_samples/shard=NNNN/summary.json and the gate results' `by_source`.
"""

from __future__ import annotations

import html
from typing import Any

from . import svg

LENGTH_TITLES = {
    "prompt_len": "prompt length",
    "output_len": "output length",
    "reasoning_len": "reasoning length (tokens before think-end)",
    "answer_len": "answer length (after think-end)",
}
RATES = (("think_end_rate", "think-end"), ("length_finish_rate", "length finish"), ("tool_call_rate", "tool call"))
GATE_LABEL = {"prompts": "prompts gate", "generations": "generations gate", "training_samples": "training_samples gate"}


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


# the rate charts: shares of samples, 0..100%
RATE_AXES = svg.Axes(
    x_label="share of samples", y_label="rate (%)", value_fmt=_pct, axis_fmt=lambda v: f"{100 * v:.0f}%", top=1.0
)


def distribution_charts(summary: dict[str, Any], label: str) -> list[str]:
    """Histograms of the four lengths, finish reasons, the three rates and the source mix."""
    out = ['<div class="charts">']
    hists = summary.get("histograms") or {}
    for col, title in LENGTH_TITLES.items():
        h = hists.get(col) or {}
        out.append(
            svg.histogram(
                f"{label}: {title}",
                h.get("edges") or [],
                h.get("counts") or [],
                x_label=f"{title.split(' (')[0]} (tokens)",
                y_label="samples",
            )
        )
    fr = summary.get("finish_reasons") or {}
    out.append(
        svg.bars(
            f"{label}: finish reasons (n={summary.get('rows', 0)})",
            list(fr),
            list(fr.values()),
            svg.Axes(x_label="finish_reason", y_label="samples"),
        )
    )
    rates = [(name, summary.get(key)) for key, name in RATES]
    out.append(
        svg.bars(
            f"{label}: rates (n={summary.get('rows', 0)})",
            [n for n, _ in rates],
            [float(v or 0.0) for _, v in rates],
            RATE_AXES,
        )
    )
    mix = summary.get("sources") or {}
    if mix:
        rows = summary.get("rows") or 1
        out.append(
            svg.hbars(
                f"{label}: source mix",
                [(s, n / rows, f"{n} rows") for s, n in mix.items()],
                x_label="share of samples",
                color=svg.COLORS[0],
            )
        )
    out.append("</div>")
    return out


def _before_after(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = ['<div class="charts">']
    for col in ("reasoning_len", "output_len", "answer_len"):
        b = (before.get("lengths") or {}).get(col) or {}
        a = (after.get("lengths") or {}).get(col) or {}
        qs = ("p25", "p50", "p75", "p95")
        out.append(
            svg.grouped_bars(
                f"{LENGTH_TITLES[col].split(' (')[0]}: before vs after",
                list(qs),
                {"before": [b.get(q) for q in qs], "after": [a.get(q) for q in qs]},
                svg.Axes(x_label="quantile", y_label="tokens"),
            )
        )
    out.append(
        svg.grouped_bars(
            "rates: before vs after",
            [n for _, n in RATES],
            {"before": [before.get(k) for k, _ in RATES], "after": [after.get(k) for k, _ in RATES]},
            RATE_AXES,
        )
    )
    out.append("</div>")
    return out


def _snapshot_summary(model: Any, version: str | None) -> dict[str, Any] | None:
    for s in model.snapshots:
        if s.version == version:
            return s.summary
    return None


def blocking_shards(model: Any) -> list[str]:
    """Each shard whose stored gate results keep a snapshot from being published now (the one publish rule,
    orchestration/sequence.py: every shard must pass), as "shard: why" (its first failed gate, or not run)."""
    out = []
    for row in model.shards:
        statuses = [(g, c.status) for g, c in row.cells.items()]
        failed = next((g for g, st in statuses if st not in ("PASS", "EMPTY")), None)
        if failed is not None:
            why = (
                "not run" if all(st == "not run" for _, st in statuses) else f"{failed} gate {row.cells[failed].status}"
            )
            out.append(f"{row.shard}: {why}")
    return out


def top_section(model: Any) -> list[str]:
    out = ['<h2 id="snapshot-status">Latest snapshot: publish and drift</h2>']
    blocking = blocking_shards(model)
    if blocking:  # what the stored gate results say now, whatever the last attempt was
        out.append(
            f'<div class="warnbox" id="not-publishable"><b>A snapshot is published only when every shard passed</b>: '
            f"now {len(blocking)} shard(s) did not ({_e('; '.join(blocking))}); nothing is published until they do, "
            "unless a partial snapshot is asked for (<code>--allow-partial</code>), which names them.</div>"
        )
    att = model.attempt
    latest = next((s for s in model.snapshots if s.latest), None)
    if att is None:
        out.append("<p>No publish attempt recorded yet.</p>")
    else:
        verdict = att.get("verdict") or {}
        if not att.get("published"):
            kind = "held back" if att.get("written") else "refused"
            out.append(
                f'<div class="alert"><b>Snapshot <code>{_e(att.get("version"))}</code> NOT published '
                f"({kind})</b> at {_e(att.get('at'))}: {_e('; '.join(verdict.get('reasons') or []))}. "
                f"LATEST stays <code>{_e(att.get('latest_before') or 'none')}</code>.</div>"
            )
        elif att.get("latest_before") == att.get("version") and att.get("published_at"):
            # a publish that found the content LATEST already names: it was published before, not now
            out.append(
                f'<div class="okbox">Snapshot <code>{_e(att.get("version"))}</code> unchanged since '
                f"{_e(att.get('published_at'))} ({_e(att.get('rows'))} rows; the publish at {_e(att.get('at'))} "
                "found the same content).</div>"
            )
        else:
            out.append(
                f'<div class="okbox">Snapshot <code>{_e(att.get("version"))}</code> published at '
                f"{_e(att.get('published_at') or att.get('at'))} ({_e(att.get('rows'))} rows).</div>"
            )
        drift = verdict.get("drift")
        if drift is None:
            before = att.get("latest_before")
            why = (
                "first snapshot: no earlier LATEST"
                if not before
                else f"same content as LATEST <code>{_e(before)}</code>"
                if before == att.get("version")
                else f"LATEST <code>{_e(before)}</code> has no summary to compare"
            )
            out.append(f"<p>Drift: nothing to compare with ({why}).</p>")
        elif drift.get("status") == "ok":
            out.append(f'<div class="okbox">No drift against snapshot <code>{_e(drift.get("against"))}</code>.</div>')
        else:
            box = "alert" if drift.get("status") == "failed" else "warnbox"
            items = "".join(f"<li>{_e(f)}</li>" for f in drift.get("failed") or [])
            out.append(
                f'<div class="{box}" id="drift"><b>DRIFT {_e(str(drift.get("status")).upper())}</b> against '
                f"snapshot <code>{_e(drift.get('against'))}</code> (policy <code>{_e(drift.get('policy'))}"
                f"</code>, expectations/drift.json):<ul>{items}</ul>"
                f"model revision before <code>{_e((drift.get('before') or {}).get('model_revision'))}</code>, "
                f"after <code>{_e((att.get('summary') or {}).get('model_revision'))}</code></div>"
            )
        before = _snapshot_summary(model, (drift or {}).get("against"))
        if drift is not None and before and att.get("summary"):
            out.append(
                f"<h3>Before (snapshot <code>{_e(drift.get('against'))}</code>) / after (snapshot "
                f"<code>{_e(att.get('version'))}</code>)</h3>"
            )
            out.extend(_before_after(before, att["summary"]))
    if latest is not None and latest.summary:
        out.append(f"<h3>Distributions of snapshot <code>{_e(latest.version)}</code> (LATEST, {latest.rows} rows)</h3>")
        out.extend(distribution_charts(latest.summary, "snapshot"))
    return out


def source_gate_section(model: Any) -> list[str]:
    totals: dict[str, dict[str, list[int]]] = {}
    for row in model.shards:
        for g, c in row.cells.items():
            for src, (n, q) in (c.by_source or {}).items():
                t = totals.setdefault(g, {}).setdefault(src, [0, 0])
                t[0] += n
                t[1] += q
    if not totals:
        return []
    out = [
        "<h2>Pass rates by source and gate</h2>",
        '<p class="small">Share of each source\'s rows that no critical expectation quarantined, over every '
        "shard with a stored gate result.</p>",
        '<div class="charts">',
    ]
    for g in model.gates:
        if g not in totals:
            continue
        rows = [(src, (n - q) / n if n else 1.0, f"{n - q}/{n} rows") for src, (n, q) in sorted(totals[g].items())]
        out.append(svg.hbars(f"{GATE_LABEL.get(g, g)}: pass rate by source", rows, x_label="rows passing (%)"))
    out.append("</div>")
    return out


SHARD_SECTIONS_TITLE = "<h2>Distributions by shard</h2>"


def shard_section(shard: str, summary: dict[str, Any]) -> list[str]:
    """One shard's distribution charts (a collapsed <details>)."""
    out = [
        f'<details id="dist-{_e(shard)}"><summary>shard {_e(shard)}: {summary.get("rows", 0)} training '
        "samples</summary>"
    ]
    out.extend(distribution_charts(summary, f"shard {shard}"))
    out.append("</details>")
    return out


def shard_sections(model: Any) -> list[str]:
    if not model.shard_summaries:
        return []
    out = [SHARD_SECTIONS_TITLE]
    for shard, summary in sorted(model.shard_summaries.items()):
        out.extend(shard_section(shard, summary))
    return out
