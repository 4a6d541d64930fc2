"""Peak memory of every pipeline step and of the whole `eagle3 demo`, at two shard sizes, long outputs.

    .venv/bin/python bench/publish_memory.py [--small 2000] [--large 100000] [--output-tokens 1500] [--demo-only]

For each size N: `eagle3 demo --samples N --output-tokens T` (one shard of N distinct prompts from
../shared/datasets, repeated with a variant number when N exceeds the distinct prompts there: see
eagle3_dagster/devtools/sample_shard.py; a real simulator process with ~T-token outputs; a real Dagster instance)
runs the whole pipeline; `demo` is the peak RSS of its largest process (ru_maxrss of the children of a
wrapper process that only runs the demo: the demo process itself and every step process it waits for).
Then each step runs again in a FRESH process on that data, its output removed first so it does all its
work again, and its peak RSS (VmHWM of that process) is recorded:

    tokenize   tokenized_prompts (chat template, encode, the prompts gate)
    generate   generations (every request sent again to the simulator, the generations gate)
    train      training_samples (parse, round trip, ids + loss mask, the training_samples gate)
    gates      `eagle3 report`: the run-wide gate work, GX Data Docs index refresh + the quality report
               from every stored gate result (the shard gates themselves run inside the three steps above)
    publish    training_dataset (snapshot: shard copy, content identity, summary, publish and drift gates,
               the three exports; then the report), with data/snapshots removed first

`--demo-only` measures the whole demo alone (no per-step reruns: a quick check of the demo's figure).
`--keep DIR` runs in DIR (data-N/, home-N/ per size) and leaves it there; `--steps-only --keep DIR` skips the
demos and measures the steps on the data an earlier `--keep DIR` run's demos left (the demo takes the longest
at 100,000 prompts: measure it once, the steps again as often as needed).

Steps run in the order below: each reads what the demo wrote, and `generate`, the longest (every request
sent again), runs last so that the others' figures are there first.

Ratio = large / small per step and for the demo; target <= 1.5. The last stdout line is one JSON object.
The simulator is shared by both sizes (started once); step processes read the settings the demo ran
with (its own assets folder, EAGLE3_N_SHARDS=1).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# bench/ holds tokenize.py, which shadows the stdlib module when bench/ is sys.path[0].
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import contextlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(_HERE).parent
# step -> (the asset it materializes or None, the output removed first, relative to the data dir)
STEPS: dict[str, tuple[str | None, str | None]] = {
    "tokenize": ("tokenized_prompts", "tokenized_prompts/shard=0000"),
    "train": ("training_samples", "training_samples/shard=0000"),
    "gates": (None, None),  # the report is rewritten in place
    "publish": ("training_dataset", "snapshots"),
    "generate": ("generations", "generations/shard=0000"),  # last: the longest
}

_HWM = 'next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))'

_ASSET_CHILD = (
    r"""
import json, sys, time
import dagster as dg
from eagle3_dagster.definitions import defs
asset, partition = sys.argv[1], (sys.argv[2] or None)
t0 = time.perf_counter()
with dg.DagsterInstance.get() as instance:
    job = defs.resolve_implicit_global_asset_job_def()
    r = job.execute_in_process(partition_key=partition, asset_selection=[dg.AssetKey(asset)], instance=instance,
                               raise_on_error=False)
    meta = {}
    ev = instance.get_latest_materialization_event(dg.AssetKey(asset))
    if ev is not None:
        meta = {k: v.value for k, v in ev.asset_materialization.metadata.items()
                if k in ("samples", "stored_samples", "succeeded", "rows", "version") and isinstance(v.value, (int, str))}
hwm = """
    + _HWM
    + r"""
print(json.dumps({"success": r.success, "maxrss_kb": hwm, "wall_s": time.perf_counter() - t0, **meta}))
"""
)

_REPORT_CHILD = (
    r"""
import json, time
from eagle3_dagster.app.cli import main
t0 = time.perf_counter()
rc = main(["report"])
hwm = """
    + _HWM
    + r"""
print(json.dumps({"success": rc == 0, "maxrss_kb": hwm, "wall_s": time.perf_counter() - t0}))
"""
)

_DEMO_WRAPPER = r"""
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
r = subprocess.run([sys.executable, "-m", "eagle3_dagster.app.cli", "demo", *sys.argv[1:]], capture_output=True, text=True)
if r.returncode:
    print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
