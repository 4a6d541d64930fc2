"""`eagle3 demo` and `eagle3 ui`: the whole graph on a local instance, with a simulator if needed.

The simulator is started only when EAGLE3_SGLANG_URL is unset; pointing that variable at a real
SGLang server (or router) runs the very same code against it.
"""

from __future__ import annotations

import argparse
import contextlib
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


def ensure_dagster_home() -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(INSTANCE_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


@contextlib.contextmanager
def sglang_endpoint(extra_sim_args: list[str] | None = None) -> Iterator[str]:
    """Yield the SGLang URL(s) to use: EAGLE3_SGLANG_URL if set, else a simulator we start and stop."""
    if os.environ.get("EAGLE3_SGLANG_URL"):
        yield os.environ["EAGLE3_SGLANG_URL"]
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
        checks = ", ".join(f"{name.split(':')[1]}={'PASS' if ok else 'FAIL'}" for name, ok in ranked)
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
        f"instance:   DAGSTER_HOME={os.environ.get('DAGSTER_HOME')}  (see the runs with `make ui`)",
        f"result:     {'SUCCESS' if outcome.success else 'FAILED'}",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eagle3 demo", description=__doc__)
    ap.add_argument("--shards", help="comma-separated shard keys (default: all)")
    ap.add_argument("--sim-arg", action="append", default=[], help="extra argument for eagle3-sim (repeatable)")
    args = ap.parse_args(argv)
    ensure_dagster_home()
    import dagster as dg

    with sglang_endpoint(args.sim_arg):
        from .definitions import defs
        from .defs.run import materialize_graph

        instance = dg.DagsterInstance.get()
        shards = args.shards.split(",") if args.shards else None
        outcome = materialize_graph(defs, instance, shards=shards, run_publish=True)
    print(summarize(outcome, settings().data_dir), flush=True)
    summary_path = settings().data_dir / "demo_summary.json"
    summary_path.write_text(json.dumps({"success": outcome.success, "shards": [s.__dict__ for s in outcome.shards]}, indent=2))
    return 0 if outcome.success else 1


def ui_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eagle3 ui")
    ap.add_argument("--port", default="3000")
    args = ap.parse_args(argv)
    ensure_dagster_home()
    with sglang_endpoint():
        env = dict(os.environ)
        cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(PROJECT_ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", args.port]
        print(f"[ui] Dagster UI on http://127.0.0.1:{args.port}  (Ctrl-C to stop)", flush=True)
        try:
            return subprocess.call(cmd, env=env, cwd=PROJECT_ROOT)
        except KeyboardInterrupt:
            return 0
