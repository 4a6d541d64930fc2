"""Run a gate: GX validates the feature frame; polars names the failing rows; results persist.

Semantics (the part users rely on):
- Every expectation has a severity (critical|warning) and a `mostly` threshold (GX's kwarg).
- The gate fails iff some CRITICAL expectation's pass rate is below its `mostly` (GX decides).
  A systematic failure (every output lacking </think>) fails the gate; a rare one only
  quarantines the affected rows.
- `row_failures` lists every row failing any critical row-level expectation, with every reason.
- Results are written to data/gates/<gate>/shard=NNNN.json so a later run (the training-table
  build) can refuse a shard whose gate failed (`require_gate_passed`).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..profiles import ModelProfile
from ..storage import DataPath, PathLike, as_data_path, read_parquet, safe_join, shard_key, write_frame_atomic
from . import gx_context
from .features import ROW_ID
from .suites import ROW_LEVEL_TYPES, ExpectationSpec, SuiteError, SuiteSpec, considered_expr, load_suite, row_pass_expr


class GateFailedError(RuntimeError):
    """A shard's stored gate result is missing or failed; the message says which and why."""


class GateConsistencyError(RuntimeError):
    """GX and the polars translation of the same expectation disagree (a translation bug)."""


@dataclass
class ExpectationOutcome:
    name: str
    severity: str  # "critical" | "warning"
    mostly: float
    pass_rate: float
    unexpected_count: int
    success: bool
    description: str
    key: str = ""
    expectation_type: str = ""
    column: str | None = None
    evaluated: int = 0  # rows the expectation applied to (non-null feature); 0 = skipped
    level: str = "row"
    observed_value: Any = None


_STATUS_WORD = {"PASS": "PASSED", "FAIL": "FAILED", "EMPTY": "EMPTY (0 rows: nothing judged)"}


def _empty_failures() -> pl.DataFrame:
    return pl.DataFrame(schema={ROW_ID: pl.String, "reasons": pl.List(pl.String)})


@dataclass
class GateResult:
    gate: str
    success: bool
    outcomes: list[ExpectationOutcome]
    row_failures: pl.DataFrame = field(default_factory=_empty_failures)
    n_rows: int = 0
    # this validation's Data Docs page (absolute path): the quality report's Data Docs build writes it
    data_docs_page: str | None = None
    suite_sha256: str = ""
    profile: str | None = None
    created_at: str = ""
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [rows, rows quarantined]
    # timings of this validation (cache hit, lock holds); not stored: only for logs, tests, the bench
    gx_run: gx_context.GXRun | None = field(default=None, repr=False, compare=False)

    @property
    def status(self) -> str:
        """ "PASS", "FAIL", or "EMPTY": passed on 0 rows (nothing was judged; not blocking, but not a
        pass either: every row-level expectation is trivially met on no rows)."""
        if not self.success:
            return "FAIL"
        return "EMPTY" if self.n_rows == 0 else "PASS"

    @property
    def failed_critical(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if o.severity == "critical" and not o.success]

    @property
    def failed_warnings(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if o.severity == "warning" and not o.success]

    def to_json(self, *, include_rows: bool = True) -> dict[str, Any]:
        d = {
            "gate": self.gate,
            "success": self.success,
            "n_rows": self.n_rows,
            "n_row_failures": self.row_failures.height,
            "data_docs_page": self.data_docs_page,
            "row_failures_by_reason": self.reason_counts(),
            "suite_sha256": self.suite_sha256,
            "profile": self.profile,
            "created_at": self.created_at,
            "by_source": self.by_source,
            "outcomes": [asdict(o) for o in self.outcomes],
        }
        if include_rows:
            d["row_failures"] = self.row_failures.to_dicts()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GateResult:
        rows = d.get("row_failures") or []
        rf = (
            pl.DataFrame(rows, schema={ROW_ID: pl.String, "reasons": pl.List(pl.String)}) if rows else _empty_failures()
        )
        return cls(
            gate=d["gate"],
            success=bool(d["success"]),
            outcomes=[ExpectationOutcome(**o) for o in d.get("outcomes", [])],
            row_failures=rf,
            n_rows=int(d.get("n_rows", 0)),
            data_docs_page=d.get("data_docs_page"),
            suite_sha256=d.get("suite_sha256", ""),
            profile=d.get("profile"),
            created_at=d.get("created_at", ""),
            by_source={str(k): [int(x) for x in v] for k, v in (d.get("by_source") or {}).items()},
        )

    def reason_counts(self) -> dict[str, int]:
        """Quarantined rows per reason (a row with two reasons counts under both), most frequent first."""
        if not self.row_failures.height:
            return {}
        vc = self.row_failures.select(pl.col("reasons").explode().drop_nulls().alias("r")).group_by("r").len()
        return dict(sorted(((str(r), int(n)) for r, n in vc.iter_rows()), key=lambda kv: (-kv[1], kv[0])))

    def summary_markdown(self) -> str:
        lines = [
            f"**gate `{self.gate}`: {_STATUS_WORD[self.status]}** — {self.n_rows} rows, "
            f"{self.row_failures.height} quarantined",
            "",
            "| expectation | severity | pass rate | mostly | unexpected | ok |",
            "|---|---|---|---|---|---|",
        ]
        for o in self.outcomes:
            rate = (
                f"{o.pass_rate:.4f}"
                if o.evaluated or o.level == "table"
                else ("empty" if not self.n_rows else "skipped")
            )
            lines.append(
                f"| {o.name} | {o.severity} | {rate} | {o.mostly} | {o.unexpected_count} | "
                f"{'yes' if o.success else '**NO**'} |"
            )
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# polars side: counts, pass rates and the rejects table from the same definitions


