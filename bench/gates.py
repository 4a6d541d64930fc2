"""Benchmark: the generations gate (polars features + GX validation) vs the same checks in plain polars.

Builds a synthetic 1M-row generations shard (Kimi ids; small realistic outputs: reasoning,
</think>, answer, <|im_end|>, some tool calls, a few broken rows), then times, in one run:

- features:      generation_features (polars, shared by both paths)
- gx_gate:       run_gate (suite from expectations/generations.json, GX file context, polars row failures)
- polars_checks: the same expectations (same JSON) evaluated in polars only: pass rates + row failures

The gate is timed with the chosen GX result_format (default SUMMARY, what run_gate uses) and
with the other one (BOOLEAN_ONLY). Prints human-readable lines, then a JSON object on the LAST
line with `gx_vs_polars` = (features + gx_gate) / (features + polars_checks), plus the timings.

- gate steps:    the gate as a pipeline step runs it: each of `--steps` gates in a fresh process (as the
                 step processes of the multiprocess executor), one after the other on one shared GX context,
                 on a `--step-rows` shard; `step_gate_s_median` is run_gate's wall time in such a process
                 (the great_expectations import excluded), `step_lock_held_s_median` how long it held the context's
                 file lock; `*_a_minute_apart`: the same with any Data Docs index aged by a minute before each step,
                 as when real shard steps are that far apart.

    .venv/bin/python bench/gates.py [--rows 1000000] [--result-format SUMMARY] [--steps 6]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Running `python bench/gates.py` puts bench/ first on sys.path, where a sibling script named
# tokenize.py would shadow the standard library module: drop it before anything is imported.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np
import polars as pl
import pyarrow as pa

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.profiles import ModelProfile, load_profile
from eagle3_dagster.quality import generation_features, run_gate
from eagle3_dagster.quality.gate import row_stats
from eagle3_dagster.quality.suites import load_suite

SHARED_TOKENIZER = PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"


def synthetic_generations(
    n: int, profile: ModelProfile, name_ids: list[int], arg_ids: list[int], seed: int = 0
) -> pl.DataFrame:
    """n rows shaped like schemas.GENERATIONS (the columns the gate reads), built with numpy."""
    rng = np.random.default_rng(seed)
    t = profile.tool_call_ids
    r_len = rng.integers(8, 64, n)  # reasoning
    a_len = rng.integers(1, 24, n)  # answer
    tool = rng.random(n) < 0.10
    tool_ids = np.array(
        [t.section_begin, t.call_begin, *name_ids, t.argument_begin, *arg_ids, t.call_end, t.section_end],
        dtype=np.int32,
    )
    lens = r_len + 1 + np.where(tool, 0, a_len) + np.where(tool, len(tool_ids), 0) + 1
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    values = rng.integers(100, 150_000, int(offsets[-1])).astype(np.int32)
    starts = offsets[:-1]
    values[starts + r_len] = profile.think_end_id
    values[offsets[1:] - 1] = profile.end_of_turn_id
    for i in np.flatnonzero(tool):  # 10%: a Kimi tool-call section after </think>
        s = starts[i] + r_len[i] + 1
        values[s : s + len(tool_ids)] = tool_ids
    # a few broken rows: 0.5% lost </think>, 0.3% truncated (no end-of-turn, finish_reason=length)
    lost = rng.random(n) < 0.005
    values[starts[lost] + r_len[lost]] = 500
    trunc = rng.random(n) < 0.003
    values[offsets[1:][trunc] - 1] = 501
    ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    finish = np.where(trunc, "length", "stop")
    return pl.DataFrame(
        {
            "sample_id": pl.Series(np.char.add("s", np.arange(n).astype(str))),
            "prompt_id": pl.Series(np.char.add("p", (np.arange(n) // 4).astype(str))),
            "source": pl.Series(np.where(np.arange(n) % 3 == 0, "gsm8k", "ultrachat")),
            "output_ids": pl.Series(ids).cast(pl.List(pl.Int32)),
            "finish_reason": pl.Series(finish),
            "completion_tokens": pl.Series(lens.astype(np.int32)),
        }
    )


def polars_checks(features: pl.DataFrame, expectations_dir: Path) -> dict[str, bool]:
    """The gate done in plain polars from the same suite JSON: pass rates vs mostly, row failures."""
    suite = load_suite("generations", expectations_dir)
    stats, failures = row_stats(features, suite)
    ok = {}
    for s in suite.expectations:
        ev, un = stats[s.key]
        ok[s.key] = (1.0 if ev == 0 else (ev - un) / ev) >= s.mostly
    ok["_rows_failing"] = failures.height  # type: ignore[assignment]
    return ok


# One gate step in a fresh process: read the features, time run_gate alone (as the step's body calls it).
STEP = """
import json, sys, time
from pathlib import Path
import great_expectations  # imported before the clock starts: a per-process cost, not the gate's
import polars as pl
from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.profiles import load_profile
from eagle3_dagster.quality import run_gate
features = pl.read_parquet(sys.argv[1])
profile = load_profile("kimi-k2.5", PROJECT_ROOT / "assets" / "models")
t0 = time.perf_counter()
res = run_gate("generations", features, expectations_dir=PROJECT_ROOT / "expectations",
               context_dir=Path(sys.argv[2]), profile=profile, **json.loads(sys.argv[3]))
