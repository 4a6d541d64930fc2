"""Benchmark: per-stage throughput and peak memory at two shard sizes, fixed cost per shard, report cost.

    .venv/bin/python bench/stages.py [--quick] [--small N] [--prompts K] [--min-new-tokens M]

1. Inputs, the way the pipeline makes them: the demo prompts ingested and tokenized with the real
   Kimi-K2.5 tokenizer, then generated through the simulator (a separate process, real HTTP) with
   long outputs (`min_new_tokens`, default 1,500 tokens: reasoning models write long outputs).
   Those real samples are tiled (new sample ids, same ids) to a small and a 10x larger shard.
2. Per stage and size, a FRESH process (`--child`) runs the stage's domain work the way its
   Dagster asset does and reports samples, CPU seconds and VmHWM (peak RSS) from /proc/self/status:
   - generations:      generation_features + the generations gate (GX) + the quarantine write
   - training_samples: as train/inputs.py: the generations in batches of 512 through build_training_shard
                       (parse + round trip through tokenize/fast_bpe.py, ids + loss mask, the sorted
                       table write, row features, stats), the shard summary, the training_samples gate;
                       (the fast BPE twin encodes on one thread: two were measured slower, see
                       tokenize/parse.py batch_encode)
   CPU is time.process_time() of the child: every thread counted. Per stage:
   - steady_samples_per_s_per_core = (N_large - N_small) / (CPU_large - CPU_small) of the stage proper:
     the per-sample rate once the process is up (`train_samples_per_s_per_core`, the headline; target
     >= 1,000). The per-process set-up (imports, tokenizer load, fast BPE build and probe: setup_cpu_s)
     is timed apart first, so its run-to-run noise does not swamp the difference;
   - samples_per_s_per_core_incl_startup = N / CPU at each size, the whole process counted (interpreter,
     imports, tokenizer load, fast BPE build and probe, GX set-up; only the bench's own input tiling left out);
   - startup_cpu_s: the intercept, CPU_small - N_small / steady rate: what every fresh step process pays.
   Nothing is hidden: stage_cpu_s (from the stage's first import) and process_cpu_s are printed too.
3. Fixed cost per shard run: the same rows split into 4 and into 64 shards (16 with --quick); per
   shard the three gates (prompts, generations, training_samples) and their stored results, as the
   gated steps do; then what the quality report does once per run: the gates' Data Docs (pruned, a
   page per new result, the index: gx_docs.build_data_docs) and the report; per_shard_fixed_s = (T64 - T4) / 60,
   wall (and `per_shard_fixed_cpu_s` from CPU time: on a shared machine wall time includes
   waiting for a core). One process, as the in-process executor runs a backfill;
   `gx_first_gate_s` is the first gate of a process (GX import + set-up, what each step of the
   multiprocess executor pays once).
4. report_write_ms_at_1000_results: the quality report (write_report, once per run) with 1,002 stored
   gate results (median of 3, wall, fsyncs included; the CPU figure beside it).

Last stdout line: one JSON object with `train_samples_per_s_per_core`, `max_stage_rss_ratio_10x`,
`per_shard_fixed_s`, `report_write_ms_at_1000_results` (targets >= 1,000; <= 1.5; <= 1.0 s;
<= 1,000 ms) and the figures behind them.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# bench/ holds tokenize.py, which shadows the stdlib module when bench/ is sys.path[0].
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import polars as pl
import pyarrow.parquet as pq

ROOT = Path(_HERE).parent
SHARED_KIMI = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"
EXPECTATIONS = ROOT / "expectations"
TRAIN_BATCH_ROWS = 512  # train/inputs.py GENERATION_BATCH_ROWS: generations parsed and built at a time


def _vmhwm_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _profile() -> Any:
    from eagle3_dagster.profiles import load_profile

    return load_profile("kimi-k2.5", ROOT / "assets" / "models").with_tokenizer(str(SHARED_KIMI))


# --------------------------------------------------------------------------------------------- inputs


def make_inputs(work: Path, n_prompts: int, min_new: int, max_new: int) -> dict[str, Any]:
    """Real prompts, real tokenizer ids, real simulator outputs (long): tokenized/gens/prompts Parquet."""
    from dataclasses import replace

    from eagle3_dagster.generate import GenerationConfig, generate_shard, read_generations
    from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs
    from eagle3_dagster.sim.process import start_simulator
    from eagle3_dagster.tokenize import PromptRenderer, tokenize_prompts

    profile = _profile()
    data = work / "data"
    dirs = []
    for spec in load_source_specs(ROOT / "assets" / "sources"):
        ingest_source(replace(spec, limit=n_prompts), data / "sources" / spec.name, n_shards=1)
        dirs.append(data / "sources" / spec.name)
    combine_sources(dirs, data / "prompts", n_shards=1)
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet").head(n_prompts)
    tokenized, _ = tokenize_prompts(prompts, PromptRenderer(profile), max_new_tokens=max_new)
    with start_simulator(
        extra_args=("--model", "kimi-k2.5", "--tokenizer", str(SHARED_KIMI), "--log-level", "WARNING")
    ) as sim:
        cfg = GenerationConfig.from_profile(profile, (sim.url,), max_new_tokens=max_new, min_new_tokens=min_new)
        generate_shard(tokenized, data / "generations", cfg)
    gens = read_generations(data / "generations")
    prompts.write_parquet(work / "prompts.parquet")
    tokenized.write_parquet(work / "tokenized.parquet")
    gens.write_parquet(work / "gens.parquet")
    lens = gens["output_ids"].list.len()
    return {"real_samples": gens.height, "mean_output_tokens": round(float(lens.mean() or 0), 1)}


def tiled(gens: pl.DataFrame, n: int) -> pl.DataFrame:
    """n rows: the real samples repeated, each copy with its own sample_id (ids unchanged)."""
    reps = -(-n // gens.height)
    out = pl.concat([gens.with_columns(pl.col("sample_id") + f"-{i}") for i in range(reps)]).head(n)
    return out.with_columns(pl.col("rid") + "-" + pl.col("sample_id")) if "rid" in out.columns else out


# --------------------------------------------------------------------------------------------- child


def child(stage: str, inputs: Path, size: int, out_dir: Path) -> dict[str, Any]:
    """One stage on one shard size, in this (fresh) process, the way its Dagster asset runs it."""
    h0 = time.process_time()
    profile = _profile()
    # the shard as the store holds it: a Parquet file (written by the parent, tiled there), read in
    # batches the way iter_generations streams it, so the harness never holds the whole shard
    shard_file = pq.ParquetFile(inputs / f"gens-{size}.parquet")
    n_gens = shard_file.metadata.num_rows
    sample_ids = pl.read_parquet(inputs / f"gens-{size}.parquet", columns=["sample_id"])["sample_id"]

    columns: list[str] | None = None  # the columns the step reads (set with the step's imports below)

    def batches() -> Iterator[pl.DataFrame]:
        for rb in shard_file.iter_batches(batch_size=TRAIN_BATCH_ROWS, columns=columns):
            yield cast(pl.DataFrame, pl.from_arrow(rb))

    tokenized = pl.read_parquet(inputs / "tokenized.parquet")
    prompts = pl.read_parquet(inputs / "prompts.parquet")
    harness_cpu = time.process_time() - h0  # the bench's own input tiling: not the stage, left out below
    from eagle3_dagster.quality import generation_features, run_gate
    from eagle3_dagster.quality.features import available_source_shares, with_training_table_features
    from eagle3_dagster.storage import streamed_features, write_frame_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    gx = {"expectations_dir": EXPECTATIONS, "context_dir": out_dir / "gx", "profile": profile}
    # per-process set-up, paid once by a step process whatever its shard size: the imports, and for the
    # training stage the tokenizer (cached_renderer) and its fast BPE twin. Timed apart, so that the slope
    # between the sizes is not drowned by the start-up's run-to-run noise (seconds on a busy machine).
    s0 = time.process_time()
    import great_expectations  # noqa: F401

    from eagle3_dagster.config import StageSettings, apply_tokenizers_parallelism
    from eagle3_dagster.orchestration.resources import cached_renderer
    from eagle3_dagster.tokenize.fast_bpe import fast_bpe_for
    from eagle3_dagster.train.samples import TRAINING_INPUT_COLUMNS
    from eagle3_dagster.train.shard import SampleSources, ShardOutput, build_training_shard
    from eagle3_dagster.train.summary import summarize

    if stage == "training_samples":
        columns = list(TRAINING_INPUT_COLUMNS)  # as train/inputs.py: only what a training row is built from
        apply_tokenizers_parallelism(StageSettings().tokenizers_parallelism)
        fast_bpe_for(cached_renderer(profile).tokenizer)
    setup_cpu = time.process_time() - s0
    c0, w0 = time.process_time(), time.perf_counter()
    if stage == "generations":
        feats, _, _ = streamed_features(batches(), lambda b: generation_features(b, tokenized, profile))
        gate = run_gate("generations", feats, **gx)
        write_frame_atomic(gate.row_failures, out_dir / "quarantine.parquet")
    elif stage == "training_samples":  # as train/inputs.py: streamed batches -> build_training_shard -> gate
        renderer = cached_renderer(profile)
        built = build_training_shard(
            batches(),
            sample_ids,
            SampleSources(tokenized, prompts, profile, renderer.tokenizer),
            ShardOutput(out_dir / "part-0000.parquet", out_dir / "quarantine.parquet", spill_dir=out_dir),
            max_total_len=65536,
        )
        if built.counts["generations"] != n_gens or built.parse_counts["parsed"] != n_gens:
            raise SystemExit(f"training_samples counted {built.counts} {built.parse_counts} of {n_gens} generations")
        feats = with_training_table_features(built.row_features, available_source_shares(tokenized))
        summarize(built.stats)
        run_gate("training_samples", feats, **gx)
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    end = time.process_time()
    return {
        "stage": stage,
        "size": size,
        "samples": n_gens,
        "setup_cpu_s": round(setup_cpu, 3),  # imports, tokenizer load, fast BPE build + probe
        "cpu_s": round(end - c0, 3),  # the stage itself (its first GX validation's set-up included)
        "process_cpu_s": round(end - harness_cpu, 3),  # the whole process (start-up, imports) but the tiling
        "wall_s": round(time.perf_counter() - w0, 3),
        "vmhwm_mb": round(_vmhwm_kb() / 1024, 1),
    }


def rates(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Steady-state rate (slope between the sizes), the rate with start-up at each size, start-up CPU."""
    slope = (b["samples"] - a["samples"]) / (b["cpu_s"] - a["cpu_s"])
    return {
        "steady_samples_per_s_per_core": round(slope, 1),
        "samples_per_s_per_core_incl_startup": [round(r["samples"] / r["process_cpu_s"], 1) for r in (a, b)],
        "startup_cpu_s": round(a["process_cpu_s"] - a["samples"] / slope, 3),
        "process_cpu_s": [a["process_cpu_s"], b["process_cpu_s"]],
        "stage_cpu_s": [a["cpu_s"], b["cpu_s"]],
        "setup_cpu_s": [a["setup_cpu_s"], b["setup_cpu_s"]],
    }


