"""Estimates on top of the exact counts: output tokens, time, GPU-hours and disk.

- expected output tokens: the mean `output_len` per source of the LATEST published snapshot
  (data/snapshots/<LATEST>/training_samples/shard=*.parquet), the snapshot's overall mean for a
  source it does not hold; without a snapshot every answer is assumed to run to max_new_tokens
  (an upper bound, said in the plan's assumptions);
- time: output tokens to generate / (tokens per second per server x servers);
- GPU-hours: servers x GPUs per server x hours;
- disk: bytes per token of the tables as they are stored now (file sizes / the tokens they hold),
  else DEFAULT_BYTES_PER_TOKEN (stated).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..publish.snapshot import read_latest
from ..storage import DataPath, parquet_file

# Fallback bytes a token takes when no table of that kind is stored yet: the uncompressed size of what
# each table keeps per token, an upper bound (zstd Parquet stores ids in less): an id is an int32 (4);
# generations keep the server's text beside the ids (~4 more); training_samples keep ids, the loss mask
# (1) and the parsed conversation text (~4); a snapshot copies the training tables and adds exports of
# about the same size (x2).
DEFAULT_BYTES_PER_TOKEN = {"tokenized_prompts": 4.0, "generations": 8.0, "training_samples": 9.0, "snapshot": 18.0}


@dataclass
class OutputExpectation:
    per_request_mean: dict[str, float]  # source -> mean output tokens a request
    overall_mean: float
    basis: str  # "snapshot <version>" or "max_new_tokens"
    snapshot_rows: int = 0
    p50: float | None = None
    p95: float | None = None

    def expected(self, sources: pl.Series) -> float:
        """Expected output tokens of requests from these sources."""
        if sources.len() == 0:
            return 0.0
        counts = sources.fill_null("").value_counts()
        return float(sum(self.per_request_mean.get(str(s), self.overall_mean) * int(n) for s, n in counts.iter_rows()))

    def expected_capped(self, sources: pl.Series, caps: pl.Series) -> float:
        """Expected output tokens of requests from these sources, each at most its own max_new_tokens (a
        prompt fitted to the server's context: context - prompt tokens; 0: not sent)."""
        if sources.len() == 0:
            return 0.0
        means = [self.per_request_mean.get(str(s), self.overall_mean) for s in sources.fill_null("").to_list()]
        return float(sum(min(m, int(c)) for m, c in zip(means, caps.to_list())))


def output_expectation(data: DataPath, max_new_tokens: int) -> OutputExpectation:
    """From the LATEST published snapshot's output lengths, else max_new_tokens per request."""
    root = data / "snapshots"
    version = read_latest(root)
    files = (root / version / "training_samples").glob("shard=*.parquet") if version else []
    frames = [pl.DataFrame(parquet_file(f).read(columns=["source", "output_len"])) for f in files]
    lens = pl.concat(frames) if frames else pl.DataFrame()
    if not lens.height:
        return OutputExpectation({}, float(max_new_tokens), "max_new_tokens")
    by_source = lens.group_by("source").agg(pl.col("output_len").mean())
    return OutputExpectation(
        {str(s): float(m) for s, m in by_source.iter_rows()},
        float(lens["output_len"].mean()),  # type: ignore[arg-type]
        f"snapshot {version}",
        snapshot_rows=lens.height,
        p50=float(lens["output_len"].quantile(0.5) or 0),
        p95=float(lens["output_len"].quantile(0.95) or 0),
    )


def _files_bytes(files: Iterable[DataPath]) -> int:
    return sum(f.size() for f in files)


def _walk(folder: DataPath) -> list[DataPath]:
    """Every file under `folder` (a snapshot: its tables, exports and manifest)."""
    out: list[DataPath] = []
    for c in folder.iterdir():
        out.extend(_walk(c) if c.is_dir() else [c])
    return out


def _tokens(files: list[DataPath], column: str) -> int:
    total = 0
    for f in files:
        col = parquet_file(f).read(columns=[column]).column(column)
        total += int(sum(v for v in col.to_pylist() if v is not None))
    return total


def bytes_per_token(data: DataPath) -> tuple[dict[str, float], dict[str, str]]:
    """Bytes a token takes in each table as stored now, and where each figure comes from."""
    out: dict[str, float] = {}
    basis: dict[str, str] = {}
    measured = {
        "tokenized_prompts": (data.joinpath("tokenized_prompts").glob("shard=*/part-*.parquet"), "prompt_len"),
        "generations": (data.joinpath("generations").glob("shard=*/part-*.parquet"), "completion_tokens"),
        "training_samples": (data.joinpath("training_samples").glob("shard=*/part-*.parquet"), "total_len"),
    }
    version = read_latest(data / "snapshots")
    snap = data / "snapshots" / version if version else None
    for table, (files, column) in measured.items():
        tokens = _tokens(files, column) if files else 0
        if tokens:
            out[table] = _files_bytes(files) / tokens
            basis[table] = f"measured on {len(files)} stored file(s)"
    if snap is not None and snap.is_dir():
        snap_files = _walk(snap)
        tokens = _tokens(snap.joinpath("training_samples").glob("shard=*.parquet"), "total_len")
        if tokens:
            out["snapshot"] = _files_bytes(snap_files) / tokens
            basis["snapshot"] = f"measured on snapshot {version}"
    for table, default in DEFAULT_BYTES_PER_TOKEN.items():
        if table not in out:
            out[table] = default
            basis[table] = f"rule: {default} bytes/token (nothing stored yet)"
    return out, basis


@dataclass
class FleetEstimate:
    tokens_per_s_per_server: float
    throughput_basis: str  # "declared" or "probe: ..."
    servers: int
    gpus_per_server: int
    eta_s: float
    gpu_hours: float


def fleet_estimate(
    output_tokens: float, tokens_per_s_per_server: float, servers: int, gpus_per_server: int, basis: str
) -> FleetEstimate:
    if tokens_per_s_per_server <= 0 or servers < 1 or gpus_per_server < 1:
        raise ValueError("throughput, servers and GPUs per server must be positive")
    eta = output_tokens / (tokens_per_s_per_server * servers)
    return FleetEstimate(
        tokens_per_s_per_server, basis, servers, gpus_per_server, eta, servers * gpus_per_server * eta / 3600.0
    )


@dataclass
class DiskEstimate:
    bytes: dict[str, int]  # table -> bytes this run writes (generations: only the new requests)
    bytes_per_token: dict[str, float]
    basis: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def disk_estimate(
    data: DataPath, *, prompt_tokens: int, new_output_tokens: float, all_output_tokens: float
) -> DiskEstimate:
    """Tables and snapshot this run writes: tokenized_prompts (all prompts), generations (the new
    requests only: the store is append-only), training_samples and a snapshot (every sample)."""
    bpt, basis = bytes_per_token(data)
    sample_tokens = prompt_tokens + all_output_tokens
    tokens: dict[str, float] = {
        "tokenized_prompts": prompt_tokens,
        "generations": new_output_tokens,
        "training_samples": sample_tokens,
        "snapshot": sample_tokens,
    }
    return DiskEstimate({t: round(n * bpt[t]) for t, n in tokens.items()}, bpt, basis)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def human_duration(s: float) -> str:
    if s < 90:
        return f"{s:,.0f} s"
    if s < 5400:
        return f"{s / 60:,.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:,.1f} h"
    return f"{s / 86400:,.1f} days"


def as_jsonable(obj: Any) -> Any:
    """Round floats for the JSON file (the plan is an estimate; 3 decimals say enough)."""
    if isinstance(obj, float):
        return round(obj, 3)
    if isinstance(obj, dict):
        return {k: as_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_jsonable(v) for v in obj]
    return obj