gate_s = time.perf_counter() - t0
print(json.dumps({"gate_s": gate_s, "lock_held_s": res.gx_run.lock_held_s if res.gx_run else None}))
"""


# GX's Data Docs index in a file context (gx.get_context(mode="file") puts the context in <context dir>/gx)
DOCS_INDEX = Path("gx") / "uncommitted" / "data_docs" / "local_site" / "index.html"


def gate_steps(features: pl.DataFrame, steps: int, options: dict, *, age_index_s: float = 0.0) -> list[dict]:
    """`steps` gate steps, each in a fresh process, on one GX context (after one untimed set-up step);
    `options`: run_gate's keyword arguments beyond what every step passes. `age_index_s`: before each step
    any Data Docs index is made that much older, as when the shard steps are that far apart."""
    out: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        feats = Path(tmp) / "features.parquet"
        features.write_parquet(feats)
        ctx = Path(tmp) / "gx"
        for i in range(steps + 1):
            index = ctx / DOCS_INDEX
            if age_index_s and index.is_file():
                old = index.stat().st_mtime - age_index_s
                os.utime(index, (old, old))
            done = subprocess.run(
                [sys.executable, "-c", STEP, str(feats), str(ctx), json.dumps(options)],
                check=True,
                capture_output=True,
                text=True,
            )
            if i:  # the first one sets the context up, as the first step of a fresh data dir does
                out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def step_figures(out: list[dict], suffix: str = "") -> dict[str, float]:
    gate = [o["gate_s"] for o in out]
    held = [o["lock_held_s"] or 0.0 for o in out]
    return {
        f"step_gate_s_median{suffix}": round(statistics.median(gate), 3),
        f"step_gate_s_max{suffix}": round(max(gate), 3),
        f"step_lock_held_s_median{suffix}": round(statistics.median(held), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--result-format", default="SUMMARY")
    ap.add_argument("--steps", type=int, default=6, help="gate steps timed in fresh processes (0: none)")
    ap.add_argument("--step-rows", type=int, default=20_000, help="rows of the shard each gate step judges")
    args = ap.parse_args()
    profile = load_profile("kimi-k2.5", PROJECT_ROOT / "assets" / "models")
    tokenizer = None
    name_ids, arg_ids = [1000, 1001], [16, 123, 9415]  # stand-ins when ../shared is absent
    if SHARED_TOKENIZER.exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(SHARED_TOKENIZER))
        name_ids = tokenizer.encode("functions.get_weather:0", add_special_tokens=False)
        arg_ids = tokenizer.encode('{"city": "Paris"}', add_special_tokens=False)
    expectations_dir = PROJECT_ROOT / "expectations"

    t0 = time.perf_counter()
    gens = synthetic_generations(args.rows, profile, name_ids, arg_ids)
    t_build = time.perf_counter() - t0
    n_ids = int(gens["output_ids"].list.len().sum())
    print(f"synthetic shard: {gens.height} rows, {n_ids} output ids ({n_ids / gens.height:.1f}/row), {t_build:.2f}s")

    # Warm-up on a small slice: imports (GX takes seconds to import) and context creation are
    # one-off costs of a process, not of a gate.
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp) / "gx"
        small = generation_features(gens.head(1000), None, profile, tokenizer)
        run_gate(
            "generations",
            small,
            expectations_dir=expectations_dir,
            context_dir=ctx,
            profile=profile,
            result_format=args.result_format,
        )
        polars_checks(small, expectations_dir)

        t0 = time.perf_counter()
        feats = generation_features(gens, None, profile, tokenizer)
        t_feat = time.perf_counter() - t0
        print(f"features: {t_feat:.2f}s  ({feats.width} columns)")

        timings: dict[str, float] = {}
        results = {}
        for fmt in (args.result_format, "BOOLEAN_ONLY" if args.result_format != "BOOLEAN_ONLY" else "SUMMARY"):
            t0 = time.perf_counter()
            results[fmt] = run_gate(
                "generations",
                feats,
                expectations_dir=expectations_dir,
                context_dir=ctx,
                profile=profile,
                result_format=fmt,
            )
            timings[fmt] = time.perf_counter() - t0
            print(
                f"gx gate ({fmt}): {timings[fmt]:.2f}s  success={results[fmt].success} "
                f"quarantined={results[fmt].row_failures.height}"
            )
        res, t_gx = results[args.result_format], timings[args.result_format]

        t0 = time.perf_counter()
        pc = polars_checks(feats, expectations_dir)
        t_pl = time.perf_counter() - t0
        print(f"polars checks: {t_pl:.2f}s  quarantined={pc['_rows_failing']}")

    steps: dict[str, float] = {}
    if args.steps > 0:
        step_feats = generation_features(gens.head(args.step_rows), None, profile, tokenizer)
        # as orchestration/gate_step.py calls it; then as if the steps were a minute apart (a real shard's
        # generation takes longer than that): a Data Docs index older than the gates' refresh interval
        for suffix, age in (("", 0.0), ("_a_minute_apart", 60.0)):
            figures = step_figures(gate_steps(step_feats, args.steps, {}, age_index_s=age), suffix)
            steps.update(figures)
            print(
                f"gate steps{suffix.replace('_', ' ')} ({args.steps} fresh processes, {step_feats.height} rows, as a "
                f"pipeline step calls run_gate): median {figures[f'step_gate_s_median{suffix}']:.2f}s, max "
                f"{figures[f'step_gate_s_max{suffix}']:.2f}s, context lock held "
                f"{figures[f'step_lock_held_s_median{suffix}']:.2f}s (median)"
            )

    agree = all(
        all(pc[o.key] == o.success for o in r.outcomes) and pc["_rows_failing"] == r.row_failures.height
        for r in results.values()
    )
    out = {
        "rows": gens.height,
        "output_ids": n_ids,
        "expectations": len(res.outcomes),
        "result_format": args.result_format,
        "features_s": round(t_feat, 3),
        "gx_gate_s": round(t_gx, 3),
        "polars_checks_s": round(t_pl, 3),
        "gx_vs_polars": round((t_feat + t_gx) / (t_feat + t_pl), 3),
        **{f"gx_gate_{fmt.lower()}_s": round(t, 3) for fmt, t in timings.items()},
        **{f"gx_vs_polars_{fmt.lower()}": round((t_feat + t) / (t_feat + t_pl), 3) for fmt, t in timings.items()},
        "gx_only_vs_polars_checks": round(t_gx / t_pl, 1),
        **steps,
        "results_agree": agree,
        "tool_args_checked": tokenizer is not None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
