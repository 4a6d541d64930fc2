"""`eagle3 demo` and `eagle3 backfill`: the whole graph on the local instance, and its summary.

Both run the graph in this process in the order and by the publish rule of orchestration/sequence.py
(materialize_graph): ingest, every shard, the snapshot (only when every shard passed, unless
`--allow-partial`), the report last. The demo starts a simulator when EAGLE3_SGLANG_URL is unset;
the backfill needs that variable (a real SGLang server or router) and waits for it as long as the
nightly does. Nothing here writes the process environment: the instance is opened from its folder,
the endpoint's URL reaches the runs as the `sglang` resource.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import Settings, interactive_endpoint_wait_s, settings
from ..orchestration.checks_column import checks_column
from ..secret import printable
from ..storage import DataDirLock, DataDirLocked, DataPath, LockOptions, parquet_num_rows
from .instance import ensure_dagster_home, sglang_endpoint
from .stop import StopOnSignal, stopped_line

DEMO_LOCK = ".eagle3-demo.lock"  # in the data dir (storage/locks.py): one `eagle3 demo` at a time on it


def _rows(folder: DataPath, pattern: str = "part-*.parquet") -> int:
    return sum(parquet_num_rows(f) for f in folder.glob(pattern))


def _text_exact_line(data_dir: DataPath, snap: str | None) -> list[str]:
    """Rows whose text re-encodes to other ids (kept in token-level tables, flagged or left out of text exports)."""
    manifest = data_dir / "snapshots" / str(snap) / "manifest.json"
    if not snap or not manifest.exists():
        return []
    exports = json.loads(manifest.read_text()).get("exports", {})
    flagged = exports.get("exports/specforge_prompts.jsonl", {}).get("rows_not_text_exact", 0)
    pre = exports.get("exports/specforge_preformatted.jsonl", {})
    return [
        f"text-exact: {flagged} row(s) not text-exact (non-canonical tokenization): kept in training_samples and "
        f"specforge_prompts.jsonl, flagged in conversations.jsonl; specforge_preformatted.jsonl has "
        f"{pre.get('rows', '?')} row(s), {pre.get('rows_left_out', '?')} left out"
    ]


def current_generations(folder: DataPath) -> int:
    """Stored generations of the shard's current cache keys (active.parquet), with output ids (streamed:
    the summary never holds a shard's output ids).

    A shard folder also keeps samples of earlier revisions / sampling settings; error rows are never
    in it. Without active.parquet the step did not complete: nothing is current.
    """
    from ..generate.store import count_current_samples
    from ..storage import read_parquet

    active = folder / "active.parquet"
    if not active.exists():
        return 0
    ids = read_parquet(active, columns=["sample_id"]).get_column("sample_id")
    return count_current_samples(folder, ids.to_list())


def request_failures(data_dir: DataPath, shard_ids: list[int]) -> dict[str, dict[str, tuple[int, str]]]:
    """Shard key -> its failed requests by reason (count, last detail), from errors.parquet: the permanent
    ones (not sent again) and the retryable ones (the next run sends them again).

    These requests have no row anywhere else: without this they would be a silent hole in the shard.
    """
    from ..generate.report import failures_by_reason
    from ..generate.store import read_generation_errors

    out = {}
    for k in shard_ids:
        errors = read_generation_errors(data_dir / "generations" / f"shard={k:04d}")
        if errors.height:
            out[f"{k:04d}"] = failures_by_reason(errors.iter_rows(named=True))
    return out


def warnings_line(
    warned: dict[str, list[str]], failures: dict[str, dict[str, tuple[int, str]]], logged: int = 0
) -> str:
    """`warnings:` of the summary: fired warning expectations, then every shard's failed requests by reason,
    then how many warnings the runs logged (each is a `warning:` line below the summary).

    Never `none` while a request of a shard failed or a run logged a warning. Permanent failures (not sent
    again) and retryable ones (the next run sends them again) are counted apart.
    """
    from ..generate.report import failures_by_permanence

    parts = [f"{k} on shard(s) {', '.join(sorted(v))}" for k, v in sorted(warned.items())]
    for key, by_reason in sorted(failures.items()):
        n = sum(c for c, _ in by_reason.values())
        parts.append(f"generations shard {key}: {n:,} request(s) failed: {failures_by_permanence(by_reason)}")
    if logged:
        parts.append(f"{logged} warning(s) logged by the runs (the `warning:` lines below)")
    return "warnings:   " + ("; ".join(parts) if parts else "none")


def _fail_word(sh, check: str) -> str:
    return "WARN" if getattr(sh, "failed_checks", {}).get(check) == "WARN" else "FAIL"


def _check_word(ok: bool, asset_rows: int | None, sh, check: str) -> str:
    """PASS / WARN / FAIL, "empty" for a check that passed on an asset of 0 rows, "not-judged" for one that
    had nothing to judge (its metadata says judged: false)."""
    if not ok:
        return _fail_word(sh, check)
    if check in getattr(sh, "not_judged", ()):
        return "not-judged"
    return "empty" if asset_rows == 0 else "PASS"


def shard_table(outcome, data_dir: DataPath) -> list[str]:
    """The summary's table: per shard its rows at each stage and its checks, the unmaterialized assets named."""
    from ..orchestration.asset_names import SHARD_ASSETS

    lines: list[str] = []
    header = f"{'shard':>6} {'tokenized':>10} {'generated':>10} {'training':>9}  checks"
    lines += ["", header, "-" * len(header)]
    for sh in outcome.shards:
        k = int(sh.shard)
        tok = _rows(data_dir / "tokenized_prompts" / f"shard={k:04d}")
        gen = current_generations(data_dir / "generations" / f"shard={k:04d}")
        trn = _rows(data_dir / "training_samples" / f"shard={k:04d}")
        order = {a: i for i, a in enumerate(SHARD_ASSETS)}
        ranked = sorted(
            sh.checks.items(), key=lambda kv: (order.get(kv[0].split(":")[0], 9), kv[0].endswith("_gate"), kv[0])
        )
        rows = dict(zip(SHARD_ASSETS, (tok, gen, trn), strict=True))
        words = [(name.split(":")[1], _check_word(ok, rows.get(name.split(":")[0]), sh, name)) for name, ok in ranked]
        row = f"{sh.shard:>6} {tok:>10} {gen:>10} {trn:>9}  "
        first, *more = checks_column(words, indent=len(row))
        lines += [row + first, *more]
        if sh.skipped_or_failed:
            lines.append(f"{'':>6} not materialized: {', '.join(sh.skipped_or_failed)}")
    return lines


