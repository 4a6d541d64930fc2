"""Ingest throughput and memory at 100k and 1M rows (synthetic OpenAI-messages JSONL).

    .venv/bin/python bench/ingest.py [--sizes 100000,1000000] [--keep DIR]

Each size is generated in a temp folder and ingested in a fresh child process, so its peak RSS
(ru_maxrss) is its own. The last line of output is one JSON object:
{"sizes": {"100000": {...}, "1000000": {...}}, "rss_ratio": ..., "rows_per_s_ratio": ...}.
Memory should grow far slower than rows: rows stream through, accepted rows are written in batches,
and deduplication keeps only a 16-byte digest per prompt.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from eagle3_dagster.ingest import SourceSpec, ingest_source
path, out = Path(sys.argv[1]), Path(sys.argv[2])
t0 = time.perf_counter()
counts = ingest_source(SourceSpec(name="bench", path=str(path)), out, n_shards=16)
elapsed = time.perf_counter() - t0
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
print(json.dumps({"counts": counts.as_dict(), "seconds": elapsed, "peak_rss_mb": peak_kb / 1024}))
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def make_jsonl(path: Path, rows: int, seed: int = 0) -> int:
    """Write `rows` lines: ~1% exact repeats, ~0.1% malformed, ~10% tool conversations."""
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "model",
        "prompt",
        "data",
        "token",
        "speculative",
        "draft",
        "verify",
        "accept",
        "length",
        "batch",
    ]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            r = rng.random()
            if r < 0.001:
                f.write('{"messages": [broken\n')
                continue
            n = i if r > 0.01 else rng.randrange(max(i, 1))  # ~1% repeat an earlier prompt
            words_rng = random.Random(n)  # the text depends only on n, so a repeated n is a duplicate
            text = f"question {n}: " + " ".join(words_rng.choice(words) for _ in range(20))
            if n % 10 == 0:
                rec = {
                    "messages": [
                        {"role": "user", "content": f"weather {n}?"},
                        {
                            "role": "assistant",
                            "content": "",
                            "tool_calls": [
                                {
                                    "id": "c",
                                    "type": "function",
                                    "function": {"name": "get_weather", "arguments": json.dumps({"city": f"c{n}"})},
                                }
                            ],
                        },
                        {"role": "tool", "tool_call_id": "c", "content": '{"temp": 20}'},
                        {"role": "assistant", "content": "20 degrees"},
                    ],
                    "tools": TOOLS,
                }
            else:
                rec = {
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": text},
                        {"role": "assistant", "content": "answer " + text[:40]},
                    ]
                }
            f.write(json.dumps(rec) + "\n")
    return path.stat().st_size


def run_size(rows: int, work: Path) -> dict:
    data = work / f"prompts_{rows}.jsonl"
    t0 = time.perf_counter()
    size = make_jsonl(data, rows)
    gen_s = time.perf_counter() - t0
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(data), str(work / f"out_{rows}")], capture_output=True, text=True, check=True
    )
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    c = res["counts"]
    assert c["read"] == c["accepted"] + c["rejected"] + c["duplicates"], c
    data.unlink()
    return {
        "rows": rows,
        "file_mb": round(size / 2**20, 1),
        "generate_s": round(gen_s, 1),
        "ingest_s": round(res["seconds"], 2),
        "rows_per_s": round(rows / res["seconds"]),
        "peak_rss_mb": round(res["peak_rss_mb"], 1),
        "accepted": c["accepted"],
        "rejected": c["rejected"],
        "duplicates": c["duplicates"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--keep", type=Path, default=None, help="work folder to keep (default: a temp dir)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_ingest_") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            results[str(n)] = run_size(n, work)
            print(json.dumps(results[str(n)]), flush=True)
    summary: dict = {"sizes": results}
    if len(sizes) >= 2:
        small, big = results[str(min(sizes))], results[str(max(sizes))]
        summary["rows_ratio"] = max(sizes) / min(sizes)
        summary["rss_ratio"] = round(big["peak_rss_mb"] / small["peak_rss_mb"], 2)
        summary["rows_per_s_ratio"] = round(big["rows_per_s"] / small["rows_per_s"], 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