def row_stats(features: pl.DataFrame, suite: SuiteSpec) -> tuple[dict[str, tuple[int, int]], pl.DataFrame]:
    """Per row-level expectation (evaluated, unexpected) counts, and the row_failures frame.

    The polars translation of the suite: what run_gate quarantines, and the plain-polars baseline
    bench/gates.py times GX against.
    """
    row_specs = [s for s in suite.expectations if s.type in ROW_LEVEL_TYPES]
    if not row_specs:
        return {}, _empty_failures()
    flags = features.select(
        pl.col(ROW_ID),
        *[(considered_expr(s) & ~row_pass_expr(s).fill_null(False)).alias(f"_f{i}") for i, s in enumerate(row_specs)],
    )
    unexpected = flags.select(*[pl.col(f"_f{i}").sum() for i in range(len(row_specs))]).row(0)
    considered = features.select(*[considered_expr(s).sum().alias(f"_c{i}") for i, s in enumerate(row_specs)]).row(0)
    stats = {s.key: (int(considered[i]), int(unexpected[i] or 0)) for i, s in enumerate(row_specs)}
    critical = [i for i, s in enumerate(row_specs) if s.severity == "critical" and s.row_level]
    if not critical:
        return stats, _empty_failures()
    # Reasons are built only for failing rows (a small minority): cheap on a million rows.
    failing = flags.filter(pl.any_horizontal(*[pl.col(f"_f{i}") for i in critical]))
    failures = failing.select(
        pl.col(ROW_ID),
        pl.concat_list([pl.when(pl.col(f"_f{i}")).then(pl.lit(row_specs[i].name)) for i in critical])
        .list.drop_nulls()
        .alias("reasons"),
    )
    return stats, failures


# ---------------------------------------------------------------------------------------------
# GX side (the context, its cache and its lock: gx_context.py)

_SUITES: dict[tuple[str, str, str, str], Any] = {}


def _gx_suite(gate: str, suite: SuiteSpec) -> Any:
    """The suite as a GX ExpectationSuite (built once per process per definition)."""
    key = (gate, suite.sha256, json.dumps(suite.meta, sort_keys=True, default=str), suite.source_path)
    cached = _SUITES.get(key)
    if cached is None:
        cached = _SUITES[key] = _build_gx_suite(gate, suite)
    return cached


