"""`eagle3 demo` and `eagle3 ui`: the whole graph on a local instance, with a simulator if needed.

The simulator is started only when EAGLE3_SGLANG_URL is unset; pointing that variable at a real
SGLang server (or router) runs the very same code against it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from .config import PROJECT_ROOT, settings
from .storage import DataPath, parquet_num_rows

INSTANCE_YAML = """\
# Written by eagle3-dagster: a local instance (SQLite under this folder).
telemetry:
  enabled: false
concurrency:
  pools:
    default_limit: 2   # at most two shard steps talk to the SGLang fleet at once (pool "sglang")
"""


INSTANCE_LOCK = ".eagle3-instance.lock"


def ensure_dagster_home(home: Path | None = None) -> Path:
    """DAGSTER_HOME (default ./.dagster_home) with its dagster.yaml and its storage created, once.

    Under an exclusive file lock in the folder: two first uses at the same time (two `eagle3 demo`
    on a fresh folder) would otherwise both create the SQLite tables and one would crash with
    `table run_tags already exists`. The second waits, then finds everything in place.
    """
    home = Path(home or settings().dagster_home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)  # for Dagster and every process started from here
    with open(home / INSTANCE_LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cfg = home / "dagster.yaml"
        if not cfg.exists():
            tmp = cfg.with_name(f".dagster.yaml.{os.getpid()}.tmp")
            tmp.write_text(INSTANCE_YAML)
            tmp.replace(cfg)
        _create_instance_storage(home)
    return home


def _create_instance_storage(home: Path) -> None:
    """Open the instance once and touch each storage, so their tables exist before any run."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)  # run storage
        instance.fetch_materializations(dg.AssetKey("eagle3_instance_probe"), limit=1)  # event log storage
        instance.all_instigator_state()  # schedule/sensor storage


@contextlib.contextmanager
def sglang_endpoint(extra_sim_args: list[str] | None = None) -> Iterator[str]:
    """Yield the SGLang URL(s) to use: EAGLE3_SGLANG_URL if set, else a simulator we start and stop."""
    s = settings()
    if s.sglang_url_configured:
        yield ",".join(s.sglang_urls)
        return
    from .sim.process import start_simulator

    with start_simulator(extra_args=extra_sim_args or []) as sim:
        os.environ["EAGLE3_SGLANG_URL"] = sim.url
        try:
            print(f"[demo] simulator (eagle3-sim) at {sim.url}, pid {sim.pid}", flush=True)
            yield sim.url
        finally:
            os.environ.pop("EAGLE3_SGLANG_URL", None)


def _rows(folder: DataPath, pattern: str = "part-*.parquet") -> int:
    return sum(parquet_num_rows(f) for f in folder.glob(pattern))


def _fail_word(sh, check: str) -> str:
    return "WARN" if getattr(sh, "failed_checks", {}).get(check) == "WARN" else "FAIL"


def summarize(outcome, data_dir: DataPath) -> str:
    s = settings()
    lines = ["", "=" * 72, "eagle3-dagster demo summary", "=" * 72]
    prompts = data_dir / "prompts" / "prompts.parquet"
    rej = data_dir / "prompts" / "prompt_rejects.parquet"
    lines.append(f"model profile: {s.model}   data dir: {data_dir}")
    for src in (data_dir / "sources").glob("*"):
        c = json.loads((src / "counts.json").read_text()) if (src / "counts.json").exists() else {}
        lines.append(
            f"source {src.name}: read {c.get('read', '?')} = accepted {c.get('accepted', '?')} + rejected "
            f"{c.get('rejected', '?')} + duplicates {c.get('duplicates', '?')}"
            + (f"  (reject rate {c['rejected'] / c['read']:.1%})" if c.get("read") else "")
        )
    lines.append(f"prompts: {_rows(prompts.parent, 'prompts.parquet')} unique, {_rows(rej.parent, 'prompt_rejects.parquet')} rejected")
    header = f"{'shard':>6} {'tokenized':>10} {'generated':>10} {'training':>9}  checks"
    lines += ["", header, "-" * len(header)]
    for sh in outcome.shards:
        k = int(sh.shard)
        tok = _rows(data_dir / "tokenized_prompts" / f"shard={k:04d}")
        gen = _rows(data_dir / "generations" / f"shard={k:04d}")
        trn = _rows(data_dir / "training_samples" / f"shard={k:04d}")
        order = {a: i for i, a in enumerate(("tokenized_prompts", "generations", "training_samples"))}
        ranked = sorted(sh.checks.items(), key=lambda kv: (order.get(kv[0].split(":")[0], 9), kv[0].endswith("_gate"), kv[0]))
        checks = ", ".join(f"{name.split(':')[1]}={'PASS' if ok else _fail_word(sh, name)}" for name, ok in ranked)
        lines.append(f"{sh.shard:>6} {tok:>10} {gen:>10} {trn:>9}  {checks}")
        if sh.skipped_or_failed:
            lines.append(f"{'':>6} not materialized: {', '.join(sh.skipped_or_failed)}")
    docs = None
    for gate_file in (data_dir / "gates").glob("*/shard=*.json"):
        docs = json.loads(gate_file.read_text()).get("data_docs_index") or docs
    snap = outcome.snapshot_version
    from .quality.report_html import default_report_path

    report = default_report_path(s.work_dir)
    lines += [
        "",
        f"tables:     {data_dir}/{{prompts,tokenized_prompts,generations,training_samples}}/",
        f"snapshot:   {data_dir / 'snapshots' / snap if snap else 'not published'}"
        + (" (manifest.json, exports/specforge_prompts.jsonl, exports/conversations.jsonl)" if snap else ""),
        f"data docs:  {docs or 'not built'}",
        f"report:     {report if report.exists() else 'not written'}"
        + ("  (offline HTML: shards x gates, failures, quarantine, snapshots; `eagle3 report` rebuilds it)"
           if report.exists() else ""),
        f"instance:   DAGSTER_HOME={settings().dagster_home}  (see the runs with `make ui`)",
    ]
    lines += problem_lines(outcome, s, report)
    lines.append(f"result:     {'SUCCESS' if outcome.success else 'FAILED'}")
    return "\n".join(lines)