def counts_lines(outcome, data_dir: DataPath, s: Settings) -> list[str]:
    """Every prompt read, counted once (the data card states the same equation: publish/card_facts.py), over the
    shards this run covered: rejected, duplicates, overlaps, other shards, probe prompts, quarantined or failed,
    trained; then the training rows."""
    from ..ingest import load_source_specs
    from ..publish.card_facts import reconciliation, source_counts
    from ..storage import as_data_path

    if not outcome.ingest_success:
        return []
    data_dir = as_data_path(data_dir)
    specs = [x for x in load_source_specs(s.storage.sources_dir) if x.role in ("train", "probe")]
    shards = [int(sh.shard) for sh in outcome.shards]
    tables = [
        t for k in shards if (t := data_dir / "training_samples" / f"shard={k:04d}" / "part-0000.parquet").exists()
    ]
    counts = source_counts(
        data_dir, [x.name for x in specs], shards, tables, [x.name for x in specs if x.role == "probe"]
    )
    return [f"counts:     {reconciliation(counts)}"]


def summarize(outcome, data_dir: DataPath, s: Settings, command: str = "demo") -> str:
    """The summary of `outcome` (`eagle3 demo`, `eagle3 backfill`); `s`: the settings its definitions were
    built from."""
    lines = ["", "=" * 72, f"eagle3-dagster {command} summary", "=" * 72]
    prompts = data_dir / "prompts" / "prompts.parquet"
    rej = data_dir / "prompts" / "prompt_rejects.parquet"
    lines.append(f"model profile: {s.model.name}   data dir: {data_dir}")
    for src in (data_dir / "sources").glob("*"):
        c = json.loads((src / "counts.json").read_text()) if (src / "counts.json").exists() else {}
        lines.append(
            f"source {src.name}: read {c.get('read', '?')} = accepted {c.get('accepted', '?')} + rejected "
            f"{c.get('rejected', '?')} + duplicates {c.get('duplicates', '?')}"
            + (f"  (reject rate {c['rejected'] / c['read']:.1%})" if c.get("read") else "")
        )
    lines.append(
        f"prompts: {_rows(prompts.parent, 'prompts.parquet')} unique, {_rows(rej.parent, 'prompt_rejects.parquet')} rejected"
    )
    lines += counts_lines(outcome, data_dir, s)
    lines += shard_table(outcome, data_dir)
    warned: dict[str, list[str]] = {}  # "gate/expectation key" -> shards where the warning fired
    for gate_file in (data_dir / "gates").glob("*/shard=*.json"):
        stored = json.loads(gate_file.read_text())
        for o in stored.get("outcomes", []):
            if o.get("severity") == "warning" and not o.get("success"):
                warned.setdefault(f"{gate_file.parent.name}/{o.get('key')}", []).append(gate_file.stem[len("shard=") :])
    failures = request_failures(data_dir, [int(sh.shard) for sh in outcome.shards])
    lines.append(warnings_line(warned, failures, len(getattr(outcome, "logged_warnings", []))))
    snap = outcome.snapshot_version
    from ..report.html import default_report_path
    from .speculative_demo import acceptance_lines

    report = default_report_path(s.storage.work_dir)
    lines += [
        "",
        f"tables:     {data_dir}/{{prompts,tokenized_prompts,generations,training_samples}}/",
        f"snapshot:   {data_dir / 'snapshots' / snap if snap else 'not published'}"
        + _not_latest(data_dir, snap)
        + (
            " (README.md data card, manifest.json, exports/specforge_prompts.jsonl, "
            "exports/specforge_preformatted.jsonl, exports/conversations.jsonl)"
            if snap
            else ""
        ),
        *_text_exact_line(data_dir, snap),
        *acceptance_lines(data_dir, [int(sh.shard) for sh in outcome.shards]),
        *_publish_lines(outcome),
        f"data docs:  {getattr(outcome, 'data_docs', None) or 'not built'}",
        _report_line(report, getattr(outcome, "report_error", None)),
        f"instance:   DAGSTER_HOME={s.dagster.home}  (see the runs with `make ui`)",
    ]
    lines += problem_lines(outcome, s, report, command)
    lines.append(f"result:     {result_word(outcome)}")
    # one printed line per entry: an error or warning quoting a server (a drafter path, a version, an error
    # body) cannot clear the terminal or forge a line of the summary
    return "\n".join(printable(line) for line in lines)


