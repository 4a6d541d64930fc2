"""Snapshot-level gates: may this snapshot be published, and did the data drift since the last one?

Both are GX suites like the shard gates (expectations/publish.json, expectations/drift.json), run
on a one-row frame that describes the snapshot (publish) or compares its distribution summary with
the previous published snapshot's (drift). Thresholds and severities are data: edit the JSON, or
pass `config_overrides` for one run.

- publish: a critical failure (a shard left out of a snapshot no one asked to be partial, 0 rows, no
  shard included, fewer rows than a fraction of the previous snapshot, too many rows whose answer is
  that of several other prompts) means: not published, LATEST unchanged. `same_answer_share` is the
  share of the snapshot's rows whose output ids are exactly those of at least `min_prompts` different
  prompts (the expectation's meta, default 4), across shards: the shard gates quarantine such groups
  within a shard, this sees one answer spread over shards (a response cache keyed on the wrong field,
  in front of every shard).
- drift: warning expectations warn, critical ones fail; the suite's `meta.drifted_snapshot` says
  what happens to a drifted snapshot: "publish" (published, marked in its manifest) or "hold".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..quality.features import ROW_ID
from ..quality.gate import GateResult, run_gate
from ..quality.suites import SuiteError, load_suite
from ..train.summary import Summary, rates

DRIFT_POLICIES = ("publish", "hold")
RATIO_METRICS = ("reasoning_len", "output_len", "answer_len", "prompt_len")
RATE_METRICS = ("think_end_rate", "length_finish_rate", "tool_call_rate")


SAME_ANSWER_KEY = "same_answer_share"  # expectations/publish.json: its meta.min_prompts sizes a group
DEFAULT_MIN_PROMPTS = 4


def publish_frame(
    rows: int,
    shards_included: int,
    previous_rows: int | None,
    left_out_unasked: int = 0,
    same_answer_share: float | None = None,
) -> pl.DataFrame:
    """The publish gate's one row; `left_out_unasked`: shards left out of a snapshot no one asked to be partial."""
    frac = None if not previous_rows else rows / previous_rows
    return pl.DataFrame(
        {
            ROW_ID: ["snapshot"],
            "shards_left_out_unasked": [left_out_unasked],
            "rows": [rows],
            "shards_included": [shards_included],
            "rows_fraction_of_previous": [frac],
            "same_answer_share": [same_answer_share],
        },
        schema={
            ROW_ID: pl.String,
            "shards_left_out_unasked": pl.Int64,
            "rows": pl.Int64,
            "shards_included": pl.Int64,
            "rows_fraction_of_previous": pl.Float64,
            "same_answer_share": pl.Float64,
        },
    )


def same_answer_min_prompts(expectations_dir: Path) -> int | None:
    """How many different prompts sharing one answer make a group (the publish suite's `same_answer_share`
    meta.min_prompts); None when the suite has no such expectation (then the share is not computed)."""
    suite = load_suite("publish", Path(expectations_dir))
    spec = next((e for e in suite.expectations if e.key == SAME_ANSWER_KEY), None)
    if spec is None:
        return None
    k = spec.meta.get("min_prompts", DEFAULT_MIN_PROMPTS)
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise SuiteError(f"{suite.source_path}: {SAME_ANSWER_KEY} meta.min_prompts must be an integer >= 2, got {k!r}")
    return k


def same_answer_share(summary: Summary, min_prompts: int | None) -> float | None:
    """Share of the summary's rows whose answer is that of `min_prompts` or more different prompts (None: a
    summary without the figures, or no group size: not judged)."""
    groups = summary.get("same_answer_rows")
    rows = int(summary.get("rows") or 0)
    if min_prompts is None or groups is None or not rows:
        return None
    return sum(int(n) for k, n in groups.items() if int(k) >= min_prompts) / rows


def _same_answer_reason(name: str, summary: Summary, share: float | None, min_prompts: int | None) -> str:
    groups = {int(k): int(n) for k, n in (summary.get("same_answer_rows") or {}).items()}
    biggest = max(groups, default=0)
    return (
        f"{name}: {share or 0:.1%} of the {summary.get('rows')} rows have an answer shared by {min_prompts} or more "
        f"different prompts (the largest group: {biggest} prompts with one answer): one answer sent for many "
        "prompts, e.g. a response cache keyed on the wrong field"
    )


def _p50(summary: Summary, col: str) -> float | None:
    v = ((summary.get("lengths") or {}).get(col) or {}).get("p50")
    return None if v is None else float(v)


