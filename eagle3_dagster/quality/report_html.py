"""An offline, self-contained HTML quality report: shards x gates, failures, quarantine, snapshots.

GX's Data Docs index loads its table scripts from public CDNs, so on an air-gapped machine it shows
no rows. This report needs nothing from the network: one HTML file, inline CSS, no scripts, no
fonts, no images. It is built only from what is stored (data/gates/<gate>/shard=NNNN.json, the
rejects / quarantine Parquet beside the tables, data/snapshots/*/manifest.json), so it does not
matter which shard run writes it last, and `eagle3 report` rebuilds the same page on demand.

    collect(data_dir, work_dir)  -> ReportModel   (reads storage)
    render(model, report_path)   -> str           (pure)
    write_report(...)            -> Path          (lock, collect, render, atomic tmp + rename)

Every string that comes from data (expectation names, reasons, versions, paths) is HTML-escaped.
Links to GX Data Docs validation pages are relative when the report sits inside the work dir
(`<work_dir>/reports/index.html`, next to `gx/`), file:// URIs otherwise, and left out when the
page no longer exists (pruned by EAGLE3_GX_KEEP_VALIDATIONS).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import html
import json
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl

from ..storage import DataPath, PathLike, as_data_path, display_uri, parse_shard_key, read_parquet, shard_key
from ..train.summary import SUMMARY_FILE
from . import charts
from .gate import read_gate_result
from .retention import DOCS_INDEX
from .suites import GATES
from .turns_report import collect_turns, turns_section

REPORT_DIR = "reports"
REPORT_FILE = "index.html"
GATE_ASSET = {"prompts": "tokenized_prompts", "generations": "generations", "training_samples": "training_samples"}
_DOCS_MARK = "/gx/uncommitted/data_docs/local_site/"


def default_report_path(work_dir: PathLike) -> Path:
    """<work_dir>/reports/index.html: beside the GX context (`<work_dir>/gx/`), always local."""
    return Path(os.fspath(work_dir)) / REPORT_DIR / REPORT_FILE


# --------------------------------------------------------------------------------------------- model


@dataclass
class ExpectationIssue:
    name: str
    key: str
    severity: str
    success: bool
    mostly: float
    pass_rate: float
    unexpected_count: int
    evaluated: int
    level: str
    observed_value: Any = None

    @property
    def unexpected_percent(self) -> float | None:
        return 100.0 * self.unexpected_count / self.evaluated if self.evaluated else None


@dataclass
class GateCell:
    gate: str
    shard: str
    status: str  # "PASS" | "FAIL" | "not run" | "unreadable"
    created_at: str = ""
    n_rows: int = 0
    n_quarantined: int = 0
    issues: list[ExpectationIssue] = field(default_factory=list)  # failed expectations (critical and warning)
    reasons: dict[str, int] = field(default_factory=dict)  # quarantined rows per reason
    docs_page: Path | None = None  # the validation's Data Docs page, only if it exists
    profile: str | None = None
    error: str = ""
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [rows, quarantined]

    @property
    def asset(self) -> str:
        return GATE_ASSET.get(self.gate, self.gate)

    @property
    def anchor(self) -> str:
        return f"s{self.shard}-{self.gate}"


@dataclass
class ShardRow:
    shard: str
    cells: dict[str, GateCell]
    other_rejects: dict[str, dict[str, int]] = field(default_factory=dict)  # table label -> reason -> rows


@dataclass
class SnapshotView:
    version: str
    created_at: str
    rows: int
    latest: bool
    shards: list[dict[str, Any]]  # {shard, included, reason, rows}
    published: bool = True
    drift_status: str = "none"
    summary: dict[str, Any] | None = None


@dataclass
class LatestAge:
    """How old the published LATEST snapshot is: the nightly freshness signal, readable offline."""

    version: str
    published_at: dt.datetime  # when LATEST was last written (the last successful publish)
    created_at: str  # when this snapshot's content was first built (an unchanged night republishes it)
    age_s: float
    max_age_s: float  # EAGLE3_SNAPSHOT_MAX_AGE

    @property
    def stale(self) -> bool:
        return self.age_s > self.max_age_s

    def describe(self) -> str:
        state = (
            f"OLDER than the allowed {_duration(self.max_age_s)} (EAGLE3_SNAPSHOT_MAX_AGE): the nightly did not publish"
            if self.stale
            else f"within the allowed {_duration(self.max_age_s)}"
        )
        return (
            f"LATEST is {self.version}, published {_duration(self.age_s)} ago "
            f"({self.published_at.isoformat(timespec='seconds')}), {state}; content first built {self.created_at}"
        )


def _duration(seconds: float) -> str:
    s = int(max(0, seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m}m"
    return f"{m}m {s}s" if m else f"{s}s"


def latest_age(
    data_dir: PathLike, now: dt.datetime | None = None, max_age: dt.timedelta | None = None
) -> LatestAge | None:
    """The age of snapshots/LATEST (None when nothing was ever published).

    Published-at is the LATEST file's modification time (rewritten by every publish, also of an
    identical snapshot); when the store does not report one, the snapshot's manifest created_at.
    """
    from ..config import settings

    data = as_data_path(data_dir)
    f = data / "snapshots" / "LATEST"
    if not f.exists():
        return None
    version = f.read_text().strip()
    man_file = data / "snapshots" / version / "manifest.json"
    created = str(json.loads(man_file.read_text()).get("created_at", "")) if man_file.exists() else "unknown"
    mtime = f._info().mtime
    if mtime is not None:
        published = mtime if mtime.tzinfo else mtime.replace(tzinfo=dt.UTC)
    else:
        published = dt.datetime.fromisoformat(created) if created not in ("", "unknown") else dt.datetime.now(dt.UTC)
    now = now or dt.datetime.now(dt.UTC)
    limit = (max_age or settings().snapshot_max_age).total_seconds()
    return LatestAge(version, published, created, (now - published).total_seconds(), limit)


@dataclass
class SourceView:
    name: str
    read: int
    accepted: int
    rejected: int
    max_reject_rate: float
    rejects_by_reason: dict[str, int]

    @property
    def reject_rate(self) -> float:
        return self.rejected / self.read if self.read else 0.0

    @property
    def status(self) -> str:  # "PASS" | "WARN": no accepted prompt, or too many rejects
        return "WARN" if self.accepted == 0 or self.reject_rate > self.max_reject_rate else "PASS"


def collect_sources(data: DataPath) -> list[SourceView]:
    """Every source's counts.json (data/sources/<name>/), as last ingested."""
    out = []
    for f in sorted((data / "sources").glob("*/counts.json"), key=str):
        try:
            c = json.loads(f.read_text())
            out.append(
                SourceView(
                    str(c.get("source") or f.parent.name),
                    int(c["read"]),
                    int(c["accepted"]),
                    int(c["rejected"]),
                    float(c.get("max_reject_rate", 0.5)),
                    dict(c.get("rejects_by_reason") or {}),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


@dataclass
class ReportModel:
    generated_at: str
    data_dir: str  # display-safe (no credentials, no query)
    work_dir: Path
    profiles: list[str]
    gates: tuple[str, ...]
    shards: list[ShardRow]
    snapshots: list[SnapshotView]
    data_docs_index: Path | None = None
    shard_summaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # training_samples/shard=*/summary.json
    attempt: dict[str, Any] | None = None  # data/gates/publish/last.json: the latest publish attempt
    sources: list[SourceView] = field(default_factory=list)
    latest: LatestAge | None = None
    turns: dict[str, dict[str, Any]] = field(default_factory=dict)  # all_turns conversations per shard

    def counts(self) -> dict[str, int]:
        out = {"PASS": 0, "FAIL": 0, "not run": 0, "unreadable": 0}
        for row in self.shards:
            for c in row.cells.values():
                out[c.status] = out.get(c.status, 0) + 1
        return out


# --------------------------------------------------------------------------------------------- collect


def _gate_shards(data: DataPath, gates: Iterable[str]) -> set[int]:
    out: set[int] = set()
    for g in gates:
        for f in (data / "gates" / g).glob("shard=*.json"):
            try:
                out.add(parse_shard_key(f.name[len("shard=") : -len(".json")]))
            except (ValueError, TypeError):
                continue
    return out


def _existing_page(stored: str | None, work_dir: Path) -> Path | None:
    """The stored page if it still exists; else the same page under this work dir's GX context
    (a work dir that was moved); else None (pruned)."""
    if not stored:
        return None
    p = Path(stored)
    if p.is_file():
        return p
    s = stored.replace(os.sep, "/")
    if _DOCS_MARK in s:
        alt = work_dir / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site" / s.split(_DOCS_MARK, 1)[1]
        if alt.is_file():
            return alt
    return None


def _issue(o: dict[str, Any]) -> ExpectationIssue:
    return ExpectationIssue(
        name=str(o.get("name", "")),
        key=str(o.get("key", "")),
        severity=str(o.get("severity", "")),
        success=bool(o.get("success")),
        mostly=float(o.get("mostly", 1.0)),
        pass_rate=float(o.get("pass_rate", 0.0)),
        unexpected_count=int(o.get("unexpected_count") or 0),
        evaluated=int(o.get("evaluated") or 0),
        level=str(o.get("level", "row")),
        observed_value=o.get("observed_value"),
    )


def collect_cell(data: DataPath, gate: str, shard: int, work_dir: Path) -> GateCell:
    key = shard_key(shard)
    path = data / "gates" / gate / f"shard={key}.json"
    if not path.exists():
        return GateCell(gate, key, "not run")
    try:
        d = json.loads(path.read_text())
        reasons = d.get("row_failures_by_reason")
        if reasons is None and int(d.get("n_row_failures") or 0):
            # written before the counts were stored in the JSON: count from the rejects Parquet
            res = read_gate_result(data, gate, shard)
            reasons = res.reason_counts() if res is not None else {}
        return GateCell(
            gate,
            key,
            "PASS" if d.get("success") else "FAIL",
            created_at=str(d.get("created_at") or ""),
            n_rows=int(d.get("n_rows") or 0),
            n_quarantined=int(d.get("n_row_failures") or 0),
            issues=[_issue(o) for o in d.get("outcomes", []) if not o.get("success")],
            reasons={str(k): int(v) for k, v in (reasons or {}).items()},
            docs_page=_existing_page(d.get("data_docs_page"), work_dir),
            profile=d.get("profile"),
            by_source={str(k): [int(x) for x in v] for k, v in (d.get("by_source") or {}).items()},
        )
    except Exception as e:  # one bad file must not hide every other shard
        return GateCell(gate, key, "unreadable", error=f"{type(e).__name__}: {e}")


def _reason_counts(f: DataPath, column: str) -> dict[str, int]:
    if not f.exists():
        return {}
    try:
        df = read_parquet(f, columns=[column])
    except Exception:  # auxiliary counts only
        return {}
    if not df.height:
        return {}
    col = pl.col(column)
    if isinstance(df.schema[column], pl.List):  # a list of reasons per row: count each
        col = col.explode()
    vc = df.select(col.cast(pl.String).fill_null("(none)").alias("r")).group_by("r").len()
    return dict(sorted(((str(r), int(n)) for r, n in vc.iter_rows()), key=lambda kv: (-kv[1], kv[0])))


def _not_text_exact(f: DataPath) -> dict[str, int]:
    """Kept training rows whose text re-encodes to other ids (non-canonical tokenization), if any."""
    if not f.exists():
        return {}
    try:
        df = read_parquet(f, columns=["text_exact"])
    except Exception:
        return {}
    n = int((df["text_exact"] == False).sum() or 0)  # noqa: E712
    return {"non_canonical_tokenization (kept; flagged/left out in text exports)": n} if n else {}


def collect_snapshots(data: DataPath) -> list[SnapshotView]:
    root = data / "snapshots"
    if not root.exists():
        return []
    latest_file = root / "LATEST"
    latest = latest_file.read_text().strip() if latest_file.exists() else ""
    out: list[SnapshotView] = []
    for m in root.glob("*/manifest.json"):
        if m.parent.name.startswith("."):
            continue
        try:
            man = json.loads(m.read_text())
        except ValueError:
            continue
        shards = [
            {
                "shard": str(s.get("shard", "")),
                "included": bool(s.get("included")),
                "reason": str(s.get("reason", "")),
                "rows": int(s.get("rows") or 0),
            }
            for s in man.get("shards", [])
        ]
        out.append(
            SnapshotView(
                version=str(man.get("version", m.parent.name)),
                created_at=str(man.get("created_at", "")),
                rows=int(man.get("rows") or 0),
                latest=m.parent.name == latest,
                shards=shards,
                published=man.get("published", True) is not False,
                drift_status=str((man.get("drift") or {}).get("status", "none")),
                summary=man.get("summary"),
            )
        )
    return sorted(out, key=lambda s: (s.created_at, s.version), reverse=True)


def collect(
    data_dir: PathLike,
    work_dir: PathLike,
    *,
    n_shards: int | None = None,
    shards: Sequence[int] | None = None,
    profile: str | None = None,
    gates: Sequence[str] = GATES,
    now: dt.datetime | None = None,
) -> ReportModel:
    """Read the stored gate results, rejects and snapshot manifests into a ReportModel.

    Shards listed: `shards` if given, else 0..n_shards-1 plus every shard with a stored gate result.
    """
    data = as_data_path(data_dir)
    work = Path(os.fspath(work_dir)).expanduser().absolute()
    ids = sorted(set(shards) if shards is not None else set(range(n_shards or 0)) | _gate_shards(data, gates))
    rows: list[ShardRow] = []
    for k in ids:
        cells = {g: collect_cell(data, g, k, work) for g in gates}
        other = {
            "tokenize rejects (tokenized_prompts)": _reason_counts(
                data / "tokenized_prompts" / f"shard={shard_key(k)}" / "rejects.parquet", "reason"
            ),
            "parse quarantine (training_samples)": _reason_counts(
                data / "training_samples" / f"shard={shard_key(k)}" / "quarantine.parquet", "reasons"
            ),
            "not text-exact (training_samples)": _not_text_exact(
                data / "training_samples" / f"shard={shard_key(k)}" / "part-0000.parquet"
            ),
        }
        rows.append(ShardRow(shard_key(k), cells, {lab: c for lab, c in other.items() if c}))
    seen = sorted({c.profile for r in rows for c in r.cells.values() if c.profile})
    profiles = [profile] + [p for p in seen if p != profile] if profile else seen
    index = work / "gx" / "gx" / DOCS_INDEX
    summaries = {}
    for k in ids:
        f = data / "training_samples" / f"shard={shard_key(k)}" / SUMMARY_FILE
        try:
            if f.exists():
                summaries[shard_key(k)] = json.loads(f.read_text())
        except ValueError:
            continue
    attempt = None
    try:
        af = data / "gates" / "publish" / "last.json"
        attempt = json.loads(af.read_text()) if af.exists() else None
    except ValueError:
        attempt = None
    return ReportModel(
        shard_summaries=summaries,
        attempt=attempt,
        generated_at=(now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"),
        data_dir=display_uri(str(data)),
        work_dir=work,
        profiles=profiles,
        gates=tuple(gates),
        shards=rows,
        snapshots=collect_snapshots(data),
        data_docs_index=index if index.is_file() else None,
        sources=collect_sources(data),
        latest=latest_age(data, now),
        turns=collect_turns(data, ids),
    )


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
.notrun{background:#eee;color:#555} .unreadable{background:#fde9c8;color:#7a4b00} .WARN{background:#fff1c2;color:#6b5200}
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
    parts = [_badge(c.status)]
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


def render(model: ReportModel, report_path: PathLike) -> str:
    """The report as one HTML document (no scripts, no external resources)."""
    rp = Path(os.fspath(report_path))
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
        + (f", {counts['unreadable']} unreadable" if counts.get("unreadable") else "")
        + "</td></tr>",
        "<tr><td>LATEST snapshot</td><td>"
        + (
            (_badge("FAIL", "stale") if model.latest.stale else _badge("PASS", "fresh"))
            + " "
            + _e(model.latest.describe())
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
    h.extend(charts.top_section(model))

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
                f'<tr><td><code>{_e(src.name)}</code></td><td class="num">{src.read}</td>'
                f'<td class="num">{src.accepted}</td><td class="num">{src.rejected}</td>'
                f'<td class="num">{_pct(src.reject_rate)}</td><td class="num">{_pct(src.max_reject_rate)}</td>'
                f"<td>{_badge(src.status, why)}</td><td>{_e(reasons)}</td></tr>"
            )
        h.append("</table>")

    h.append("<h2>Gates by shard</h2>")
    h.append(
        "<table><tr><th>shard</th>"
        + "".join(
            f'<th><code>{_e(g)}</code><div class="small">on {_e(GATE_ASSET.get(g, g))}</div></th>' for g in model.gates
        )
        + "</tr>"
    )
    for row in model.shards:
        cells, failed = [], None
        for g in model.gates:  # gates in pipeline order: a failed gate blocks the later stages
            cells.append(_cell_html(row.cells[g], rp, work, blocked_by=failed))
            if row.cells[g].status == "FAIL" and failed is None:
                failed = g
        h.append(f'<tr><th id="shard-{_e(row.shard)}">{_e(row.shard)}</th>' + "".join(cells) + "</tr>")
    h.append("</table>")
    if not model.shards:
        h.append("<p>No shards and no stored gate results yet.</p>")

    details = [d for row in model.shards for d in _details_html(row)]
    h.append("<h2>Failed and warned expectations, quarantine by reason</h2>")
    h.extend(details or ["<p>Every expectation passed on every shard that ran; nothing quarantined by a gate.</p>"])

    h.extend(charts.source_gate_section(model))
    h.extend(charts.shard_sections(model))

    h.extend(turns_section(model.turns))

    other = [(row.shard, lab, c) for row in model.shards for lab, c in row.other_rejects.items()]
    if other:
        h.append("<h2>Other rejects, quarantine and flagged rows</h2>")
        h.append("<table><tr><th>shard</th><th>table</th><th>reason</th><th>rows</th></tr>")
        for shard, lab, c in other:
            for r, n in c.items():
                h.append(f'<tr><td>{_e(shard)}</td><td>{_e(lab)}</td><td>{_e(r)}</td><td class="num">{n}</td></tr>')
        h.append("</table>")

    h.append("<h2>Snapshots</h2>")
    if not model.snapshots:
        h.append("<p>No training_dataset snapshot published yet.</p>")
    for s in model.snapshots:
        inc = [x for x in s.shards if x["included"]]
        exc = [x for x in s.shards if not x["included"]]
        marks = (" (LATEST)" if s.latest else "") + ("" if s.published else " — held back, not published")
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
    h.append(
        '<p class="small">Written by eagle3-dagster from data/gates/&lt;gate&gt;/shard=NNNN.json, the '
        "rejects/quarantine Parquet files and data/snapshots/*/manifest.json; regenerate with "
        "<code>eagle3 report</code>.</p>"
    )
    h.append("</body></html>")
    return "\n".join(h) + "\n"


# --------------------------------------------------------------------------------------------- write


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_report(
    data_dir: PathLike,
    work_dir: PathLike,
    *,
    out: PathLike | None = None,
    n_shards: int | None = None,
    profile: str | None = None,
    now: dt.datetime | None = None,
) -> Path:
    """Collect, render and write the report (default <work_dir>/reports/index.html); returns its path.

    Concurrent writers (shard runs in parallel) take turns on a lock beside the report, and each
    collects after taking it, so the last writer always sees every stored result; readers only ever
    see a complete file (temp name + rename).
    """
    work = Path(os.fspath(work_dir)).expanduser().absolute()
    path = Path(os.fspath(out)).expanduser().absolute() if out is not None else default_report_path(work)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            model = collect(data_dir, work, n_shards=n_shards, profile=profile, now=now)
            _atomic_write(path, render(model, path))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path
