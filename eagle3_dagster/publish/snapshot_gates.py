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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..quality.features import ROW_ID
from ..quality.gate import GateResult, run_gate
from ..quality.suites import SuiteError, load_suite

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


def same_answer_share(summary: dict[str, Any], min_prompts: int | None) -> float | None:
    """Share of the summary's rows whose answer is that of `min_prompts` or more different prompts (None: a
    summary without the figures, or no group size: not judged)."""
    groups = summary.get("same_answer_rows")
    rows = int(summary.get("rows") or 0)
    if min_prompts is None or groups is None or not rows:
        return None
    return sum(int(n) for k, n in groups.items() if int(k) >= min_prompts) / rows


def _same_answer_reason(name: str, summary: dict[str, Any], share: float | None, min_prompts: int | None) -> str:
    groups = {int(k): int(n) for k, n in (summary.get("same_answer_rows") or {}).items()}
    biggest = max(groups, default=0)
    return (
        f"{name}: {share or 0:.1%} of the {summary.get('rows')} rows have an answer shared by {min_prompts} or more "
        f"different prompts (the largest group: {biggest} prompts with one answer): one answer sent for many "
        "prompts, e.g. a response cache keyed on the wrong field"
    )


def _p50(summary: dict[str, Any], col: str) -> float | None:
    v = ((summary.get("lengths") or {}).get(col) or {}).get("p50")
    return None if v is None else float(v)


