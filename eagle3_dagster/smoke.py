"""The GPU lane's one-line result (scripts/gpu-smoke.sh, docs/real-sglang.md), read from a demo run's output.

    python -m eagle3_dagster.smoke DATA_DIR    # prints one JSON line

Everything comes from what the pipeline wrote into the data dir: the latest snapshot's manifest.json
(rows, the summary's finish reasons and `</think>` rate, the exports' count of rows that are not
text-exact, the publish gate), `demo_summary.json` (each shard's failed checks and step errors) and
the shard generations of the current cache keys (active.parquet) for the speed:

* `output_tokens_per_s`: completion tokens over the time the client spent generating each shard (first
  request sent to last answer, from `generated_at` minus `e2e_latency`), summed over shards;
* `ideal_tokens_per_s`: the same tokens over the time the server had at least one of them running
  (the union of the requests' [generated_at - e2e_latency, generated_at]): the server-bound ideal;
* `fraction_of_ideal`: the ratio, the quantity bench/generate.py reports against the simulator as
  `server_bound_fraction` (where the simulator's own busy time is the ideal).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from .generate.active import ACTIVE_FILE, read_active_generations
from .storage import DataPath, PathLike, as_data_path
from .train.snapshot import read_latest, read_manifest

NOT_TEXT_EXACT_EXPORT = "exports/specforge_prompts.jsonl"  # its rows_not_text_exact: the non-canonical rows


@dataclass(frozen=True)
class SmokeSummary:
    success: bool
    snapshot: str | None
    rows: int  # rows of the published snapshot
    think_end_present_rate: float | None  # share of snapshot rows whose output ids hold the profile's </think>
    non_canonical_rate: float | None  # share of snapshot rows whose text re-encodes to other ids
    finish_reasons: dict[str, int]
    output_tokens_per_s: float | None
    ideal_tokens_per_s: float | None
    fraction_of_ideal: float | None
    failed_gates: list[str] = field(default_factory=list)  # "shard 0001 generations:think_end_present (ERROR)", ...

    def json_line(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


def _busy_s(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def generation_speed(data: DataPath) -> tuple[int, float, float]:
    """(completion tokens, seconds generating, seconds the server was busy) over every shard's current samples."""
    tokens, span, busy = 0, 0.0, 0.0
    for folder in sorted((data / "generations").glob("shard=*")):
        if not (folder / ACTIVE_FILE).exists():
            continue
        df = read_active_generations(folder).filter(pl.col("output_ids").is_not_null())
        df = df.filter(pl.col("e2e_latency").is_not_null() & pl.col("generated_at").is_not_null())
        if df.height == 0:
            continue
        end = df["generated_at"].dt.epoch("us").cast(pl.Float64) / 1e6
        start = end - df["e2e_latency"]
        tokens += int(df["completion_tokens"].fill_null(0).sum())
        span += float(end.max()) - float(start.min())  # type: ignore[arg-type]
        busy += _busy_s(list(zip(start.to_list(), end.to_list(), strict=True)))
    return tokens, span, busy


def _failed_gates(demo: dict[str, Any], manifest: dict[str, Any] | None) -> list[str]:
    out = []
    for sh in demo.get("shards", []):
        out += [f"shard {sh['shard']} {c} ({sev})" for c, sev in sorted((sh.get("failed_checks") or {}).items())]
        out += [f"shard {sh['shard']} {e}" for e in sh.get("errors") or []]
    out += [f"ingest {e}" for e in demo.get("ingest_errors") or []]
    out += [f"publish {e}" for e in demo.get("publish_errors") or []]
    for o in ((manifest or {}).get("publish_gate") or {}).get("outcomes", []):
        if not o.get("success"):
            out.append(f"publish gate {o.get('key')} ({o.get('severity')})")
    return out


def smoke_summary(data_dir: PathLike) -> SmokeSummary:
    """What one demo run against a real server gave: see the module docstring for each field."""
    data = as_data_path(data_dir)
    demo_file = data / "demo_summary.json"
    demo = json.loads(demo_file.read_text()) if demo_file.exists() else {"errors": ["no demo_summary.json"]}
    version = read_latest(data / "snapshots")
    manifest = read_manifest(data / "snapshots", version)
    rows = int((manifest or {}).get("rows") or 0)
    summary = (manifest or {}).get("summary") or {}
    flagged = ((manifest or {}).get("exports") or {}).get(NOT_TEXT_EXACT_EXPORT, {}).get("rows_not_text_exact")
    tokens, span, busy = generation_speed(data)
    failed = _failed_gates(demo, manifest)
    if not demo_file.exists():
        failed.append("no demo_summary.json: the demo did not finish")
    return SmokeSummary(
        success=bool(demo.get("success")) and manifest is not None and not failed,
        snapshot=version,
        rows=rows,
        think_end_present_rate=summary.get("think_end_rate"),
        non_canonical_rate=round(flagged / rows, 6) if rows and flagged is not None else None,
        finish_reasons=dict(summary.get("finish_reasons") or {}),
        output_tokens_per_s=round(tokens / span, 1) if span > 0 else None,
        ideal_tokens_per_s=round(tokens / busy, 1) if busy > 0 else None,
        fraction_of_ideal=round(busy / span, 4) if span > 0 else None,
        failed_gates=failed,
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m eagle3_dagster.smoke DATA_DIR", file=sys.stderr)
        return 2
    print(smoke_summary(argv[0]).json_line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