def run_child(stage: str, inputs: Path, size: int, work: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    shard = inputs / f"gens-{size}.parquet"
    if not shard.exists():  # tiled here, in the parent: the child's peak memory is the stage's own
        tiled(pl.read_parquet(inputs / "gens.parquet"), size).write_parquet(shard, row_group_size=TRAIN_BATCH_ROWS)
    cmd = [sys.executable, __file__, "--child", stage, "--inputs", str(inputs), "--size", str(size)]
    cmd += ["--out", str(work / f"{stage}-{size}-{len(env or {})}")]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"{stage} at {size} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------- fixed cost


def shard_runs(features: dict[str, pl.DataFrame], n_shards: int, work: Path) -> tuple[float, float]:
    """(wall, CPU) seconds for the three gates + stored results of every shard, and what the quality report
    does once per run: the gates' Data Docs (pruned, the new pages, the index) and the report."""
    from eagle3_dagster.config import StageSettings
    from eagle3_dagster.quality import run_gate, write_gate_result
    from eagle3_dagster.quality.gx_docs import build_data_docs
    from eagle3_dagster.report.html import write_report

    profile = _profile()
    data = work / f"fixed-{n_shards}"
    t0, c0 = time.perf_counter(), time.process_time()
    for k in range(n_shards):
        for gate, f in features.items():
            part = f.filter(pl.int_range(pl.len()) % n_shards == k)
            res = run_gate(gate, part, expectations_dir=EXPECTATIONS, context_dir=data / "gx", profile=profile)
            write_gate_result(data, gate, k, res)
    build_data_docs(data / "gx", StageSettings().gx_keep_validations)
    write_report(data, data, n_shards=n_shards, profile=profile.name)
    return time.perf_counter() - t0, time.process_time() - c0


def report_write(work: Path, results: int = 1002) -> dict[str, float]:
    from eagle3_dagster.quality import ExpectationOutcome, GateResult, write_gate_result
    from eagle3_dagster.quality.suites import GATES
    from eagle3_dagster.report.html import write_report

    data = work / "report"
    n = results // len(GATES)
    for k in range(n):
        for g in GATES:
            o = ExpectationOutcome(
                "think-end present", "critical", 0.95, 0.9, 1, k % 9 != 0, "d", key="k", evaluated=10
            )
            # a real Data Docs page per result (every 3rd pruned, as retention does): the report checks them
            page = data / "gx" / "validations" / f"{g}-{k:04d}.html"
            if k % 3:
                page.parent.mkdir(parents=True, exist_ok=True)
                page.write_text("<html></html>")
            res = GateResult(
                g,
                k % 9 != 0,
                [o],
                n_rows=10,
                profile="kimi-k2.5",
                by_source={"gsm8k": [10, 1]},
                data_docs_page=str(page),
            )
            write_gate_result(data, g, k, res)
    write_report(data, data, n_shards=4)  # warm: imports, first reads
    walls, cpus = [], []
    for _ in range(3):
        c0, w0 = time.process_time(), time.perf_counter()
        write_report(data, data, n_shards=4)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {
        "report_write_ms_at_1000_results": round(1000 * statistics.median(walls), 1),
        "report_write_cpu_ms_at_1000_results": round(1000 * statistics.median(cpus), 1),
    }


# --------------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shards of 100 / 1,000, shorter outputs, 4 vs 16 shards")
    ap.add_argument("--small", type=int, default=None, help="small shard size (the large one is 10x)")
    ap.add_argument("--prompts", type=int, default=None, help="real samples generated through the simulator")
    ap.add_argument("--min-new-tokens", type=int, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--inputs", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, Path(args.inputs), args.size, Path(args.out))))
        return 0
    small = args.small or (100 if args.quick else 500)
    n_prompts = args.prompts or (24 if args.quick else 64)
    min_new = args.min_new_tokens if args.min_new_tokens is not None else (800 if args.quick else 1500)
    max_new = max(min_new + 500, 2048)
    result: dict[str, Any] = {"small": small, "large": 10 * small, "cores": os.cpu_count()}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-stages-") as tmp:
        work = Path(tmp)
        result.update(make_inputs(work, n_prompts, min_new, max_new))
        print(f"inputs: {result['real_samples']} real samples, mean {result['mean_output_tokens']} output tokens")
        stages: dict[str, dict[str, Any]] = {}
        variants = [
            ("generations", "generations", None),
            ("training_samples", "training_samples", None),
        ]
        for name, stage, env in variants:
            runs = [run_child(stage, work, size, work, env) for size in (small, 10 * small)]
            a, b = runs
            stages[name] = {
                **rates(a, b),
                "peak_rss_mb": [a["vmhwm_mb"], b["vmhwm_mb"]],
                "rss_ratio_10x": round(b["vmhwm_mb"] / a["vmhwm_mb"], 3),
                "wall_s": [a["wall_s"], b["wall_s"]],
            }
            print(f"{name:17s} {stages[name]}")
        result["stages"] = stages
        result["train_samples_per_s_per_core"] = stages["training_samples"]["steady_samples_per_s_per_core"]
        result["max_stage_rss_ratio_10x"] = max(s["rss_ratio_10x"] for s in stages.values())

        # fixed cost per shard run: the same rows as 4 and as 64 shards
        from eagle3_dagster.quality import generation_features, prompt_features, training_features
        from eagle3_dagster.quality.features import available_source_shares
        from eagle3_dagster.train import build_training_samples

        profile = _profile()
        tokenized = pl.read_parquet(work / "tokenized.parquet")
        gens = tiled(pl.read_parquet(work / "gens.parquet"), 640)
        rows, _ = build_training_samples(gens, tokenized)
        feats = {
            "prompts": prompt_features(tokenized, profile),
            "generations": generation_features(gens, tokenized, profile),
            "training_samples": training_features(
                rows, profile, max_total_len=65536, available_shares=available_source_shares(tokenized)
            ),
        }
        from eagle3_dagster.quality import gx_context

        # the first gate of this process: GX import, context set-up, validation, Data Docs
        result["gx_first_gate_s"] = round(shard_runs({"prompts": feats["prompts"].head(8)}, 1, work / "cold")[0], 3)
        gx_context.clear_cache()
        few, many = (4, 16) if args.quick else (4, 64)
        (w_few, c_few), (w_many, c_many) = shard_runs(feats, few, work), shard_runs(feats, many, work)
        result["shard_runs"] = {
            str(few): [round(w_few, 2), round(c_few, 2)],
            str(many): [round(w_many, 2), round(c_many, 2)],
        }
        result["per_shard_fixed_s"] = round((w_many - w_few) / (many - few), 3)
        result["per_shard_fixed_cpu_s"] = round((c_many - c_few) / (many - few), 3)
        print(
            f"fixed cost: {few} shards {w_few:.2f}s wall / {c_few:.2f}s CPU, {many} shards {w_many:.2f}s / "
            f"{c_many:.2f}s -> {result['per_shard_fixed_s']} s wall, {result['per_shard_fixed_cpu_s']} s CPU per extra shard"
        )
        result.update(report_write(work))
        print(f"report: {result['report_write_ms_at_1000_results']} ms per report at 1,002 results")
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    result["targets"] = {
        "train_samples_per_s_per_core": ">= 1000",
        "max_stage_rss_ratio_10x": "<= 1.5",
        "per_shard_fixed_s": "<= 1.0",
        "report_write_ms_at_1000_results": "<= 1000",
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
