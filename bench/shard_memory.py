"""Peak memory of the shard steps at two shard sizes 10x apart, long outputs, through `eagle3 demo`.

    .venv/bin/python bench/shard_memory.py [--small 2000] [--large 20000] [--output-tokens 1600]

For each size: `eagle3 demo --samples N --output-tokens T` (one shard of N distinct prompts from
../shared/datasets, a real simulator process with ~T-token outputs, a real Dagster instance) builds
the shard; then each shard step runs again in a FRESH process on that data (`generations` with its
shard folder removed first, so it generates everything again; then `training_samples`), and its peak
RSS (VmHWM of that process) is recorded. Ratio = large / small per step; target <= 1.5.
The last stdout line is one JSON object.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(_HERE).parent
STAGES = ("generations", "training_samples")

_STAGE_CHILD = r"""
import json, sys, time
import dagster as dg
from eagle3_dagster.definitions import defs
stage = sys.argv[1]
t0 = time.perf_counter()
with dg.DagsterInstance.get() as instance:
    job = defs.resolve_implicit_global_asset_job_def()
    r = job.execute_in_process(partition_key="0000", asset_selection=[dg.AssetKey(stage)], instance=instance,
                               raise_on_error=False)
    meta = {}
    ev = instance.get_latest_materialization_event(dg.AssetKey(stage))
    if ev is not None:
        meta = {k: v.value for k, v in ev.asset_materialization.metadata.items()
                if k in ("samples", "stored_samples", "succeeded", "skipped_cached")}
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"success": r.success, "maxrss_kb": hwm, "wall_s": time.perf_counter() - t0, **meta}))
"""


def run_size(n: int, tokens: int, url: str, tmp: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "EAGLE3_DATA_DIR": str(tmp / f"data-{n}"),
        "DAGSTER_HOME": str(tmp / f"home-{n}"),
        "EAGLE3_SGLANG_URL": url,
        "HF_HUB_OFFLINE": "1",
    }
    env.setdefault("EAGLE3_TOKENIZER", str(ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"))
    t0 = time.perf_counter()
    demo = subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.cli", "demo", "--samples", str(n), "--output-tokens", str(tokens)],
        env=env,
        capture_output=True,
        text=True,
    )
    out: dict[str, Any] = {"demo_wall_s": round(time.perf_counter() - t0, 1), "demo_exit": demo.returncode}
    if demo.returncode:
        print(demo.stdout[-3000:], demo.stderr[-3000:], file=sys.stderr)
    # the settings the demo ran with (--samples: its own assets folder, one shard)
    env["EAGLE3_ASSETS_DIR"] = str(tmp / f"data-{n}" / "big_shard" / "assets")
    env["EAGLE3_N_SHARDS"] = "1"
    for stage in STAGES:
        if stage == "generations":
            shutil.rmtree(tmp / f"data-{n}" / "generations" / "shard=0000", ignore_errors=True)
        r = subprocess.run([sys.executable, "-c", _STAGE_CHILD, stage], env=env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(r.stderr[-3000:])
        d = json.loads(r.stdout.strip().splitlines()[-1])
        out[stage] = d
        print(json.dumps({"n": n, stage: d}), file=sys.stderr, flush=True)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--large", type=int, default=20000)
    ap.add_argument("--output-tokens", type=int, default=1600)
    args = ap.parse_args(argv)
    from eagle3_dagster.sim.process import start_simulator

    tokenizer = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"
    result: dict[str, Any] = {"cpus": os.cpu_count(), "output_tokens": args.output_tokens}
    with (
        tempfile.TemporaryDirectory(prefix="bench-shard-memory-") as d,
        start_simulator(
            extra_args=(
                "--model",
                "kimi-k2.5",
                "--tokenizer",
                str(tokenizer),
                "--log-level",
                "WARNING",
                "--max-running-requests",
                "256",
                "--output-tokens-mean",
                str(args.output_tokens),
            )
        ) as sim,
    ):
        tmp = Path(d)
        res = {n: run_size(n, args.output_tokens, sim.url, tmp) for n in (args.small, args.large)}
    for stage in STAGES:
        small, large = res[args.small][stage], res[args.large][stage]
        result[f"{stage}_rss_mb"] = {
            str(args.small): round(small["maxrss_kb"] / 1024, 1),
            str(args.large): round(large["maxrss_kb"] / 1024, 1),
        }
        result[f"{stage}_rss_ratio_10x"] = round(large["maxrss_kb"] / small["maxrss_kb"], 3)
        result[f"{stage}_wall_s"] = {
            str(args.small): round(small["wall_s"], 1),
            str(args.large): round(large["wall_s"], 1),
        }
        result[f"{stage}_success"] = bool(small["success"] and large["success"])
    result["max_stage_rss_ratio_10x"] = max(result[f"{s}_rss_ratio_10x"] for s in STAGES)
    result["demo"] = {str(n): {k: v for k, v in r.items() if k.startswith("demo")} for n, r in res.items()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
