"""The GPU lane's one-line result (scripts/gpu-smoke.sh, docs/real-sglang.md), read from a demo run's output.

    python -m eagle3_dagster.app.smoke DATA_DIR    # prints one JSON line

Everything comes from what the pipeline wrote into the data dir: the latest snapshot's manifest.json
(its rows and version, the publish gate), `demo_summary.json` (each shard's failed checks and step
errors), every shard's generations of the current cache keys (active.parquet: `</think>` present,
finish reasons, speed) and its training_samples (`text_exact`: the non-canonical rows), so a shard
the gates left out of the snapshot still shows what the server did:

* `output_tokens_per_s`: completion tokens over the time the client spent generating each shard (first
  request sent to last answer, from `generated_at` minus `e2e_latency`), summed over shards;
* `ideal_tokens_per_s`: the same tokens over the time the server had at least one of them running
  (the union of the requests' [generated_at - e2e_latency, generated_at]): the server-bound ideal;
* `fraction_of_ideal`: the ratio, the quantity bench/generate.py reports against the simulator as
  `server_bound_fraction` (where the simulator's own busy time is the ideal);
* `spec_rows` / `spec_accept_length` / `spec_accept_rate` / `drafter_ids`: the generations that carry the
  speculating server's figures (generate/drafter.py), their accept length (Σ completion tokens / Σ verify
  steps) and rate, and the drafters that served them. With `--expect-drafter` (the lane started the server
  with a draft model) every generation must carry them, else the line fails and names how many do not.

    python -m eagle3_dagster.app.smoke DATA_DIR [--expect-drafter]
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from ..generate.active import ACTIVE_FILE, read_active_generations
from ..publish.snapshot import read_latest, read_manifest
from ..storage import DataPath, PathLike, as_data_path, read_parquet


@dataclass(frozen=True)
class SmokeSummary:
    success: bool
    snapshot: str | None
    rows: int  # rows of the published snapshot (0: none published)
    generated: int  # current generations of every shard (in the snapshot or not)
    think_end_present_rate: float | None  # share of them whose output ids hold the profile's </think>
    finish_reasons: dict[str, int]  # of them
    non_canonical_rate: float | None  # share of every shard's training rows whose text re-encodes to other ids
    output_tokens_per_s: float | None
    ideal_tokens_per_s: float | None
    fraction_of_ideal: float | None
    failed_gates: list[str] = field(default_factory=list)  # "shard 0001 generations:think_end_present (ERROR)", ...
    spec_rows: int = 0  # generations carrying speculative-decoding figures
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    drafter_ids: list[str] = field(default_factory=list)

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


def current_generations(data: DataPath) -> list[pl.DataFrame]:
    """Every shard's generations of the current cache keys (the shards whose step wrote active.parquet)."""
    out = []
    for folder in sorted((data / "generations").glob("shard=*")):
        if (folder / ACTIVE_FILE).exists():
            out.append(read_active_generations(folder).filter(pl.col("output_ids").is_not_null()))
    return out


def generation_speed(shards: list[pl.DataFrame]) -> tuple[int, float, float]:
    """(completion tokens, seconds generating, seconds the server was busy), summed over shards."""
    tokens, span, busy = 0, 0.0, 0.0
    for df in shards:
        df = df.filter(pl.col("e2e_latency").is_not_null() & pl.col("generated_at").is_not_null())
        if df.height == 0:
            continue
        end = df["generated_at"].dt.epoch("us").cast(pl.Float64) / 1e6
        start = end - df["e2e_latency"]
        tokens += int(df["completion_tokens"].fill_null(0).sum())
        span += float(end.max()) - float(start.min())  # type: ignore[arg-type]
        busy += _busy_s(list(zip(start.to_list(), end.to_list(), strict=True)))
    return tokens, span, busy


def not_text_exact(data: DataPath) -> tuple[int, int]:
    """(training rows whose text re-encodes to other ids, training rows), over every shard."""
    flagged = rows = 0
    for f in sorted((data / "training_samples").glob("shard=*/part-*.parquet")):
        col = read_parquet(f, columns=["text_exact"])["text_exact"]
        flagged += int((col == False).sum() or 0)  # noqa: E712 - null (not judged) is not flagged
        rows += col.len()
    return flagged, rows


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


