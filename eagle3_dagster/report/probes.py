"""The quality report's drafter section: each drafter version's acceptance on the probe sets, over time,
and the nightly acceptance entries with their drafter changes (docs/probes.md).

    collect_probes(data) -> dict | None   (None: no probe result and no acceptance entry yet)
    probes_section(view) -> list[str]     (HTML lines; [] for None)

Read from <data>/probes/results/ (generate/probe_results.py) and <data>/probes/acceptance/
(quality/acceptance_drift.py).
"""

from __future__ import annotations

import html
from typing import Any

import polars as pl

from ..drafters.versions import consecutive_intervals
from ..generate.drafter import redact_draft_path
from ..generate.group_acceptance import SUM_COLUMNS, with_ratios
from ..generate.probe_results import drafter_versions, drafter_versions_by_source, read_all_results
from ..quality.acceptance_drift import conform_log
from ..storage import DataPath, read_parquet
from . import svg


def _acceptance_nights(data: DataPath) -> pl.DataFrame:
    """Every shard's entries, one row per run: the shards' sums added, the ratios of the sums
    (generate/group_acceptance.py), the rows left out for flagged figures."""
    folder = data / "probes" / "acceptance"
    files = folder.glob("shard=*.parquet") if folder.is_dir() else []
    if not files:
        return pl.DataFrame()
    log = pl.concat([conform_log(read_parquet(f)) for f in files])
    log = log.filter((pl.col("new_rows") > 0) | (pl.col("left_out_rows").fill_null(0) > 0))
    if log.height == 0:
        return pl.DataFrame()
    sums = log.group_by("run_key", "drafter_key").agg(
        pl.col("run_at").min(),
        pl.col("new_rows").sum(),
        pl.col("left_out_rows").fill_null(0).sum(),
        *(pl.col(c).sum() for c in SUM_COLUMNS),
    )
    return with_ratios(sums).sort("run_at")


def collect_probes(data: DataPath) -> dict[str, Any] | None:
    results = read_all_results(data)
    nights = _acceptance_nights(data)
    if results.height == 0 and nights.height == 0:
        return None
    versions = drafter_versions(results)
    sources = sorted(set(results["source"].drop_nulls().to_list()))
    return {
        "versions": versions.to_dicts(),
        "by_source": drafter_versions_by_source(results).to_dicts(),
        "nights": nights.to_dicts(),
        # each version against the one before it, on the prompts both measured (drafters/versions.py)
        "intervals": consecutive_intervals(data, versions["drafter_id"].to_list(), sources)
        if versions.height > 1
        else {},
    }


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _f(v: Any, fmt: str = ".3f") -> str:
    return "" if v is None else format(float(v), fmt)


def _left_out_note(rows: list[dict[str, Any]], key: str) -> list[str]:
    """A line naming the rows left out of the figures above (their figures failed their checks)."""
    n = sum(int(r.get(key) or 0) for r in rows)
    if not n:
        return []
    return [
        f'<p class="warnbox">{n} row(s) left out of these figures: their speculative-decoding figures failed '
        "their checks (<code>spec_metrics_inconsistent:&lt;which&gt;</code> in the generations table).</p>"
    ]


def _interval_cell(iv: dict[str, Any] | None) -> str:
    """The difference with the previous version and its interval (accept length, token-weighted)."""
    if not iv:
        return ""
    lo, hi = iv["interval"]
    span = f" [{lo:+.3f}, {hi:+.3f}]" if lo == lo and hi == hi else " (no interval)"  # nan: one shared prompt
    return f"{iv['difference']:+.3f}{span} {iv['verdict'].replace('_', ' ')}, {iv['prompts']} shared prompts"


