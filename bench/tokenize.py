"""Tokenize-stage throughput on the shared prompt datasets, as ratios measured in one run.

    .venv/bin/python bench/tokenize.py [--model kimi-k2.5] [--tokenizer DIR] [--repeat N]

Prompts come from the shared datasets through the project's ingest stage (source specs in
examples/shared-sources). Three timings on the same rows:
  pipeline    tokenize_prompts(): JSON parse + template render + one batched encode + frames
              (the function the Dagster asset calls; native template rendering when it applies)
  raw encode  tokenizer(texts, add_special_tokens=False) on the same prompt texts, rendered up
              front through the Jinja template (apply_chat_template), not timed
  naive loop  per row json.loads + apply_chat_template(tokenize=True, return_dict=False)
Each is timed --rounds times, interleaved; ratios are medians of per-round ratios (the machine is shared).
The last stdout line is one JSON object: vs_raw_encode (target >= 0.7), vs_naive_loop, rows, seconds.
"""

from __future__ import annotations

import os
import sys

# This file is named like the stdlib `tokenize` module and its folder is sys.path[0] when run as a
# script; drop that entry before anything imports `tokenize` (inspect, linecache, numpy do).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs
from eagle3_dagster.profiles import load_profile
from eagle3_dagster.tokenize import PromptRenderer, compute_tools_ts_str, tokenize_prompts

SOURCES_DIR = PROJECT_ROOT / "examples" / "shared-sources"  # source specs for the ../shared datasets
SHARED_TOKENIZERS = PROJECT_ROOT.parent / "shared" / "tokenizers"