def drift_values(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Before/after numbers of two distribution summaries: p50 ratios, rate changes, what changed."""
    out: dict[str, Any] = {}
    for c in RATIO_METRICS:
        a, b = _p50(old, c), _p50(new, c)
        out[f"{c}_p50_ratio"] = None if a in (None, 0.0) or b is None else round(b / a, 6)
    for r in RATE_METRICS:
        a, b = old.get(r), new.get(r)
        out[f"{r}_change"] = None if a is None or b is None else round(float(b) - float(a), 6)
    out["model_revision_changed"] = (new.get("model_revision") or "") != (old.get("model_revision") or "")
    out["sampling_hash_changed"] = (new.get("sampling_hash") or "") != (old.get("sampling_hash") or "")
    return out


def drift_frame(new: dict[str, Any], old: dict[str, Any]) -> pl.DataFrame:
    vals = drift_values(new, old)
    schema = {ROW_ID: pl.String, **{k: (pl.Boolean if k.endswith("_changed") else pl.Float64) for k in vals}}
    return pl.DataFrame({ROW_ID: ["snapshot"], **{k: [v] for k, v in vals.items()}}, schema=schema)


@dataclass
class SnapshotVerdict:
    """What the snapshot gates decided; stored in the manifest and in data/gates/publish/last.json."""

    publish: bool
    reasons: list[str] = field(default_factory=list)  # why not published (empty when published)
    publish_gate: dict[str, Any] = field(default_factory=dict)
    drift: dict[str, Any] | None = None  # None: nothing to compare with

    @property
    def drift_status(self) -> str:
        return (self.drift or {}).get("status", "none")

    def to_json(self) -> dict[str, Any]:
        return {
            "publish": self.publish,
            "reasons": self.reasons,
            "publish_gate": self.publish_gate,
            "drift": self.drift,
        }


def _gate_json(res: GateResult) -> dict[str, Any]:
    return {
        "success": res.success,
        "suite_sha256": res.suite_sha256,
        "created_at": res.created_at,
        "outcomes": [
            {
                "key": o.key,
                "name": o.name,
                "severity": o.severity,
                "success": o.success,
                "column": o.column,
                "description": o.description,
            }
            for o in res.outcomes
        ],
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
    pres: Any,
    pvals: dict[str, Any],
    summary: dict[str, Any],
    previous: dict[str, Any] | None,
    excluded: dict[str, str] | None,
    share: float | None,
    min_prompts: int | None,
) -> list[str]:
    """Why the publish gate refused the snapshot: one line per failed critical expectation, in the user's words."""
    reasons = []
    left_out = ", ".join(f"{k} ({v})" for k, v in (excluded or {}).items())
    prev_rows = int(previous["rows"]) if previous and previous.get("rows") is not None else None
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
            reasons.append(_same_answer_reason(o.name, summary, share, min_prompts))
        elif o.key == "rows_vs_previous" and prev_rows:
            reasons.append(
                f"{o.name}: {pvals['rows']} rows vs {prev_rows} in snapshot {(previous or {}).get('version')} "
                f"({pvals['rows_fraction_of_previous']:.0%})"
            )
        else:
            reasons.append(f"{o.name} ({o.column} = {pvals.get(o.column or '')!r})")
    return reasons


def judge_snapshot(
    *,
    rows: int,
    shards_included: int,
    summary: dict[str, Any],
    previous: dict[str, Any] | None,
    expectations_dir: Path,
    context_dir: Path,
    excluded: dict[str, str] | None = None,
    allow_partial: bool = False,
    config_overrides: dict[str, dict[str, Any]] | None = None,
) -> SnapshotVerdict:
    """Run the publish gate and (when there is a previous snapshot) the drift gate.

    `previous` is the manifest of the snapshot LATEST names (None on the first night). `excluded`: the
    shards left out and why; unless `allow_partial` (a partial snapshot asked for explicitly) any refuses it.
    `config_overrides` = {"publish": {...}, "drift": {...}} as run_gate's, per suite.
    """
    ov = config_overrides or {}
    prev_rows = int(previous["rows"]) if previous and previous.get("rows") is not None else None
    min_prompts = same_answer_min_prompts(expectations_dir)
    share = same_answer_share(summary, min_prompts)
    pf = publish_frame(rows, shards_included, prev_rows, 0 if allow_partial else len(excluded or {}), share)
    pres = run_gate(
        "publish",
        pf,
        expectations_dir=expectations_dir,
        context_dir=context_dir,
        config_overrides=ov.get("publish"),
    )
    pvals = pf.row(0, named=True)
    reasons = [] if pres.success else _publish_reasons(pres, pvals, summary, previous, excluded, share, min_prompts)
    publish_gate = {**_gate_json(pres), "values": pvals}
    drift = None
    if previous is not None and previous.get("summary"):
        policy = drift_policy(expectations_dir)
        df = drift_frame(summary, previous["summary"])
        dres = run_gate(
            "drift",
            df,
            expectations_dir=expectations_dir,
            context_dir=context_dir,
            config_overrides=ov.get("drift"),
        )
        dvals = df.row(0, named=True)
        dvals.pop(ROW_ID, None)
        failed = [o for o in dres.outcomes if not o.success]
        status = "failed" if dres.failed_critical else ("warned" if failed else "ok")
        drift = {
            **_gate_json(dres),
            "status": status,
            "policy": policy,
            "against": previous.get("version"),
            "values": dvals,
            "failed": _failed_text(dres, dvals),
            "before": {k: previous["summary"].get(k) for k in ("model_revision", "sampling_hash", "rows")},
        }
        if failed and policy == "hold":
            reasons.append(
                f"held back by the drift gate (expectations/drift.json meta.drifted_snapshot=hold) against "
                f"snapshot {previous.get('version')}: " + "; ".join(drift["failed"])
            )
    return SnapshotVerdict(publish=not reasons, reasons=reasons, publish_gate=publish_gate, drift=drift)


def drift_line(drift: dict[str, Any] | None) -> str:
    """One line for logs and the demo summary."""
    if not drift:
        return "drift: nothing to compare with (first snapshot)"
    if drift.get("status") == "ok":
        return f"drift: none against snapshot {drift.get('against')}"
    return (
        f"drift: {str(drift.get('status')).upper()} against snapshot {drift.get('against')} "
        f"(policy: {drift.get('policy')}): " + "; ".join(drift.get("failed") or [])
    )
