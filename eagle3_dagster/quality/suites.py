"""Gate suites as data: GX 1.x ExpectationSuite JSON files in expectations/<gate>.json.

Each expectation is a plain GX expectation (`type`, `kwargs`) with our gate semantics in `meta`:

    {"type": "expect_column_values_to_be_in_set",
     "kwargs": {"column": "think_end_count", "value_set": [1], "mostly": 0.95},
     "meta": {"key": "think_end_once", "name": "think-end {think_end_id} present exactly once",
              "severity": "critical", "description": "..."}}

- `mostly` is GX's own kwarg: the pass-rate threshold. GX evaluates it; we read the same number.
- `severity` (critical|warning): only critical expectations can fail the gate or quarantine rows.
- `name` may use {think_start_id}, {think_end_id}, {end_of_turn_id}, {profile}: the suite is
  model-agnostic, the names in reports show the profile's ids.
- `level: "table"` marks a column-map expectation whose failure says something about the shard,
  not the row (e.g. source mix): it never puts rows into row_failures.

`config_overrides` (keyed by meta.key or rendered/unrendered name) change `mostly`, `severity`,
`kwargs` or `enabled` without touching the file.

The same definitions are translated to polars predicates (`row_pass_expr`) so the failing row ids
and every reason come from the feature frame, whatever GX result_format is used.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..profiles import ModelProfile

GATES = ("prompts", "generations", "training_samples")
SEVERITIES = ("critical", "warning")

# Column-map expectation types whose per-row semantics we reproduce in polars (GX semantics:
# nulls are ignored, except by the null expectations themselves).
ROW_LEVEL_TYPES = {
    "expect_column_values_to_be_in_set",
    "expect_column_values_to_not_be_in_set",
    "expect_column_values_to_be_between",
    "expect_column_values_to_not_be_null",
    "expect_column_values_to_be_null",
    "expect_column_values_to_be_unique",
    "expect_column_values_to_match_regex",
    "expect_column_values_to_not_match_regex",
}
_NULL_COUNTING_TYPES = {"expect_column_values_to_not_be_null", "expect_column_values_to_be_null"}


class SuiteError(ValueError):
    """A suite file or an override is invalid; the message names the file and the expectation."""


@dataclass
class ExpectationSpec:
    key: str
    name: str  # rendered with the profile's ids
    type: str
    kwargs: dict[str, Any]
    severity: str
    description: str
    level: str  # "row" | "table"
    meta: dict[str, Any] = field(default_factory=dict)
    notes: Any = None

    @property
    def mostly(self) -> float:
        return float(self.kwargs.get("mostly", 1.0))

    @property
    def row_level(self) -> bool:
        return self.level == "row"

    def to_gx_dict(self) -> dict[str, Any]:
        meta = dict(self.meta)
        meta.update(
            key=self.key, name=self.name, severity=self.severity, description=self.description, level=self.level
        )
        # GX renders `notes` in Data Docs: put the readable name and the gate semantics there.
        notes = self.notes or f"{self.name} [{self.severity}, mostly {self.mostly:g}]: {self.description}"
        return {"type": self.type, "kwargs": dict(self.kwargs), "meta": meta, "notes": notes}


@dataclass
class SuiteSpec:
    gate: str
    name: str
    expectations: list[ExpectationSpec]
    meta: dict[str, Any]
    source_path: str
    sha256: str  # of the effective definition (file + overrides), recorded in gate results

    def columns(self) -> list[str]:
        cols: list[str] = []
        for e in self.expectations:
            for k in ("column", "column_A", "column_B"):
                c = e.kwargs.get(k)
                if c and c not in cols:
                    cols.append(c)
        return cols


class _SafeDict(dict):
    def __missing__(self, key: str) -> str:  # leave unknown placeholders visible, never crash
        return "{" + key + "}"


def _render(name: str, profile: ModelProfile | None) -> str:
    if profile is None:  # no ids to show: say what the token is instead
        return name.format_map(
            _SafeDict(
                think_start_id="think-start", think_end_id="think-end", end_of_turn_id="end-of-turn", profile="profile"
            )
        )
    return name.format_map(
        _SafeDict(
            think_start_id=profile.think_start_id,
            think_end_id=profile.think_end_id,
            end_of_turn_id=profile.end_of_turn_id,
            profile=profile.name,
        )
    )


def load_suite(
    gate: str,
    expectations_dir: Path,
    *,
    profile: ModelProfile | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> SuiteSpec:
    """expectations/<gate>.json as a SuiteSpec: names rendered with the profile's ids, `config_overrides`
    (by key or name: mostly, severity, kwargs, enabled) applied; every problem is a SuiteError naming it."""
    path = Path(expectations_dir) / f"{gate}.json"
    raw = _read_suite_json(gate, path)
    overrides = copy.deepcopy(config_overrides or {})
    specs: list[ExpectationSpec] = []
    for i, exp in enumerate(raw["expectations"]):
        spec = _expectation_spec(exp, f"{path} expectation #{i}", profile, overrides)
        if spec is not None:
            specs.append(spec)
    if overrides:
        raise SuiteError(f"config_overrides name no expectation of {path}: {sorted(overrides)}")
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise SuiteError(f"{path}: duplicate expectation keys {sorted({k for k in keys if keys.count(k) > 1})}")
    body = json.dumps([s.to_gx_dict() for s in specs], sort_keys=True, default=str)
    return SuiteSpec(
        gate=gate,
        name=str(raw.get("name") or gate),
        expectations=specs,
        meta=dict(raw.get("meta") or {}),
        source_path=str(path),
        sha256=hashlib.sha256(body.encode()).hexdigest()[:16],
    )


def _read_suite_json(gate: str, path: Path) -> dict[str, Any]:
    if not path.exists():
        raise SuiteError(f"no suite for gate {gate!r}: {path} does not exist")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SuiteError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("expectations"), list):
        raise SuiteError(f"{path}: expected a GX ExpectationSuite object with an 'expectations' list")
    return raw


def _expectation_spec(
    exp: dict[str, Any], where: str, profile: ModelProfile | None, overrides: dict[str, Any]
) -> ExpectationSpec | None:
    """One expectation of the suite JSON, its override (popped from `overrides`) applied; None when disabled."""
    meta = dict(exp.get("meta") or {})
    etype = exp.get("type")
    kwargs = dict(exp.get("kwargs") or {})
    if not etype or ("column" not in kwargs and etype.startswith("expect_column")):
        raise SuiteError(f"{where}: needs 'type' and kwargs.column")
    raw_name = str(meta.get("name") or etype)
    key = str(meta.get("key") or raw_name)
    name = _render(raw_name, profile)
    ov = next((overrides.pop(k) for k in (key, raw_name, name) if k in overrides), None)
    severity, enabled = apply_override(
        key, ov, kwargs, str(meta.get("severity", "critical")), bool(meta.get("enabled", True))
    )
    if not enabled:
        return None
    level = _check_values(where, key, etype, kwargs, severity, str(meta.get("level") or ""))
    for k in ("key", "name", "severity", "description", "level", "enabled"):
        meta.pop(k, None)
    return ExpectationSpec(
        key=key,
        name=name,
        type=etype,
        kwargs=kwargs,
        severity=severity,
        description=str((exp.get("meta") or {}).get("description", "")),
        level=level,
        meta=meta,
        notes=exp.get("notes"),
    )


def apply_override(
    key: str, ov: dict[str, Any] | None, kwargs: dict[str, Any], severity: str, enabled: bool
) -> tuple[str, bool]:
    """An expectation's config override: `mostly` and `kwargs` go into kwargs (in place); returns the
    (severity, enabled) it leaves. An unknown field is a SuiteError, not ignored."""
    if not ov:
        return severity, enabled
    unknown = set(ov) - {"mostly", "severity", "kwargs", "enabled"}
    if unknown:
        raise SuiteError(f"override for {key!r}: unknown field(s) {sorted(unknown)}")
    if "mostly" in ov:
        kwargs["mostly"] = ov["mostly"]
    kwargs.update(ov.get("kwargs") or {})
    return str(ov.get("severity", severity)), bool(ov.get("enabled", enabled))


def _check_values(where: str, key: str, etype: str, kwargs: dict[str, Any], severity: str, level: str) -> str:
    """Severity and `mostly` in range; the level (row when GX's type can be judged per row, else table)."""
    if severity not in SEVERITIES:
        raise SuiteError(f"{where} ({key}): severity must be one of {SEVERITIES}, got {severity!r}")
    mostly = kwargs.get("mostly", 1.0)
    if not isinstance(mostly, (int, float)) or not 0.0 <= float(mostly) <= 1.0:
        raise SuiteError(f"{where} ({key}): mostly must be a number in [0, 1], got {mostly!r}")
    level = level or ("row" if etype in ROW_LEVEL_TYPES else "table")
    if level == "row" and etype not in ROW_LEVEL_TYPES:
        raise SuiteError(f"{where} ({key}): {etype} cannot be row-level; supported: {sorted(ROW_LEVEL_TYPES)}")
    return level


# ---------------------------------------------------------------------------------------------
# polars translation of row-level expectations


def considered_expr(spec: ExpectationSpec) -> pl.Expr:
    """Rows GX counts for this expectation (nulls are skipped except by the null expectations)."""
    if spec.type in _NULL_COUNTING_TYPES:
        return pl.lit(True)
    return pl.col(spec.kwargs["column"]).is_not_null()


def row_pass_expr(spec: ExpectationSpec) -> pl.Expr:
    """True where the row meets the expectation (only meaningful where considered_expr is True)."""
    kw = spec.kwargs
    c = pl.col(kw["column"])
    t = spec.type
    if t == "expect_column_values_to_be_in_set":
        return c.is_in(list(kw["value_set"]))
    if t == "expect_column_values_to_not_be_in_set":
        return ~c.is_in(list(kw["value_set"]))
    if t == "expect_column_values_to_be_between":
        ok = pl.lit(True)
        lo, hi = kw.get("min_value"), kw.get("max_value")
        if lo is not None:
            ok = ok & ((c > lo) if kw.get("strict_min") else (c >= lo))
        if hi is not None:
            ok = ok & ((c < hi) if kw.get("strict_max") else (c <= hi))
        return ok
    if t == "expect_column_values_to_not_be_null":
        return c.is_not_null()
    if t == "expect_column_values_to_be_null":
        return c.is_null()
    if t == "expect_column_values_to_be_unique":
        return ~c.is_duplicated()
    if t == "expect_column_values_to_match_regex":
        return c.str.contains(kw["regex"])
    if t == "expect_column_values_to_not_match_regex":
        return ~c.str.contains(kw["regex"])
    raise SuiteError(f"{spec.key}: no polars translation for {t}")