def problem_lines(outcome, s, report: Path) -> list[str]:
    """Errors, warnings and what to do next; empty when everything passed."""
    errors = [f"ingest {e}" for e in outcome.ingest_errors]
    errors += [f"ingest check {c} failed" for c, sev in outcome.ingest_failed_checks.items() if sev == "ERROR"]
    if not outcome.ingest_success and not outcome.ingest_errors:
        errors.append("ingest run failed (see the run in `make ui`)")
    for sh in outcome.shards:
        errors += [f"shard {sh.shard} {e}" for e in sh.errors]
        errors += [f"shard {sh.shard} check {c} failed" for c, sev in sh.failed_checks.items()
                   if sev == "ERROR" and not any(c.split(":")[1] in e for e in sh.errors)]
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
        out.append(f"next:       fix the source or setting named above (source YAMLs in {s.sources_dir}; "
                   "`allow_empty: true` makes an empty source a warning), then rerun `make demo`")
    elif any(not sh.ok for sh in outcome.shards):
        bad = next(sh.shard for sh in outcome.shards if not sh.ok)
        out.append(f"next:       `eagle3 inspect --shard {bad}` shows the failing gate's rows; the report {report} "
                   "lists every failed expectation; fix the cause, then rerun `make demo`")
    elif not outcome.success:
        out.append("next:       the snapshot was not published (LATEST unchanged); the error above and the report "
                   f"{report} say why; fix it, then rerun `make demo`")
    elif outcome.warnings:
        out.append("next:       the warnings above do not stop the pipeline; see the checks in `make ui` "
                   "(source YAML `max_reject_rate` sets the reject-rate threshold)")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eagle3 demo", description=__doc__)
    ap.add_argument("--shards", help="comma-separated shard keys (default: all)")
    ap.add_argument("--sim-arg", action="append", default=[], help="extra argument for eagle3-sim (repeatable)")
    args = ap.parse_args(argv)
    settings()  # every setting validated before any work (cli.py prints a SettingsError as one line each)
    shards = args.shards.split(",") if args.shards else None
    from .defs.run import check_shard_keys

    check_shard_keys(shards)  # an unknown key fails here, listing the valid ones, before anything is written
    from .ingest import load_source_specs

    load_source_specs(settings().sources_dir)  # every bad source YAML: one line each, before anything is created
    ensure_dagster_home()
    import dagster as dg

    from .definitions import defs  # loads the source YAMLs: a bad one fails here, one line per problem

    with sglang_endpoint(args.sim_arg):
        from .defs.run import materialize_graph

        instance = dg.DagsterInstance.get()
        outcome = materialize_graph(defs, instance, shards=shards, run_publish=True)
    print(summarize(outcome, settings().data_dir), flush=True)
    summary_path = settings().data_dir / "demo_summary.json"
    summary_path.write_text(json.dumps({
        "success": outcome.success, "shards": [s.__dict__ for s in outcome.shards],
        "ingest_errors": outcome.ingest_errors, "publish_errors": outcome.publish_errors, "warnings": outcome.warnings,
    }, indent=2))
    return 0 if outcome.success else 1


def ui_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eagle3 ui")
    ap.add_argument("--port", default="3000")
    args = ap.parse_args(argv)
    settings()  # validated before the UI starts
    ensure_dagster_home()
    from .ingest import load_source_specs

    load_source_specs(settings().sources_dir)  # a bad source YAML: one line per problem, not a failed code location
    with sglang_endpoint():
        env = dict(os.environ)
        cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(PROJECT_ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", args.port]
        print(f"[ui] Dagster UI on http://127.0.0.1:{args.port}  (Ctrl-C to stop)", flush=True)
        try:
            return subprocess.call(cmd, env=env, cwd=PROJECT_ROOT)
        except KeyboardInterrupt:
            return 0