def _not_latest(data_dir: DataPath, snap: str | None) -> str:
    """A snapshot that LATEST does not name is marked: it is not the published one."""
    from ..publish.snapshot import read_latest

    latest = read_latest(data_dir / "snapshots") if snap else None
    return f" -- NOT published (LATEST is {latest or 'none'})" if snap and latest != snap else ""


def _report_line(report: Path, error: str | None) -> str:
    if error:
        old = f"; {report} is an earlier run's and does not show this one" if report.exists() else ""
        return f"report:     NOT written by this run ({error}){old}"
    if not report.exists():
        return "report:     not written"
    return (
        f"report:     {report}  (offline HTML: publish/drift, charts, shards x gates, failures, quarantine, "
        "snapshots; `eagle3 report` rebuilds it)"
    )


def result_word(outcome) -> str:
    """STOPPED, SUCCESS, FAILED; a run whose data steps succeeded but whose quality report was not written
    is not a SUCCESS either."""
    if getattr(outcome, "stopped", False):
        return "STOPPED (rerun to resume)"
    if outcome.success:
        return "SUCCESS"
    if getattr(outcome, "report_error", None) and getattr(outcome, "data_success", False):
        return "FAILED: the quality report was not written (the data steps succeeded)"
    return "FAILED"


def _publish_lines(outcome) -> list[str]:
    """Why no snapshot was asked for; a partial one's shards left out; the publish and drift gates of the
    snapshot run (asset checks on training_dataset); one line each."""
    lines = []
    if getattr(outcome, "not_published", ""):
        lines.append(f"publish:    {outcome.not_published}")
    if getattr(outcome, "left_out", []) and getattr(outcome, "publish_success", None):
        lines.append(
            f"publish:    PARTIAL snapshot (--allow-partial): shard(s) {', '.join(outcome.left_out)} left out; its "
            "manifest and data card name each and why"
        )
    checks = getattr(outcome, "publish_checks", {}) or {}
    if "publish_gate" in checks and not checks["publish_gate"][0]:
        lines.append(f"publish:    FAILED: {checks['publish_gate'][2]}")
    if "drift_gate" in checks:
        desc = checks["drift_gate"][2]
        lines.append(f"drift:      {desc.removeprefix('drift: ')}")
    return lines


