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
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import polars as pl

from ..config import gx_keep_validations as keep_validations_from_env
from ..profiles import ModelProfile
from ..storage import DataPath, PathLike, as_data_path, read_parquet, safe_join, shard_key, write_frame_atomic
from .features import ROW_ID
from .retention import DOCS_INDEX, PruneStats, prune_validations
from .suites import ROW_LEVEL_TYPES, ExpectationSpec, SuiteError, SuiteSpec, considered_expr, load_suite, row_pass_expr

_DATASOURCE = "eagle3_features"


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


def _empty_failures() -> pl.DataFrame:
    return pl.DataFrame(schema={ROW_ID: pl.String, "reasons": pl.List(pl.String)})


@dataclass
class GateResult:
    gate: str
    success: bool
    outcomes: list[ExpectationOutcome]
    row_failures: pl.DataFrame = field(default_factory=_empty_failures)
    n_rows: int = 0
    data_docs_index: str | None = None
    data_docs_page: str | None = None  # this validation's Data Docs page (absolute path), if built
    suite_sha256: str = ""
    profile: str | None = None
    created_at: str = ""
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [rows, rows quarantined]

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
            "data_docs_index": self.data_docs_index,
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
            data_docs_index=d.get("data_docs_index"),
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
            f"**gate `{self.gate}`: {'PASSED' if self.success else 'FAILED'}** — {self.n_rows} rows, "
            f"{self.row_failures.height} quarantined",
            "",
            "| expectation | severity | pass rate | mostly | unexpected | ok |",
            "|---|---|---|---|---|---|",
        ]
        for o in self.outcomes:
            rate = f"{o.pass_rate:.4f}" if o.evaluated or o.level == "table" else "skipped"
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
# GX side


