"""The quality report's model: what is stored, read into dataclasses (no HTML here).

collect(data_dir, work_dir)          -> ReportModel   (reads every shard's stored results)
collect_row(data, shard, gates, work) -> ShardRow     (one shard: its gate cells and rejects)
assemble(...)                         -> ReportModel   (rows + the run-wide parts: snapshots,
                                                        sources, LATEST age, publish attempt)
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..config import ShardSettings
from ..publish.snapshot import unpublished_versions
from ..quality.acceptance import collect_acceptance
from ..quality.gate import read_gate_result
from ..quality.retention import DOCS_INDEX
from ..quality.suites import GATES
from ..storage import DataPath, PathLike, as_data_path, display_uri, parse_shard_key, read_parquet, shard_key
from ..train.summary import SUMMARY_FILE
from .candidates import collect_candidates
from .decontamination import collect_decontamination
from .probes import collect_probes
from .turns import collect_turns

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
    status: str  # "PASS" | "FAIL" | "EMPTY" (passed on 0 rows: nothing judged) | "not run" | "unreadable"
    created_at: str = ""
    n_rows: int = 0
    n_quarantined: int = 0
    issues: list[ExpectationIssue] = field(default_factory=list)  # failed expectations (critical and warning)
    reasons: dict[str, int] = field(default_factory=dict)  # quarantined rows per reason
    docs_page: Path | None = None  # the validation's Data Docs page, only if it exists
    profile: str | None = None
    error: str = ""
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [rows, quarantined]
    docs_page_stored: str | None = None  # the page as the gate result names it (docs_page: if it exists)

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
    # complete, not held back, but LATEST was never switched to it (a publish stopped or killed before that)
    unpublished: bool = False
    summary: dict[str, Any] | None = None


@dataclass
class LatestAge:
    """How old the published LATEST snapshot is: the nightly freshness signal, readable offline."""

    version: str
    published_at: dt.datetime  # when LATEST was last written (the last successful publish)
    created_at: str  # when this snapshot's content was first built (an unchanged night republishes it)
    age_s: float
    max_age_s: float  # EAGLE3_SNAPSHOT_MAX_AGE
    # when this content became LATEST (manifest published_at); earlier than published_at when later
    # publishes found the same content (they rewrite LATEST: the freshness signal, not a new publish)
    first_published_at: dt.datetime | None = None

    @property
    def stale(self) -> bool:
        return self.age_s > self.max_age_s

    @property
    def unchanged_since(self) -> dt.datetime | None:
        """The first publish of this content, when a later publish found the same content."""
        first = self.first_published_at
        return first if first is not None and (self.published_at - first).total_seconds() >= 1 else None

    def describe(self, *, for_page: bool = False) -> str:
        """One line for the terminal (relative age: it is read now) or, `for_page`, for the static report,
        which is read later: the publish time in UTC, and the age only as of the report's build."""
        state = (
            f"OLDER than the allowed {_duration(self.max_age_s)} (EAGLE3_SNAPSHOT_MAX_AGE): the nightly did not publish"
            if self.stale
            else f"within the allowed {_duration(self.max_age_s)}"
        )
        since = self.unchanged_since
        if for_page:
            at = _utc(self.published_at)
            when = (
                f"unchanged since {_utc(since)} (published again at {at}, {_duration(self.age_s)} before this "
                "report was generated)"
                if since
                else f"published at {at} ({_duration(self.age_s)} before this report was generated)"
            )
        else:
            iso = self.published_at.isoformat(timespec="seconds")
            when = (
                f"unchanged since {since.isoformat(timespec='seconds')} (published again {_duration(self.age_s)} "
                f"ago, {iso})"
                if since
                else f"published {_duration(self.age_s)} ago ({iso})"
            )
        return f"LATEST is {self.version}, {when}, {state}; content first built {self.created_at}"