def problem_lines(outcome, s, report: Path, command: str = "demo") -> list[str]:
    """Errors, warnings and what to do next; empty when everything passed."""
    rerun = f"rerun `{'make demo' if command == 'demo' else 'eagle3 ' + command}`"
    errors = [f"ingest {e}" for e in outcome.ingest_errors]
    errors += [f"ingest check {c} failed" for c, sev in outcome.ingest_failed_checks.items() if sev == "ERROR"]
    if not outcome.ingest_success and not outcome.ingest_errors:
        errors.append("ingest run failed (see the run in `make ui`)")
    for sh in outcome.shards:
        errors += [f"shard {sh.shard} {e}" for e in sh.errors]
        errors += [
            f"shard {sh.shard} check {c} failed"
            for c, sev in sh.failed_checks.items()
            if sev == "ERROR" and not any(c.split(":")[1] in e for e in sh.errors)
        ]
        if not sh.success and not sh.errors:
            errors.append(f"shard {sh.shard} run failed (see run {sh.run_id} in `make ui`)")
    errors += [f"publish {e}" for e in outcome.publish_errors]
    errors += [f"publish check {c} failed" for c, sev in outcome.publish_failed_checks.items() if sev == "ERROR"]
    if outcome.publish_success is False and not outcome.publish_errors:
        errors.append("publish (training_dataset) run failed (see it in `make ui`)")
    out = [""] if errors or outcome.warnings else []
    out += [f"error:      {e}" for e in errors]
    out += [f"warning:    {w}" for w in outcome.warnings]
    if not outcome.ingest_success:
        out.append(
            f"next:       fix the source or setting named above (source YAMLs in {s.storage.sources_dir}; "
            f"`allow_empty: true` makes an empty source a warning), then {rerun}"
        )
    elif endpoint := endpoint_advice([e for sh in outcome.shards for e in sh.errors]):
        out.append(f"next:       {endpoint}, then {rerun}")
    elif any(not sh.ok for sh in outcome.shards):
        bad = next(sh.shard for sh in outcome.shards if not sh.ok)
        out.append(
            f"next:       `eagle3 inspect --shard {bad}` shows the failing gate's rows; the report {report} "
            f"lists every failed expectation; fix the cause, then {rerun} (answers the server got wrong: "
            "empty, capped, integrity, are sent again; answers judged on their content are redrawn only with a new "
            "`regen_seed`: docs/troubleshooting.md); nothing is published until every shard passes "
            "(`--allow-partial` publishes the others, naming what it leaves out)"
        )
    elif getattr(outcome, "report_error", None) and getattr(outcome, "data_success", False):
        out.append(
            "next:       the data steps succeeded but the quality report was not written (warning above): "
            "free the disk or fix the report folder, then `eagle3 report` rebuilds it"
        )
    elif not outcome.success:
        out.append(
            "next:       the snapshot was not published (LATEST unchanged); the error above and the report "
            f"{report} say why; fix it, then {rerun}"
        )
    elif outcome.warnings:
        out.append(
            "next:       the warnings above do not stop the pipeline; see the checks in `make ui` "
            "(source YAML `max_reject_rate` sets the reject-rate threshold)"
        )
    return out