def drift_values(new: Summary, old: Summary) -> dict[str, Any]:
    """Before/after numbers of two distribution summaries: p50 ratios, rate changes, what changed."""
    out: dict[str, Any] = {}
    for c in RATIO_METRICS:
        a, b = _p50(old, c), _p50(new, c)
        out[f"{c}_p50_ratio"] = None if a in (None, 0.0) or b is None else round(b / a, 6)
    old_rates, new_rates = rates(old), rates(new)
    for r in RATE_METRICS:
        a, b = old_rates[r], new_rates[r]
        out[f"{r}_change"] = None if a is None or b is None else round(float(b) - float(a), 6)
    out["model_revision_changed"] = (new.get("model_revision") or "") != (old.get("model_revision") or "")
    out["sampling_hash_changed"] = (new.get("sampling_hash") or "") != (old.get("sampling_hash") or "")
    return out


def drift_frame(new: Summary, old: Summary) -> pl.DataFrame:
    vals = drift_values(new, old)
    schema = {ROW_ID: pl.String, **{k: (pl.Boolean if k.endswith("_changed") else pl.Float64) for k in vals}}
    return pl.DataFrame({ROW_ID: ["snapshot"], **{k: [v] for k, v in vals.items()}}, schema=schema)


@dataclass(frozen=True)
class PublishedSnapshot:
    """The snapshot LATEST names, as its manifest describes it: what a new one is compared with."""

    version: str | None
    rows: int | None = None
    summary: Summary | None = None  # None: an older snapshot without one (no drift to judge)

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> PublishedSnapshot:
        rows = manifest.get("rows")
        return cls(
            version=manifest.get("version"),
            rows=None if rows is None else int(rows),
            summary=manifest.get("summary") or None,
        )


@dataclass(frozen=True)
class SnapshotFacts:
    """What the publish and drift gates judge: the assembled snapshot beside the previous published one."""

    rows: int
    shards_included: int
    summary: Summary
    previous: PublishedSnapshot | None = None  # the snapshot LATEST names (None on the first night)
    excluded: dict[str, str] = field(default_factory=dict)  # shard -> why it was left out
    allow_partial: bool = False  # a partial snapshot was asked for: shards left out do not refuse it

    @property
    def previous_rows(self) -> int | None:
        return self.previous.rows if self.previous is not None else None


@dataclass(frozen=True)
class OutcomeVerdict:
    """One expectation of a snapshot gate, as the manifest keeps it."""

    key: str
    name: str
    severity: str
    success: bool
    column: str | None
    description: str


@dataclass(frozen=True)
class GateVerdict:
    """A snapshot gate's result: its expectations and the one row it judged (column -> value)."""

    success: bool
    suite_sha256: str
    created_at: str
    outcomes: tuple[OutcomeVerdict, ...]
    values: dict[str, Any]

    @classmethod
    def of(cls, res: GateResult, values: dict[str, Any]) -> GateVerdict:
        outcomes = tuple(
            OutcomeVerdict(o.key, o.name, o.severity, o.success, o.column, o.description) for o in res.outcomes
        )
        return cls(res.success, res.suite_sha256, res.created_at, outcomes, values)

    @property
    def failed_critical(self) -> bool:
        return any(not o.success and o.severity == "critical" for o in self.outcomes)

    def to_json(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "suite_sha256": self.suite_sha256,
            "created_at": self.created_at,
            "outcomes": [asdict(o) for o in self.outcomes],
            "values": self.values,
        }


@dataclass(frozen=True)
class DriftVerdict:
    """The drift gate's result against the previous published snapshot, and what its policy makes of it."""

    gate: GateVerdict
    status: str  # ok | warned | failed
    policy: str  # publish | hold (expectations/drift.json meta.drifted_snapshot)
    against: str | None  # the previous snapshot's version
    failed: tuple[str, ...]  # each failed expectation, with its value
    before: dict[str, Any]  # the previous summary's model_revision, sampling_hash, rows

    def to_json(self) -> dict[str, Any]:
        gate = self.gate.to_json()
        values = gate.pop("values")
        return {
            **gate,
            "status": self.status,
            "policy": self.policy,
            "against": self.against,
            "values": values,
            "failed": list(self.failed),
            "before": self.before,
        }


@dataclass(frozen=True)
class SnapshotVerdict:
    """What the snapshot gates decided; stored in the manifest and in data/gates/publish/last.json."""

    publish: bool
    reasons: list[str]  # why not published (empty when published)
    publish_gate: GateVerdict
    drift: DriftVerdict | None = None  # None: nothing to compare with

    @property
    def drift_status(self) -> str:
        return self.drift.status if self.drift is not None else "none"

    def to_json(self) -> dict[str, Any]:
        return {
            "publish": self.publish,
            "reasons": self.reasons,
            "publish_gate": self.publish_gate.to_json(),
            "drift": self.drift.to_json() if self.drift is not None else None,
        }


def _failed_text(res: GateResult, values: dict[str, Any]) -> list[str]:
    return [f"{o.name} ({o.column} = {values.get(o.column or '')!r})" for o in res.outcomes if not o.success]


def drift_policy(expectations_dir: Path) -> str:
    suite = load_suite("drift", Path(expectations_dir))
    policy = str(suite.meta.get("drifted_snapshot", "publish"))
    if policy not in DRIFT_POLICIES:
        raise SuiteError(f"{suite.source_path}: meta.drifted_snapshot must be one of {DRIFT_POLICIES}, got {policy!r}")
    return policy