def _utc(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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


# EAGLE3_SNAPSHOT_MAX_AGE's declared default; the report asset and `eagle3 report` pass the configured value
DEFAULT_MAX_AGE = ShardSettings().snapshot_max_age


def latest_age(
    data_dir: PathLike, now: dt.datetime | None = None, max_age: dt.timedelta = DEFAULT_MAX_AGE
) -> LatestAge | None:
    """The age of snapshots/LATEST (None when nothing was ever published).

    Published-at is the LATEST file's modification time (rewritten by every publish, also of an
    identical snapshot); when the store does not report one, the snapshot's manifest created_at.
    """
    data = as_data_path(data_dir)
    f = data / "snapshots" / "LATEST"
    if not f.exists():
        return None
    version = f.read_text().strip()
    man_file = data / "snapshots" / version / "manifest.json"
    manifest = json.loads(man_file.read_text()) if man_file.exists() else {}
    created = str(manifest.get("created_at", "")) if man_file.exists() else "unknown"
    first = _aware(dt.datetime.fromisoformat(manifest["published_at"])) if manifest.get("published_at") else None
    mtime = f._info().mtime
    if mtime is not None:
        published = mtime if mtime.tzinfo else mtime.replace(tzinfo=dt.UTC)
    else:
        published = dt.datetime.fromisoformat(created) if created not in ("", "unknown") else dt.datetime.now(dt.UTC)
    now = now or dt.datetime.now(dt.UTC)
    limit = max_age.total_seconds()
    return LatestAge(version, published, created, (now - published).total_seconds(), limit, first)


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


@dataclass
class SourceView:
    name: str
    read: int
    accepted: int
    rejected: int
    max_reject_rate: float
    rejects_by_reason: dict[str, int]
    role: str = "train"  # or eval: a decontamination reference (decontamination.py); or probe

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
                    str(c.get("role") or "train"),
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
    acceptance: dict[str, dict[str, Any]] = field(default_factory=dict)  # the drafter's figures per shard
    decontamination: dict[str, Any] | None = None  # data/prompts/decontamination.json (decontamination.py)
    probes: dict[str, Any] | None = None  # drafter versions on the probe sets, nightly acceptance (probes.py)
    candidates: list[dict[str, Any]] = field(default_factory=list)  # candidate drafter comparisons (candidates.py)
    plan: dict[str, Any] | None = None  # plan vs actual (eagle3_dagster/plan/actual.py), when a plan exists

    def counts(self) -> dict[str, int]:
        out = {"PASS": 0, "FAIL": 0, "EMPTY": 0, "not run": 0, "unreadable": 0}
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


def existing_page(stored: str | None, work_dir: Path) -> Path | None:
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
            ("EMPTY" if not int(d.get("n_rows") or 0) else "PASS") if d.get("success") else "FAIL",
            created_at=str(d.get("created_at") or ""),
            n_rows=int(d.get("n_rows") or 0),
            n_quarantined=int(d.get("n_row_failures") or 0),
            issues=[_issue(o) for o in d.get("outcomes", []) if not o.get("success")],
            reasons={str(k): int(v) for k, v in (reasons or {}).items()},
            docs_page=existing_page(d.get("data_docs_page"), work_dir),
            docs_page_stored=d.get("data_docs_page"),
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


def _request_failures(f: DataPath, examples: int = 3) -> dict[str, int]:
    """A shard's failed generation requests (errors.parquet: permanent and retryable): "reason (e.g. prompt ids)"
    -> count."""
    from ..generate.report import failures_section

    if not f.exists():
        return {}
    try:
        df = read_parquet(f, columns=["reason", "prompt_id", "detail"])
    except Exception:  # auxiliary counts only
        return {}
    return {
        f"{r} (e.g. {', '.join(str(p) for p in v['prompt_ids'])}; last: {v['last_detail'][:120]})": int(v["count"])
        for r, v in failures_section(df.iter_rows(named=True), examples=examples).items()
    }


def _previous_failures(gen_dir: DataPath) -> dict[str, int]:
    """The latest run's outcome for the requests an earlier run lost (retried.json): came back or not."""
    from ..generate.retried import read_retried

    out: dict[str, int] = {}
    for reason, c in (read_retried(gen_dir).get("by_reason") or {}).items():
        for key, label in (("came_back", "came back"), ("failed_again", "failed again"), ("not_sent", "not sent")):
            if c.get(key):
                out[f"{label} (failed before: {reason})"] = int(c[key])
    return out


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
    never = unpublished_versions(root)
    for v in out:
        v.unpublished = v.version in never
    return sorted(out, key=lambda s: (s.created_at, s.version), reverse=True)


def collect_row(data: DataPath, k: int, gates: Sequence[str], work: Path) -> ShardRow:
    """One shard's row: a cell per gate and the other rejects / quarantine / flagged counts."""
    cells = {g: collect_cell(data, g, k, work) for g in gates}
    other = {
        "failed requests (generations)": _request_failures(
            data / "generations" / f"shard={shard_key(k)}" / "errors.parquet"
        ),
        "earlier failures sent again (generations)": _previous_failures(data / "generations" / f"shard={shard_key(k)}"),
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
    return ShardRow(shard_key(k), cells, {lab: c for lab, c in other.items() if c})


def collect_summary(data: DataPath, k: int) -> dict[str, Any] | None:
    """training_samples/shard=NNNN/summary.json (the per-shard charts), if there is a readable one."""
    f = data / "training_samples" / f"shard={shard_key(k)}" / SUMMARY_FILE
    try:
        return json.loads(f.read_text()) if f.exists() else None
    except ValueError:
        return None


def shard_ids(data: DataPath, gates: Sequence[str], n_shards: int | None, shards: Sequence[int] | None) -> list[int]:
    """`shards` if given, else 0..n_shards-1 plus every shard with a stored gate result."""
    return sorted(set(shards) if shards is not None else set(range(n_shards or 0)) | _gate_shards(data, gates))


@dataclass(frozen=True)
class ReportView:
    """How a report reads the store: the run's profile (listed first; None: the profiles the rows name), the
    gates it shows, its clock (None: now) and how old LATEST may be before it is called stale."""

    profile: str | None = None
    gates: Sequence[str] = GATES
    now: dt.datetime | None = None
    max_age: dt.timedelta = DEFAULT_MAX_AGE


def assemble(
    data: DataPath, work: Path, rows: list[ShardRow], summaries: dict[str, dict[str, Any]], view: ReportView
) -> ReportModel:
    """The model from shard rows (sorted by shard) plus the run-wide parts (and the rows' multi-turn
    summaries), read now."""
    profile, gates, now = view.profile, view.gates, view.now
    seen = sorted({c.profile for r in rows for c in r.cells.values() if c.profile})
    profiles = [profile] + [p for p in seen if p != profile] if profile else seen
    index = work / "gx" / "gx" / DOCS_INDEX
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
        latest=latest_age(data, now, view.max_age),
        turns=collect_turns(data, [parse_shard_key(r.shard) for r in rows]),
        acceptance=collect_acceptance(data, [parse_shard_key(r.shard) for r in rows]),
        decontamination=collect_decontamination(data),
        probes=collect_probes(data),
        candidates=collect_candidates(data),
        plan=_plan_view(data),
    )


def _plan_view(data: DataPath) -> dict[str, Any] | None:
    from ..plan.actual import plan_vs_actual
    from ..plan.build import read_plan

    return plan_vs_actual(data, read_plan(data))


def collect(
    data_dir: PathLike,
    work_dir: PathLike,
    *,
    n_shards: int | None = None,
    shards: Sequence[int] | None = None,
    view: ReportView = ReportView(),
) -> ReportModel:
    """Read the stored gate results, rejects and snapshot manifests into a ReportModel.

    Shards listed: `shards` if given, else 0..n_shards-1 plus every shard with a stored gate result.
    """
    data = as_data_path(data_dir)
    work = Path(os.fspath(work_dir)).expanduser().absolute()
    ids = shard_ids(data, view.gates, n_shards, shards)
    rows = [collect_row(data, k, view.gates, work) for k in ids]
    summaries = {shard_key(k): s for k in ids if (s := collect_summary(data, k)) is not None}
    return assemble(data, work, rows, summaries, view)
