"""Ingest throughput and memory at 100k and 1M rows (synthetic OpenAI-messages JSONL), and what one shard's
read of the prompts table costs.

    .venv/bin/python bench/ingest.py [--sizes 100000,1000000] [--shards 4] [--keep DIR]

Each size is generated in a temp folder and ingested in a fresh child process, so its peak RSS
(ru_maxrss) is its own. Memory should grow far slower than rows: rows stream through, accepted rows are
written in batches, and deduplication keeps only a 16-byte digest per prompt.

Then the largest size's accepted rows are combined into the prompts table (`combine_sources`, --shards
shards: written sorted by shard, ingest/prompts_table.py), in a fresh child process (time, peak RSS), and
each shard is read from it in another: by `shard_prompts` (the row groups that can hold the shard) and by a
scan of the whole table filtered to the shard (what each shard step did before), bytes read (`rchar` of
/proc/self/io: what the process asked the kernel for) and CPU seconds. `shard_read_bytes_ratio` = bytes
the shard reader read over the whole scan's, all shards summed (1/shards is the ideal);
`shard_read_cpu_ratio` the same for CPU.

The last line of output is one JSON object:
{"sizes": {"100000": {...}, "1000000": {...}}, "rss_ratio": ..., "rows_per_s_ratio": ...,
 "combine": {...}, "shard_reads": {...}, "shard_read_bytes_ratio": ..., "shard_read_cpu_ratio": ...}.
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

_COMBINE_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from eagle3_dagster.ingest import combine_sources
source, out, n_shards = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
counts = combine_sources([source], out, n_shards=n_shards)
elapsed = time.perf_counter() - t0
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"prompts": counts.prompts, "seconds": elapsed, "peak_rss_mb": peak_kb / 1024}))
"""

_SHARD_READ_CHILD = r"""
import json, sys, time
import polars as pl
import pyarrow.parquet as pq
from eagle3_dagster.ingest.prompts_table import shard_prompts

def rchar():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))

def whole_scan(path, shard):  # every row group, every row, filtered to the shard
    for rb in pq.ParquetFile(path).iter_batches(batch_size=4096):
        yield pl.from_arrow(rb).filter(pl.col("shard") == shard)

path, n_shards = sys.argv[1], int(sys.argv[2])
out = {}
for name, read in (("whole_scan", whole_scan), ("shard_prompts", shard_prompts)):
    b0, c0 = rchar(), time.process_time()
    rows = [sum(b.height for b in read(path, k)) for k in range(n_shards)]
    out[name] = {"rows": rows, "read_mb": (rchar() - b0) / 2**20, "cpu_s": time.process_time() - c0}
print(json.dumps(out))
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


def _child(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shard_reads(rows: int, n_shards: int, work: Path) -> dict:
    """The accepted rows of the `rows` run combined into a prompts table of `n_shards` shards, then each shard
    read by the shard reader and by a whole-table scan (fresh processes: a cold start each, the same for both)."""
    out = work / f"prompts_{rows}"
    combine = _child(_COMBINE_CHILD, str(work / f"out_{rows}"), str(out), str(n_shards))
    table = out / "prompts.parquet"
    reads = _child(_SHARD_READ_CHILD, str(table), str(n_shards))
    assert reads["whole_scan"]["rows"] == reads["shard_prompts"]["rows"], reads  # the same rows either way
    assert sum(reads["shard_prompts"]["rows"]) == combine["prompts"], (reads, combine)
    scan, shard = reads["whole_scan"], reads["shard_prompts"]
    return {
        "combine": {
            "prompts": combine["prompts"],
            "n_shards": n_shards,
            "table_mb": round(table.stat().st_size / 2**20, 1),
            "combine_s": round(combine["seconds"], 2),
            "peak_rss_mb": round(combine["peak_rss_mb"], 1),
        },
        "shard_reads": {
            name: {"read_mb": round(r["read_mb"], 1), "cpu_s": round(r["cpu_s"], 2)} for name, r in reads.items()
        },
        "shard_read_bytes_ratio": round(shard["read_mb"] / scan["read_mb"], 3),
        "shard_read_cpu_ratio": round(shard["cpu_s"] / scan["cpu_s"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--shards", type=int, default=4, help="shards of the prompts table the shard reads measure")
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
        reads = shard_reads(max(sizes), args.shards, work)
        print(json.dumps({k: reads[k] for k in ("combine", "shard_reads")}), flush=True)
    summary: dict = {"sizes": results}
    if len(sizes) >= 2:
        small, big = results[str(min(sizes))], results[str(max(sizes))]
        summary["rows_ratio"] = max(sizes) / min(sizes)
        summary["rss_ratio"] = round(big["peak_rss_mb"] / small["peak_rss_mb"], 2)
        summary["rows_per_s_ratio"] = round(big["rows_per_s"] / small["rows_per_s"], 2)
    summary.update(reads)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