print(json.dumps({"demo_exit": r.returncode, "maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "wall_s": time.perf_counter() - t0}))
"""


def _child(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_size(n: int, tokens: int, url: str, tmp: Path, *, steps: bool = True, demo: bool = True) -> dict[str, Any]:
    data = tmp / f"data-{n}"
    env = {
        **os.environ,
        "EAGLE3_DATA_DIR": str(data),
        "DAGSTER_HOME": str(tmp / f"home-{n}"),
        "EAGLE3_SGLANG_URL": url,
        "HF_HUB_OFFLINE": "1",
    }
    env.setdefault("EAGLE3_TOKENIZER", str(ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"))
    out: dict[str, Any] = {}
    if demo:
        out["demo"] = _child(_DEMO_WRAPPER, ["--samples", str(n), "--output-tokens", str(tokens)], env)
        print(json.dumps({"n": n, "demo": out["demo"]}), file=sys.stderr, flush=True)
        if out["demo"]["demo_exit"]:
            raise RuntimeError(f"eagle3 demo --samples {n} exited {out['demo']['demo_exit']}")
    elif not (data / "big_shard" / "assets").is_dir() or not (data / "generations" / "shard=0000").is_dir():
        raise SystemExit(f"--steps-only: no finished demo of {n} prompts in {data} (run with --keep first)")
    if not steps:
        return out
    # the settings the demo ran with (--samples: its own assets folder, one shard)
    env["EAGLE3_ASSETS_DIR"] = str(data / "big_shard" / "assets")
    env["EAGLE3_N_SHARDS"] = "1"
    for step, (asset, output) in STEPS.items():
        if output is not None:  # else the step would find its work done
            shutil.rmtree(data / output, ignore_errors=True)
        if asset is None:
            d = _child(_REPORT_CHILD, [], env)
        else:
            d = _child(_ASSET_CHILD, [asset, "" if asset == "training_dataset" else "0000"], env)
        out[step] = d
        print(json.dumps({"n": n, step: d}), file=sys.stderr, flush=True)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--large", type=int, default=100000)
    ap.add_argument("--output-tokens", type=int, default=1500)
    ap.add_argument("--demo-only", action="store_true", help="the whole demo's peak only, no per-step reruns")
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary folder)")
    ap.add_argument("--steps-only", action="store_true", help="with --keep: the steps on an earlier run's demos")
    args = ap.parse_args(argv)
    if args.steps_only and (args.demo_only or args.keep is None):
        ap.error("--steps-only needs --keep DIR (an earlier run's folder) and not --demo-only")
    from eagle3_dagster.sim.process import start_simulator

    tokenizer = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"
    result: dict[str, Any] = {"cpus": os.cpu_count(), "output_tokens": args.output_tokens, "target_ratio": 1.5}
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    with (
        contextlib.nullcontext(str(args.keep))
        if args.keep is not None
        else tempfile.TemporaryDirectory(prefix="bench-publish-memory-") as d,
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
        res = {
            n: run_size(n, args.output_tokens, sim.url, tmp, steps=not args.demo_only, demo=not args.steps_only)
            for n in (args.small, args.large)
        }
    steps = () if args.demo_only else tuple(STEPS)
    measured = steps if args.steps_only else ("demo", *steps)
    ratio_key = f"rss_ratio_{args.large}_over_{args.small}"
    for step in measured:
        small, large = res[args.small][step], res[args.large][step]
        result[step] = {
            "rss_mb": {
                str(args.small): round(small["maxrss_kb"] / 1024, 1),
                str(args.large): round(large["maxrss_kb"] / 1024, 1),
            },
            ratio_key: round(large["maxrss_kb"] / small["maxrss_kb"], 3),
            "wall_s": {str(args.small): round(small["wall_s"], 1), str(args.large): round(large["wall_s"], 1)},
            "success": bool(small.get("success", not small.get("demo_exit")))
            and bool(large.get("success", not large.get("demo_exit"))),
        }
    result["max_step_rss_ratio"] = max((result[s][ratio_key] for s in steps), default=None)
    result["demo_rss_ratio"] = None if args.steps_only else result["demo"][ratio_key]
    result["within_target"] = (result["max_step_rss_ratio"] or 0) <= 1.5 and (result["demo_rss_ratio"] or 0) <= 1.5
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