def spec_figures(gens: pl.DataFrame) -> dict[str, Any]:
    """The speculative-decoding part of the summary, from the generations' spec_* columns."""
    if "spec_verify_ct" not in gens.columns or not gens.height:
        return {"spec_rows": 0}
    s = gens.filter(pl.col("spec_verify_ct").is_not_null())
    vct, proposed = int(s["spec_verify_ct"].sum() or 0), int(s["spec_num_proposed_drafts"].sum() or 0)
    return {
        "spec_rows": s.height,
        "spec_accept_length": round(int(s["completion_tokens"].sum() or 0) / vct, 4) if vct else None,
        "spec_accept_rate": round(int(s["spec_num_correct_drafts"].sum() or 0) / proposed, 4) if proposed else None,
        "drafter_ids": sorted(str(d) for d in s["drafter_id"].drop_nulls().unique().to_list()),
    }


def smoke_summary(data_dir: PathLike, think_end_id: int, *, expect_drafter: bool = False) -> SmokeSummary:
    """What one demo run against a real server gave (`think_end_id`: the profile's `</think>`); see the module
    docstring for each field."""
    data = as_data_path(data_dir)
    demo_file = data / "demo_summary.json"
    demo = json.loads(demo_file.read_text()) if demo_file.exists() else {}
    version = read_latest(data / "snapshots")
    manifest = read_manifest(data / "snapshots", version)
    shards = current_generations(data)
    gens = (
        pl.concat(shards)
        if shards
        else pl.DataFrame(schema={"output_ids": pl.List(pl.Int32), "finish_reason": pl.String})
    )
    with_think_end = int(gens["output_ids"].list.contains(think_end_id).sum()) if gens.height else 0
    flagged, train_rows = not_text_exact(data)
    tokens, span, busy = generation_speed(shards)
    failed = _failed_gates(demo, manifest)
    if not demo_file.exists():
        failed.append("no demo_summary.json: the demo did not finish")
    spec = spec_figures(gens)
    if expect_drafter and (not gens.height or spec["spec_rows"] < gens.height or not spec.get("drafter_ids")):
        failed.append(
            f"speculative decoding: {gens.height - spec['spec_rows']} of {gens.height} generations carry no spec_* "
            f"figures, drafters named: {spec.get('drafter_ids') or 'none'} (the server was started with a draft model)"
        )
    return SmokeSummary(
        success=bool(demo.get("success")) and manifest is not None and not failed,
        snapshot=version,
        rows=int((manifest or {}).get("rows") or 0),
        generated=gens.height,
        think_end_present_rate=round(with_think_end / gens.height, 6) if gens.height else None,
        finish_reasons={str(k): int(v) for k, v in gens["finish_reason"].value_counts().iter_rows()},
        non_canonical_rate=round(flagged / train_rows, 6) if train_rows else None,
        output_tokens_per_s=round(tokens / span, 1) if span > 0 else None,
        ideal_tokens_per_s=round(tokens / busy, 1) if busy > 0 else None,
        fraction_of_ideal=round(busy / span, 4) if span > 0 else None,
        failed_gates=failed,
        **spec,
    )


def main(argv: list[str]) -> int:
    expect_drafter = "--expect-drafter" in argv
    argv = [a for a in argv if a != "--expect-drafter"]
    if len(argv) != 1:
        print("usage: python -m eagle3_dagster.app.smoke DATA_DIR [--expect-drafter]", file=sys.stderr)
        return 2
    from ..config import settings
    from ..profiles import resolve_profile

    s = settings()  # EAGLE3_MODEL / EAGLE3_ASSETS_DIR: the profile the demo ran with
    profile = resolve_profile(s.model.name, s.storage.assets_dir / "models")
    summary = smoke_summary(argv[0], profile.think_end_id, expect_drafter=expect_drafter)
    print(summary.json_line(), flush=True)
    # the draft model's figures missing is the lane's own failure (a failed gate is the demo's exit code)
    return 3 if expect_drafter and any(g.startswith("speculative decoding") for g in summary.failed_gates) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