def _publish_reasons(
    pres: GateResult, gate: GateVerdict, facts: SnapshotFacts, share: float | None, min_prompts: int | None
) -> list[str]:
    """Why the publish gate refused the snapshot: one line per failed critical expectation, in the user's words."""
    reasons = []
    pvals, excluded = gate.values, facts.excluded
    against = facts.previous.version if facts.previous is not None else None
    left_out = ", ".join(f"{k} ({v})" for k, v in excluded.items())
    prev_rows = facts.previous_rows
    for o in pres.failed_critical:
        if o.key == "every_shard_passed":
            reasons.append(
                f"{o.name}: shard(s) left out: {left_out}; a snapshot is published only when every shard "
                "passed (a partial one needs allow_partial: `--allow-partial`, or the publish job's config)"
            )
        elif o.key == "some_shard_included" and excluded:
            reasons.append(
                f"{o.name}: every shard was excluded ({', '.join(f'{k}: {v}' for k, v in excluded.items())})"
            )
        elif o.key == SAME_ANSWER_KEY:
            reasons.append(_same_answer_reason(o.name, facts.summary, share, min_prompts))
        elif o.key == "rows_vs_previous" and prev_rows:
            reasons.append(
                f"{o.name}: {pvals['rows']} rows vs {prev_rows} in snapshot {against} "
                f"({pvals['rows_fraction_of_previous']:.0%})"
            )
        else:
            reasons.append(f"{o.name} ({o.column} = {pvals.get(o.column or '')!r})")
    return reasons


def _drift_verdict(
    facts: SnapshotFacts, expectations_dir: Path, context_dir: Path, overrides: dict[str, Any] | None
) -> DriftVerdict | None:
    """The drift gate against the previous published snapshot's summary (None: nothing to compare with)."""
    previous = facts.previous
    before = previous.summary if previous is not None else None
    if previous is None or not before:
        return None
    policy = drift_policy(expectations_dir)
    df = drift_frame(facts.summary, before)
    dres = run_gate("drift", df, expectations_dir=expectations_dir, context_dir=context_dir, config_overrides=overrides)
    dvals = df.row(0, named=True)
    dvals.pop(ROW_ID, None)
    failed = [o for o in dres.outcomes if not o.success]
    return DriftVerdict(
        gate=GateVerdict.of(dres, dvals),
        status="failed" if dres.failed_critical else ("warned" if failed else "ok"),
        policy=policy,
        against=previous.version,
        failed=tuple(_failed_text(dres, dvals)),
        before={
            "model_revision": before.get("model_revision"),
            "sampling_hash": before.get("sampling_hash"),
            "rows": before.get("rows"),
        },
    )


def judge_snapshot(
    facts: SnapshotFacts,
    *,
    expectations_dir: Path,
    context_dir: Path,
    config_overrides: dict[str, dict[str, Any]] | None = None,
) -> SnapshotVerdict:
    """Run the publish gate and (when there is a previous snapshot) the drift gate on `facts`.

    A shard left out refuses the snapshot unless `facts.allow_partial` (a partial snapshot asked for
    explicitly). `config_overrides` = {"publish": {...}, "drift": {...}} as run_gate's, per suite.
    """
    ov = config_overrides or {}
    min_prompts = same_answer_min_prompts(expectations_dir)
    share = same_answer_share(facts.summary, min_prompts)
    unasked = 0 if facts.allow_partial else len(facts.excluded)
    pf = publish_frame(facts.rows, facts.shards_included, facts.previous_rows, unasked, share)
    pres = run_gate(
        "publish",
        pf,
        expectations_dir=expectations_dir,
        context_dir=context_dir,
        config_overrides=ov.get("publish"),
    )
    gate = GateVerdict.of(pres, pf.row(0, named=True))
    reasons = [] if pres.success else _publish_reasons(pres, gate, facts, share, min_prompts)
    drift = _drift_verdict(facts, expectations_dir, context_dir, ov.get("drift"))
    if drift is not None and drift.failed and drift.policy == "hold":
        reasons.append(
            f"held back by the drift gate (expectations/drift.json meta.drifted_snapshot=hold) against "
            f"snapshot {drift.against}: " + "; ".join(drift.failed)
        )
    return SnapshotVerdict(publish=not reasons, reasons=reasons, publish_gate=gate, drift=drift)


def drift_line(drift: DriftVerdict | None) -> str:
    """One line for logs and the demo summary."""
    if drift is None:
        return "drift: nothing to compare with (first snapshot)"
    if drift.status == "ok":
        return f"drift: none against snapshot {drift.against}"
    failed = "; ".join(drift.failed)
    return f"drift: {drift.status.upper()} against snapshot {drift.against} (policy: {drift.policy}): {failed}"
