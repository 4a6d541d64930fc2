"""Round-trip rate: parse every generation from its ids and render the parsed turn back to ids.

    .venv/bin/python bench/roundtrip.py [--limit-per-source N] [--max-new-tokens M]

Ingests the demo prompts and every shared dataset (examples/shared-sources), tokenizes them with
the Kimi-K2.5 profile, generates through the simulator (a separate process, real HTTP), then runs
the training stage's parse + round trip on each sample. Prints per-source and overall rates; the
last line is one JSON object with `round_trip_rate` (target >= 0.99).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# bench/ holds tokenize.py, which shadows the stdlib module when bench/ is sys.path[0].
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import polars as pl

ROOT = Path(_HERE).parent
SHARED_KIMI = ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-per-source", type=int, default=300)
    ap.add_argument("--max-new-tokens", type=int, default=4096)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("EAGLE3_TOKENIZER", str(SHARED_KIMI))

    from eagle3_dagster.generate import GenerationConfig, generate_shard, read_generations
    from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs
    from eagle3_dagster.profiles import load_profile
    from eagle3_dagster.sim.process import start_simulator
    from eagle3_dagster.tokenize import PromptRenderer, tokenize_prompts
    from eagle3_dagster.train.conversations import parse_generations

    profile = load_profile("kimi-k2.5", ROOT / "assets" / "models").with_tokenizer(os.environ["EAGLE3_TOKENIZER"])
    specs = load_source_specs(ROOT / "assets" / "sources") + load_source_specs(ROOT / "examples" / "shared-sources")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        dirs = []
        for spec in specs:
            spec = replace(spec, limit=args.limit_per_source)
            ingest_source(spec, data / "sources" / spec.name, n_shards=1)
            dirs.append(data / "sources" / spec.name)
        combine_sources(dirs, data / "prompts", n_shards=1)
        prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
        renderer = PromptRenderer(profile)
        tokenized, rejects = tokenize_prompts(prompts, renderer, max_new_tokens=args.max_new_tokens)
        with start_simulator() as sim:
            cfg = GenerationConfig.from_profile(profile, (sim.url,), max_new_tokens=args.max_new_tokens)
            generate_shard(tokenized, data / "generations", cfg)
        gens = read_generations(data / "generations")
        gens = gens.filter(pl.col("finish_reason") == "stop")
        ok, failures, counts = parse_generations(gens, prompts, profile, renderer.tokenizer)
    by_source = {}
    failed_ids = set(failures["row_id"].to_list())
    # a failed round trip no longer removes a row: it is kept and flagged text_exact = false
    rt_failed = set(ok.filter(~pl.col("text_exact"))["sample_id"].to_list())
    for src, sids in gens.group_by("source").agg(pl.col("sample_id")).iter_rows():
        n = len(sids)
        by_source[src] = {
            "samples": n,
            "round_trip_ok": n - sum(1 for s in sids if s in rt_failed),
            "parse_ok": n - sum(1 for s in sids if s in failed_ids),
        }
        print(f"{src:32s} samples {n:5d}  round trip {by_source[src]['round_trip_ok'] / n:.4f}")
    rate = counts["round_trip_ok"] / counts["parsed"] if counts["parsed"] else 0.0
    result = {
        "round_trip_rate": round(rate, 5),
        "samples": counts["parsed"],
        "round_trip_ok": counts["round_trip_ok"],
        "parse_failures": counts["parse_failures"],
        "text_exact_false": counts["text_exact_false"],
        "tokenize_rejects": rejects.height,
        "by_source": by_source,
        "seconds": round(time.perf_counter() - t0, 1),
        "note": "outputs come from the simulator (real tokenizer, synthetic text); rerun against a real server for the model's own rate",
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