@contextmanager
def _locked(context_dir: Path) -> Iterator[None]:
    # One GX file context may be shared by concurrent shard runs (Dagster multiprocess); its YAML
    # and the Data Docs index are rewritten on each run, so runs on the same context take turns.
    context_dir.mkdir(parents=True, exist_ok=True)
    with open(context_dir / ".gate.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _gx_suite(gate: str, suite: SuiteSpec) -> Any:
    """The suite as a GX ExpectationSuite; GX's own validation of every expectation's kwargs."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no telemetry from a data pipeline
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


def _gx_validate(
    gate: str,
    pdf: Any,
    gx_suite: Any,
    context_dir: Path,
    *,
    build_docs: bool,
    result_format: str,
    keep_validations: int = 0,
) -> tuple[list[Any], str | None, str | None]:
    """Register the suite in a file-backed GX context, validate `pdf`, optionally build Data Docs.

    With keep_validations > 0, older validation results of the suite (and their Data Docs pages)
    are pruned first so that this run's result makes `keep_validations` (retention.py); the
    caller holds the context lock.
    """
    import great_expectations as gx

    ctx = gx.get_context(mode="file", project_root_dir=str(context_dir))
    if not ctx.variables.progress_bars or ctx.config.analytics_enabled is not False:
        # Once per context, persisted in great_expectations.yml: no tqdm bars in Dagster logs,
        # no analytics calls from a data pipeline.
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        ctx.config.analytics_enabled = False
        ctx.variables.save()
    ds = ctx.data_sources.add_or_update_pandas(_DATASOURCE)
    try:
        asset = ds.get_asset(gate)
    except LookupError:
        asset = ds.add_dataframe_asset(gate)
    try:
        batch_def = asset.get_batch_definition("whole")
    except KeyError:
        batch_def = asset.add_batch_definition_whole_dataframe("whole")
    gx_suite = ctx.suites.add_or_update(gx_suite)
    vd = ctx.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=f"{gate}_gate", data=batch_def, suite=gx_suite)
    )
    actions: list[gx.checkpoint.ValidationAction] = (
        [gx.checkpoint.UpdateDataDocsAction(name="update_data_docs")] if build_docs else []
    )
    cp = ctx.checkpoints.add_or_update(
        gx.Checkpoint(
            name=f"{gate}_gate",
            validation_definitions=[vd],
            actions=actions,
            result_format={"result_format": result_format},
        )
    )
    pruned = PruneStats()
    if keep_validations > 0:
        # One slot for this run's result: after it, the suite holds at most keep_validations.
        pruned = prune_validations(Path(ctx.root_directory), gx_suite.name, keep_validations - 1)
    res = cp.run(batch_parameters={"dataframe": pdf})
    vri, vres = next(iter(res.run_results.items()))
    results = vres.results
    if pruned.pages_removed and not build_docs and (Path(ctx.root_directory) / DOCS_INDEX).exists():
        # This run builds no docs, so GX will not rewrite the index: rebuild it (index + the suite
        # page only; no validation page is re-rendered) so it links no page that was just pruned.
        from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

        ctx.build_data_docs(resource_identifiers=[ExpectationSuiteIdentifier(name=gx_suite.name)])
    index = page = None
    if build_docs:
        index = _local_site_url(ctx.get_docs_sites_urls())
        try:
            page = _local_site_url(ctx.get_docs_sites_urls(resource_identifier=vri))
        except Exception:  # a link for the report only; never fail a gate over it
            page = None
    return results, index, page


def _local_site_url(sites: list[dict[str, Any]]) -> str | None:
    for site in sites:
        url = site.get("site_url") or ""
        if url.startswith("file://"):
            return unquote(urlparse(url).path)
    return None


def run_gate(
    gate: str,
    features: pl.DataFrame,
    *,
    expectations_dir: Path,
    context_dir: Path,
    build_docs: bool = True,
    config_overrides: dict | None = None,
    profile: ModelProfile | None = None,
    result_format: str = "SUMMARY",
    keep_validations: int | None = None,
) -> GateResult:
    """Validate `features` against expectations/<gate>.json in a GX file context at context_dir.

    `profile` renders the profile's token ids into expectation names. `result_format` is GX's;
    counts and failing rows come from polars either way, so BOOLEAN_ONLY is safe for speed.
    `keep_validations`: GX validation results (and Data Docs pages) kept per suite, older ones are
    pruned under the context lock; None reads EAGLE3_GX_KEEP_VALIDATIONS (default 20), 0 keeps all.
    """
    keep = keep_validations_from_env() if keep_validations is None else int(keep_validations)
    suite = load_suite(gate, Path(expectations_dir), profile=profile, config_overrides=config_overrides)
    missing = [c for c in [ROW_ID, *suite.columns()] if c not in features.columns]
    if missing:
        raise ValueError(f"gate {gate!r}: the feature frame lacks column(s) {missing} used by {suite.source_path}")
    gx_suite = _gx_suite(gate, suite)
    stats, failures = row_stats(features, suite)
    # GX sees only the columns the suite reads: narrow and typed keeps the validation fast.
    pdf = features.select(suite.columns()).to_pandas()
    with _locked(Path(context_dir)):
        results, index, page = _gx_validate(
            gate,
            pdf,
            gx_suite,
            Path(context_dir),
            build_docs=build_docs,
            result_format=result_format,
            keep_validations=max(keep, 0),
        )
    by_key = {r.expectation_config.meta.get("key"): r for r in results}
    outcomes: list[ExpectationOutcome] = []
    for s in suite.expectations:
        r = by_key.get(s.key)
        if r is None:
            raise GateConsistencyError(f"gate {gate!r}: GX returned no result for {s.key!r}")
        if r.exception_info and r.exception_info.get("raised_exception"):
            raise RuntimeError(f"gate {gate!r}: GX raised on {s.key!r}: {r.exception_info.get('exception_message')}")
        gx_ok = bool(r.success)
        res = r.result or {}
        if s.key in stats:
            evaluated, unexpected = stats[s.key]
            pass_rate = 1.0 if evaluated == 0 else (evaluated - unexpected) / evaluated
            if gx_ok != (pass_rate >= s.mostly) or (
                "unexpected_count" in res and res["unexpected_count"] != unexpected
            ):
                raise GateConsistencyError(
                    f"gate {gate!r}, {s.key!r}: GX says success={gx_ok} unexpected={res.get('unexpected_count')}, "
                    f"polars says pass_rate={pass_rate:.6f} unexpected={unexpected} (mostly={s.mostly})"
                )
            mostly = s.mostly
        else:
            evaluated, unexpected = features.height, int(res.get("unexpected_count") or 0)
            if features.height == 0 and s.type.startswith("expect_column_"):
                # A column aggregate of nothing (GX reports e.g. 0% unique) judges nothing: an
                # empty shard is skipped, not failed. expect_table_* (row counts) keep GX's verdict.
                gx_ok = True
            pass_rate, mostly = (1.0 if gx_ok else 0.0), 1.0
        outcomes.append(
            ExpectationOutcome(
                name=s.name,
                severity=s.severity,
                mostly=mostly,
                pass_rate=pass_rate,
                unexpected_count=unexpected,
                success=gx_ok,
                description=s.description,
                key=s.key,
                expectation_type=s.type,
                column=s.kwargs.get("column"),
                evaluated=evaluated,
                level=s.level,
                observed_value=_jsonable(res.get("observed_value")),
            )
        )
    return GateResult(
        by_source=_by_source(features, failures),
        gate=gate,
        success=all(o.success for o in outcomes if o.severity == "critical"),
        outcomes=outcomes,
        row_failures=failures,
        n_rows=features.height,
        data_docs_index=index,
        data_docs_page=page,
        suite_sha256=suite.sha256,
        profile=profile.name if profile else None,
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


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