def ingest_shared_prompts(sources_dir: Path, repeat: int) -> pl.DataFrame:
    """PROMPTS rows from the shared datasets through the project's own ingest stage.

    `repeat` > 1 appends copies with distinct prompt_ids, for steadier timings on more rows.
    """
    specs = load_source_specs(sources_dir)
    with tempfile.TemporaryDirectory() as tmp:
        source_dirs = []
        for spec in specs:
            ingest_source(spec, Path(tmp) / spec.name, n_shards=1)
            source_dirs.append(Path(tmp) / spec.name)
        combine_sources(source_dirs, Path(tmp) / "combined", n_shards=1)
        prompts = pl.read_parquet(Path(tmp) / "combined" / "prompts.parquet")
    copies = [prompts] + [
        prompts.with_columns((pl.col("prompt_id") + f"-copy{i}").alias("prompt_id")) for i in range(1, repeat)
    ]
    return pl.concat(copies)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=settings().model.name, help="profile name or YAML path (default EAGLE3_MODEL)"
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="default: EAGLE3_TOKENIZER, else ../shared/tokenizers/<profile name> when present",
    )
    parser.add_argument("--sources", type=Path, default=SOURCES_DIR, help="folder of source specs to ingest")
    parser.add_argument("--repeat", type=int, default=1, help="copies of the dataset rows")
    parser.add_argument(
        "--rounds", type=int, default=7, help="interleaved timing rounds; ratios are medians of per-round ratios"
    )
    args = parser.parse_args(argv)

    profile = load_profile(args.model, settings().storage.models_dir)
    shared_tokenizer = SHARED_TOKENIZERS / profile.name
    tokenizer = (
        args.tokenizer
        or settings().model.tokenizer_override
        or (str(shared_tokenizer) if shared_tokenizer.is_dir() else None)
    )
    if tokenizer:
        profile = profile.with_tokenizer(tokenizer)
    renderer = PromptRenderer(profile)
    tok = renderer.tokenizer
    jinja_renderer = PromptRenderer(profile, tok, native_templates=False)  # baseline texts: the template itself
    max_new = profile.sampling.max_new_tokens
    frame = ingest_shared_prompts(args.sources, args.repeat)
    rows = frame.to_dicts()
    print(f"{frame.height} prompts, profile {profile.name}, tokenizer {profile.tokenizer}", file=sys.stderr)

    # warm-up (template compile, tokenizer caches) outside the timings
    tokenize_prompts(frame.head(64), renderer, max_new_tokens=max_new)
    texts = [
        jinja_renderer.render_text(json.loads(r["messages"]), json.loads(r["tools"]) if r["tools"] else None)
        for r in rows
    ]

    def run_pipeline():
        return tokenize_prompts(frame, renderer, max_new_tokens=max_new)

    def run_raw_encode():
        return tok(texts, add_special_tokens=False)["input_ids"]

    def run_naive_loop():
        naive_ids = []
        for r in rows:
            messages = json.loads(r["messages"])
            tools = json.loads(r["tools"]) if r["tools"] else None
            kwargs = dict(profile.template_kwargs)
            if profile.template_family == "kimi_ts" and tools:
                tools, ts, _ = compute_tools_ts_str(tools)
                if ts:
                    kwargs["tools_ts_str"] = ts
            naive_ids.append(
                list(
                    tok.apply_chat_template(
                        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
                    )
                )
            )
        return naive_ids

    # The machine is shared: interleave the three, and take each ratio per round (adjacent runs see
    # similar load), reporting the median over rounds; best-of-rounds ratios are printed too.
    timings: dict[str, list[float]] = {"pipeline": [], "raw": [], "naive": []}
    cpu: dict[str, list[float]] = {"pipeline": [], "raw": [], "naive": []}  # CPU seconds, all threads
    outputs: dict[str, Any] = {}
    for _ in range(args.rounds):
        for name, fn in (("pipeline", run_pipeline), ("raw", run_raw_encode), ("naive", run_naive_loop)):
            t0, c0 = time.perf_counter(), time.process_time()
            outputs[name] = fn()
            timings[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    tokenized, rejects = outputs["pipeline"]
    raw_ids, naive_ids = outputs["raw"], outputs["naive"]
    pipeline_s, raw_s, naive_s = (min(timings[k]) for k in ("pipeline", "raw", "naive"))

    # correctness: the pipeline's ids equal both references on every row it kept
    by_id = dict(zip(frame["prompt_id"], range(frame.height)))
    mismatches = sum(
        1
        for pid, ids in zip(tokenized["prompt_id"], tokenized["input_ids"])
        if ids.to_list() != raw_ids[by_id[pid]] or ids.to_list() != naive_ids[by_id[pid]]
    )
    tokens = int(tokenized["prompt_len"].sum())
    n = frame.height
    result = {
        "rows": n,
        "tokenized": tokenized.height,
        "native_template": renderer.native_template,
        "rejected": rejects.height,
        "prompt_tokens": tokens,
        "id_mismatches": mismatches,
        "seconds": round(pipeline_s, 4),
        "raw_encode_seconds": round(raw_s, 4),
        "naive_loop_seconds": round(naive_s, 4),
        "pipeline_rows_per_s": round(n / pipeline_s, 1),
        "pipeline_tokens_per_s": round(tokens / pipeline_s, 1),
        "rounds": args.rounds,
        "pipeline_seconds_all": [round(x, 3) for x in timings["pipeline"]],
        "raw_encode_seconds_all": [round(x, 3) for x in timings["raw"]],
        "vs_raw_encode": round(statistics.median(r / p for r, p in zip(timings["raw"], timings["pipeline"])), 3),
        "vs_naive_loop": round(statistics.median(n / p for n, p in zip(timings["naive"], timings["pipeline"])), 3),
        "vs_raw_encode_best_rounds": round(raw_s / pipeline_s, 3),
        # CPU-time ratio: less sensitive to other processes on a shared machine (work, not wall time)
        "vs_raw_encode_cpu": round(min(cpu["raw"]) / min(cpu["pipeline"]), 3),
        "vs_naive_loop_best_rounds": round(naive_s / pipeline_s, 3),
    }
    print(json.dumps(result))
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