def endpoint_advice(errors: list[str]) -> str | None:
    """What to do when a shard failed because of its SGLang endpoint (not its data); None otherwise."""
    auth = [e for e in errors if "AuthError" in e]
    if any("URL's user info" in e for e in auth):
        return (
            "the SGLang endpoint refused the credentials of EAGLE3_SGLANG_URL's user info (user:password@), which "
            "were sent in place of any key: fix them, or drop them from the URL and set SGLANG_API_KEY"
        )
    if any("no credential was sent" in e for e in auth):
        return "the SGLang server wants a key and none was sent: set SGLANG_API_KEY to the server's --api-key"
    if auth:
        return "the SGLang server refused the API key: set SGLANG_API_KEY to the server's --api-key"
    if any("ServingChangedError" in e for e in errors):
        return (
            "an SGLang endpoint's drafter changed under the run (named above): the answers it gave since its drafter "
            "was last confirmed were not stored; rerun to generate them under the drafter it runs now"
        )
    if any(k in e for e in errors for k in ("NoEndpointError", "EndpointRefusedError", "ModelRevisionError")):
        return (
            "the SGLang endpoint named above did not serve the run: fix EAGLE3_SGLANG_URL (`eagle3 check` probes "
            "it; unset, `eagle3 demo` starts its own simulator)"
        )
    return None


def big_shard_settings(s: Settings, n: int) -> Settings:
    """--samples N: `s` changed so that the run's only source is N distinct prompts (devtools/sample_shard.py),
    in one shard. A copy: this process's environment (and so `settings()`) is left as it was; the demo's
    definitions are built from the copy and its runs execute in this process."""
    import dataclasses

    from ..config import PROJECT_ROOT
    from ..devtools.sample_shard import prepare_big_shard

    datasets = PROJECT_ROOT.parent / "shared" / "datasets"
    assets = prepare_big_shard(n, s.storage.work_dir / "big_shard", datasets, s.storage.assets_dir)
    return dataclasses.replace(
        s,
        shards=dataclasses.replace(s.shards, n_shards=1),
        storage=dataclasses.replace(s.storage, assets_dir=assets.resolve()),
    )


def demo_settings(args: argparse.Namespace, s: Settings) -> Settings:
    """The settings the demo's definitions are built from: `s`, changed by --samples (one big shard) and
    --speculative (the example probe set among the sources). Copies: the process's settings stay as they were."""
    if getattr(args, "samples", None) is not None:
        s = big_shard_settings(s, args.samples)
    if getattr(args, "speculative", False):
        from .speculative_demo import speculative_settings

        s = speculative_settings(s)
        if s.urls_configured:
            print(
                "[demo] --speculative: EAGLE3_SGLANG_URL is set, so no simulator is started: the probe set measures "
                "the fleet's own drafter (none if it does not speculate)",
                flush=True,
            )
    return s


def run(args: argparse.Namespace) -> int:
    """`eagle3 demo` with its parsed arguments (app/cli.py declares them); the exit code."""
    if args.output_tokens:
        args.sim_arg += ["--output-tokens-mean", str(args.output_tokens)]
    if getattr(args, "speculative", False):  # a speculating simulator (app/speculative_demo.py)
        from .speculative_demo import SPECULATIVE_SIM_ARGS

        args.sim_arg = [*SPECULATIVE_SIM_ARGS, *args.sim_arg]
    return run_graph_command(args, "demo")


def run_graph_command(args: argparse.Namespace, command: str) -> int:
    """`eagle3 demo` or `eagle3 backfill` (`command`): the graph on the local instance, one at a time per data dir."""
    # One graph run per data dir: a second one would ingest, tokenize and generate into the same shard
    # folders as the first. Refused at once, in one line naming the running one and the lock file.
    s = settings()
    samples = getattr(args, "samples", None)
    if samples is None:  # (--samples builds its assets folder first; _main_locked validates those)
        # a bad shard key, model profile or source YAML fails before anything, the lock file included, is created
        from ..ingest import load_source_specs
        from ..orchestration.partitions import shard_keys
        from ..orchestration.run import check_shard_keys
        from ..profiles import active_profile

        check_shard_keys(args.shards.split(",") if args.shards else None, shard_keys(s.shards.n_shards))
        # a ProfileError names EAGLE3_MODEL's file
        active_profile(s.model.name, s.storage.models_dir, s.model.tokenizer_override)
        load_source_specs(s.storage.sources_dir)
    what = f"eagle3 {command}"
    options = LockOptions(wait_s=0, local_lock_dir=s.storage.work_dir / "locks")
    lock = DataDirLock(s.storage.data_dir, DEMO_LOCK, what=what, options=options)
    try:
        lock.acquire()
    except DataDirLocked as e:
        print(f"[{command}] refused: {e}; wait for it to finish, or set another EAGLE3_DATA_DIR", file=sys.stderr)
        return 1
    try:
        warning = lock.host_only_warning()
        if warning:
            print(f"[{command}] warning: {warning}", file=sys.stderr, flush=True)
        return _main_locked(args, demo_settings(args, s), command)
    finally:
        lock.release()