def _build_gx_suite(gate: str, suite: SuiteSpec) -> Any:
    """The suite as a GX ExpectationSuite; GX's own validation of every expectation's kwargs."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    def build(exps: list[ExpectationSpec]) -> Any:
        return ExpectationSuite(
            name=f"{gate}_gate",
            expectations=[e.to_gx_dict() for e in exps],
            meta={**suite.meta, "source": suite.source_path, "suite_sha256": suite.sha256},
        )

    try:
        gx_suite = build(suite.expectations)
        ok = len(gx_suite.expectations) == len(suite.expectations)
    except Exception:  # re-raised below with the expectation named
        ok = False
    if not ok:
        # GX either raises without naming the expectation or logs and drops it: find and name it.
        for e in suite.expectations:
            try:
                if len(build([e]).expectations) == 1:
                    continue
                msg = "dropped by GX"
            except Exception as err:
                msg = str(err).replace("\n", " ")
            raise SuiteError(f"{suite.source_path}: GX rejects expectation {e.key!r} ({e.type}): {msg}")
    return gx_suite


def run_gate(
    gate: str,
    features: pl.DataFrame,
    *,
    expectations_dir: Path,
    context_dir: Path,
    config_overrides: dict | None = None,
    profile: ModelProfile | None = None,
    result_format: str = "SUMMARY",
) -> GateResult:
    """Validate `features` against expectations/<gate>.json in a GX file context at context_dir, and store
    GX's validation result there: a gate only validates (the quality report builds the Data Docs and prunes
    old results: gx_docs.build_data_docs).

    `profile` renders the profile's token ids into expectation names. `result_format` is GX's;
    counts and failing rows come from polars either way, so BOOLEAN_ONLY is safe for speed.

    The GX context, suite and checkpoint are set up once per process and reused (gx_context.py);
    only a set-up writes to the shared context, under its file lock.
    """
    suite = load_suite(gate, Path(expectations_dir), profile=profile, config_overrides=config_overrides)
    missing = [c for c in [ROW_ID, *suite.columns()] if c not in features.columns]
    if missing:
        raise ValueError(f"gate {gate!r}: the feature frame lacks column(s) {missing} used by {suite.source_path}")
    gx_suite = _gx_suite(gate, suite)
    stats, failures = row_stats(features, suite)
    # GX sees only the columns the suite reads: narrow and typed keeps the validation fast.
    pdf = features.select(suite.columns()).to_pandas()
    run = gx_context.validate(Path(context_dir), gate, pdf, gx_suite, result_format=result_format)
    results = run.results
    by_key = {r.expectation_config.meta.get("key"): r for r in results}
    outcomes = [_outcome(gate, spec, by_key.get(spec.key), stats, features.height) for spec in suite.expectations]
    return GateResult(
        by_source=_by_source(features, failures),
        gate=gate,
        success=all(o.success for o in outcomes if o.severity == "critical"),
        outcomes=outcomes,
        row_failures=failures,
        n_rows=features.height,
        data_docs_page=run.docs_page,
        suite_sha256=suite.sha256,
        profile=profile.name if profile else None,
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        gx_run=run,
    )


def _outcome(
    gate: str, spec: ExpectationSpec, r: Any, stats: dict[str, tuple[int, int]], n_rows: int
) -> ExpectationOutcome:
    """One expectation's outcome from GX's result `r`: a row-level one is checked against the polars
    counts (`stats`: key -> (evaluated, unexpected)), which must agree with GX's verdict."""
    if r is None:
        raise GateConsistencyError(f"gate {gate!r}: GX returned no result for {spec.key!r}")
    if r.exception_info and r.exception_info.get("raised_exception"):
        raise RuntimeError(f"gate {gate!r}: GX raised on {spec.key!r}: {r.exception_info.get('exception_message')}")
    res = r.result or {}
    if spec.key in stats:
        gx_ok, mostly = bool(r.success), spec.mostly
        evaluated, unexpected = stats[spec.key]
        pass_rate = _row_level_pass_rate(gate, spec, gx_ok, res, evaluated, unexpected)
    else:
        evaluated, unexpected = n_rows, int(res.get("unexpected_count") or 0)
        gx_ok, mostly = _table_level_success(spec, bool(r.success), n_rows), 1.0
        pass_rate = 1.0 if gx_ok else 0.0
    return ExpectationOutcome(
        name=spec.name,
        severity=spec.severity,
        mostly=mostly,
        pass_rate=pass_rate,
        unexpected_count=unexpected,
        success=gx_ok,
        description=spec.description,
        key=spec.key,
        expectation_type=spec.type,
        column=spec.kwargs.get("column"),
        evaluated=evaluated,
        level=spec.level,
        observed_value=_jsonable(res.get("observed_value")),
    )


def _row_level_pass_rate(
    gate: str, spec: ExpectationSpec, gx_ok: bool, res: dict, evaluated: int, unexpected: int
) -> float:
    """The polars pass rate of a row-level expectation; a GateConsistencyError when GX disagrees
    (its verdict against `mostly`, or its unexpected count)."""
    pass_rate = 1.0 if evaluated == 0 else (evaluated - unexpected) / evaluated
    if gx_ok != (pass_rate >= spec.mostly) or ("unexpected_count" in res and res["unexpected_count"] != unexpected):
        raise GateConsistencyError(
            f"gate {gate!r}, {spec.key!r}: GX says success={gx_ok} unexpected={res.get('unexpected_count')}, "
            f"polars says pass_rate={pass_rate:.6f} unexpected={unexpected} (mostly={spec.mostly})"
        )
    return pass_rate