def _versions_table(versions: list[dict[str, Any]], intervals: dict[str, dict[str, Any]]) -> list[str]:
    h = [
        "<table><tr><th>drafter_id</th><th>draft model</th><th>first seen</th><th>last seen</th>"
        "<th>probe prompts</th><th>accept length</th><th>accept rate</th><th>left out (flagged)</th>"
        "<th>vs previous version</th><th>accept length vs previous: difference [95% interval]</th></tr>"
    ]
    prev = None
    for v in versions:
        delta = ""
        if prev is not None and prev["accept_length"] and v["accept_length"] is not None:
            delta = f"{v['accept_length'] / prev['accept_length'] - 1:+.1%} accept length"
        # a path stored before drafter paths were redacted where they are read (generate/drafter.py) is redacted here
        model = f"{redact_draft_path(v['draft_model_path']) or '?'}@{v['draft_model_revision'] or 'default'}"
        h.append(
            f"<tr><td><code>{_e(v['drafter_id'])}</code></td><td>{_e(model)}</td>"
            f"<td>{_e(v['first_seen'])}</td><td>{_e(v['last_seen'])}</td>"
            f'<td class="num">{v["n_probe_prompts"]}</td><td class="num">{_f(v["accept_length"])}</td>'
            f'<td class="num">{_f(v["accept_rate"])}</td><td class="num">{v["left_out"] or 0}</td>'
            f"<td>{_e(delta)}</td><td>{_e(_interval_cell(intervals.get(v['drafter_id'])))}</td></tr>"
        )
        prev = v
    h.append("</table>")
    return h


def _nights_table(nights: list[dict[str, Any]]) -> list[str]:
    h = [
        "<h3>Tonight's new prompts, night by night</h3>",
        "<table><tr><th>run</th><th>drafter</th><th>new rows</th><th>accept length</th>"
        "<th>accept rate</th><th>left out (flagged)</th><th></th></tr>",
    ]
    prev = None
    for n in nights:
        note = f"drafter changed from {prev}" if prev is not None and prev != n["drafter_key"] else ""
        h.append(
            f"<tr><td>{_e(n['run_at'])}</td><td><code>{_e(n['drafter_key'])}</code></td>"
            f'<td class="num">{n["new_rows"]}</td><td class="num">{_f(n["accept_length"])}</td>'
            f'<td class="num">{_f(n["accept_rate"])}</td><td class="num">{n["left_out_rows"]}</td>'
            f"<td>{_e(note)}</td></tr>"
        )
        prev = n["drafter_key"]
    h.append("</table>")
    return h


def probes_section(view: dict[str, Any] | None) -> list[str]:
    if view is None:
        return []
    h = ["<h2>Drafter versions on the probe sets</h2>"]
    versions = view.get("versions") or []
    if versions:
        h.append(
            "<p>Each drafter the fleet ran, measured on the same probe prompts (<code>role: probe</code> sources), "
            "oldest first: a newly trained drafter is compared with the one before on identical prompts. Accept "
            "length = Σ tokens / Σ verify steps, accept rate = Σ accepted / Σ proposed drafts over its probe rows, "
            "as in every other acceptance table.</p>"
        )
        h.extend(_left_out_note(versions, "left_out"))
        h.append(
            svg.bars(
                "accept length per drafter version (probe sets, Σ tokens / Σ verify steps)",
                [str(v["drafter_id"]) for v in versions],
                [float(v["accept_length"] or 0.0) for v in versions],
                svg.Axes(x_label="drafter (first seen, oldest first)", y_label="tokens per verify step"),
            )
        )
        h.extend(_versions_table(versions, view.get("intervals") or {}))
        h.append(
            '<p class="small">The interval: each version against the one before it on the probe prompts both '
            "measured, accept length as the sum of completion tokens over the sum of verify steps, paired bootstrap "
            "over prompts (docs/drafter-compare.md).</p>"
        )
        by_source = view.get("by_source") or []
        h.append(
            "<table><tr><th>drafter_id</th><th>probe source</th><th>prompts</th><th>accept length</th>"
            "<th>accept rate</th><th>left out (flagged)</th></tr>"
        )
        h.extend(
            f"<tr><td><code>{_e(s['drafter_id'])}</code></td><td><code>{_e(s['source'])}</code></td>"
            f'<td class="num">{s["n_probe_prompts"]}</td><td class="num">{_f(s["accept_length"])}</td>'
            f'<td class="num">{_f(s["accept_rate"])}</td><td class="num">{s["left_out"] or 0}</td></tr>'
            for s in by_source
        )
        h.append("</table>")
    else:
        h.append("<p>No probe results yet (no <code>role: probe</code> source generated on a speculating fleet).</p>")
    if view.get("nights"):
        h.extend(_nights_table(view["nights"]))
        h.extend(_left_out_note(view["nights"], "left_out_rows"))
    return h