def _main_locked(args: argparse.Namespace, s: Settings, command: str) -> int:
    """The graph on the settings `s` (validated: cli.py prints a SettingsError as one line each)."""
    shards = args.shards.split(",") if args.shards else None
    from ..orchestration.partitions import shard_keys
    from ..orchestration.run import check_shard_keys

    check_shard_keys(shards, shard_keys(s.shards.n_shards))  # an unknown key fails here, before anything is written
    from ..ingest import load_source_specs

    load_source_specs(s.storage.sources_dir)  # every bad source YAML: one line each, before anything is created
    home = ensure_dagster_home(s.dagster.home)
    from .checkup import dead_endpoint_lines

    for line in dead_endpoint_lines(s):  # named now, not after ingest and tokenize; a cached shard needs no server
        print(f"[{command}] warning: {line.split(' (`eagle3 check')[0]}; a shard with prompts to send fails")
    from ..definitions import build_definitions

    defs = build_definitions(s)  # loads the source YAMLs: a bad one fails here, one line per problem
    outcome = _graph(args, s, command, defs, home, shards)
    if outcome is None:
        return 130
    if outcome.stopped:
        print(stopped_line(outcome, command), file=sys.stderr, flush=True)
        return 130
    print(summarize(outcome, s.storage.data_dir, s, command), flush=True)
    (s.storage.data_dir / f"{command}_summary.json").write_text(
        json.dumps(
            {
                "success": outcome.success,
                "shards": [sh.__dict__ for sh in outcome.shards],
                "ingest_errors": outcome.ingest_errors,
                "not_published": outcome.not_published,
                "left_out": outcome.left_out,
                "publish_errors": outcome.publish_errors,
                "warnings": outcome.warnings,
                "report_error": outcome.report_error,
            },
            indent=2,
        )
    )
    return 0 if outcome.success else 1


def _graph(args: argparse.Namespace, s: Settings, command: str, defs, home: Path, shards: list[str] | None):
    """materialize_graph against the endpoint (the demo's simulator when none is configured), stopping on a
    signal; None when a second signal ended the wait."""
    import dagster as dg

    from ..orchestration.resources import sglang_resource
    from ..orchestration.run import GraphScope, materialize_graph

    with StopOnSignal(command) as stopper:
        try:
            with (
                sglang_endpoint(s, getattr(args, "sim_arg", None)) as url,
                dg.DagsterInstance.from_config(str(home)) as instance,
            ):
                stopper.instance = instance
                # the URL (a configured fleet or the simulator just started) reaches every run as the `sglang`
                # resource, not through the process environment; the demo names a dead endpoint within seconds,
                # a backfill waits for a fleet as long as the nightly does
                wait = interactive_endpoint_wait_s(s) if command == "demo" else s.fleet.wait_for_endpoint_s
                fleet = {"sglang": sglang_resource(s, urls=url, wait_for_endpoint_s=wait)}
                return stopper.run(
                    lambda: materialize_graph(
                        defs,
                        instance,
                        scope=GraphScope(shards=shards, run_publish=True, allow_partial=args.allow_partial),
                        resources=fleet,
                        should_stop=lambda: stopper.requested,
                    )
                )
        except KeyboardInterrupt:
            print(
                f"[{command}] stopped: no further run started; rerun `eagle3 {command}` to resume",
                file=sys.stderr,
                flush=True,
            )
            return None