def _table_level_success(spec: ExpectationSpec, gx_ok: bool, n_rows: int) -> bool:
    """GX's verdict on a table-level expectation, except that a column aggregate of nothing (GX
    reports e.g. 0% unique) judges nothing: an empty shard is skipped, not failed. expect_table_*
    (row counts) keep GX's verdict."""
    if n_rows == 0 and spec.type.startswith("expect_column_"):
        return True
    return gx_ok


def _by_source(features: pl.DataFrame, failures: pl.DataFrame) -> dict[str, list[int]]:
    """Rows and quarantined rows per source (for per-source pass rates in the report)."""
    if "source" not in features.columns or features.height == 0:
        return {}
    bad = failures[ROW_ID].cast(pl.String) if failures.height else pl.Series(ROW_ID, [], pl.String)
    agg = (
        features.select(
            pl.col("source").cast(pl.String).fill_null("(none)"),
            pl.col(ROW_ID).cast(pl.String).is_in(bad.implode()).alias("_bad"),
        )
        .group_by("source")
        .agg(pl.len().alias("n"), pl.col("_bad").sum().alias("q"))
        .sort("source")
    )
    return {str(r["source"]): [int(r["n"]), int(r["q"])] for r in agg.iter_rows(named=True)}


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v)
        return v
    except TypeError:
        return str(v)


# ---------------------------------------------------------------------------------------------
# persistence


def gate_result_path(data_dir: PathLike, gate: str, shard: int) -> Any:
    """data/gates/<gate>/shard=NNNN.json (a Path for a local Path root, else a DataPath)."""
    if isinstance(data_dir, DataPath):
        return data_dir.joinpath("gates", gate, f"shard={shard_key(shard)}.json")
    return safe_join(Path(data_dir), "gates", gate, f"shard={shard_key(shard)}.json")


def write_gate_result(data_dir: PathLike, gate: str, shard: int, result: GateResult) -> Any:
    """data/gates/<gate>/shard=NNNN.json (+ its rejects as Parquet beside it), atomic.

    The failing rows go to a uniquely named Parquet file that the JSON names, so a systematic
    failure on a million rows does not make a huge JSON, and a reader never pairs a new JSON with
    an old rejects file: the JSON is put in place last (rename locally, one PUT on object storage),
    then older rejects files go.
    """
    native = gate_result_path(data_dir, gate, shard)
    path = as_data_path(native)
    stem = path.name[: -len(".json")]
    rejects = path.with_name(f"{stem}.{uuid.uuid4().hex[:12]}.rejects.parquet")
    write_frame_atomic(result.row_failures, rejects)
    body = result.to_json(include_rows=False)
    body["row_failures_file"] = rejects.name
    path.write_text(json.dumps(body, indent=1, default=str))
    for old in path.parent.glob(f"{stem}.*.rejects.parquet"):
        if old.name != rejects.name:
            old.unlink(missing_ok=True)
    return native


def read_gate_result(data_dir: PathLike, gate: str, shard: int) -> GateResult | None:
    path = as_data_path(gate_result_path(data_dir, gate, shard))
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    res = GateResult.from_json(d)
    if d.get("row_failures_file"):
        res.row_failures = read_parquet(path.with_name(d["row_failures_file"])).select(
            pl.col(ROW_ID).cast(pl.String), pl.col("reasons").cast(pl.List(pl.String))
        )
    return res


def require_gate_passed(data_dir: PathLike, gate: str, shard: int) -> GateResult:
    """The stored result for (gate, shard) if it passed; GateFailedError if missing or failed."""
    res = read_gate_result(data_dir, gate, shard)
    if res is None:
        raise GateFailedError(f"shard {shard_key(shard)}: no stored {gate!r} gate result; run the gate first")
    if not res.success:
        names = ", ".join(f"{o.name} ({o.pass_rate:.3f} < {o.mostly})" for o in res.failed_critical)
        raise GateFailedError(f"shard {shard_key(shard)}: the {gate!r} gate failed: {names}")
    return res


def quarantined_ids(result: GateResult) -> set[str]:
    """Row ids the gate quarantined (to drop when building the next table)."""
    return set(result.row_failures[ROW_ID].to_list())
