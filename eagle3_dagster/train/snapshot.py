"""Versioned training-dataset snapshots assembled from gated shards, with a manifest and exports.

A snapshot's version is a hash of what it contains (each included shard file's sha256, plus the
config that produced it), so assembling unchanged inputs again yields the same version and the
same bytes: the second nightly run with nothing new produces an identical snapshot rather than a
near-copy. Shards are copied in, so deleting or regenerating the working tables never changes a
published snapshot.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..storage import shard_key

GATES = ("prompts", "generations", "training_samples")


@dataclass
class ShardDecision:
    shard: str
    included: bool
    reason: str
    rows: int = 0
    sha256: str | None = None
    gates: dict[str, bool] = field(default_factory=dict)


@dataclass
class SnapshotResult:
    version: str
    path: Path
    created: bool  # False when an identical snapshot already existed
    rows: int
    shards: list[ShardDecision]
    removed_by_retention: list[str]
    manifest: dict[str, Any]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def decide_shards(
    data_dir: Path, shard_ids: Sequence[int], gate_status: Callable[[str, int], Any]
) -> list[ShardDecision]:
    """Which shards a snapshot may use, and why each other one is left out."""
    out = []
    for k in shard_ids:
        key = shard_key(k)
        f = data_dir / "training_samples" / f"shard={key}" / "part-0000.parquet"
        gates: dict[str, bool] = {}
        reason = "ok"
        for g in GATES:
            res = gate_status(g, k)
            gates[g] = bool(res is not None and res.success)
            if res is None and reason == "ok":
                reason = f"no {g} gate result"
            elif res is not None and not res.success and reason == "ok":
                reason = f"{g} gate failed"
        if not f.exists() and reason == "ok":
            reason = "training_samples not materialized"
        if reason != "ok":
            out.append(ShardDecision(key, False, reason, gates=gates))
            continue
        rows = pl.scan_parquet(f).select(pl.len()).collect().item()
        out.append(ShardDecision(key, True, "all gates passed", rows=rows, sha256=sha256_file(f), gates=gates))
    return out


def _version(decisions: list[ShardDecision], config: dict[str, Any]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for d in decisions:
        if d.included:
            h.update(f"{d.shard}:{d.sha256}\n".encode())
    return h.hexdigest()[:16]


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def list_snapshots(root: Path) -> list[tuple[str, str]]:
    """(version, created_at) of every complete snapshot, oldest first."""
    out = []
    for m in root.glob("*/manifest.json"):
        try:
            out.append((m.parent.name, json.loads(m.read_text())["created_at"]))
        except (ValueError, KeyError):
            continue
    return sorted(out, key=lambda x: (x[1], x[0]))


def build_snapshot(
    data_dir: Path,
    shard_ids: Sequence[int],
    gate_status: Callable[[str, int], Any],
    *,
    config: dict[str, Any],
    keep: int = 7,
    exporters: Sequence[Callable[[Path, Path], dict[str, Any]]] = (),
    now: dt.datetime | None = None,
) -> SnapshotResult:
    root = data_dir / "snapshots"
    decisions = decide_shards(data_dir, shard_ids, gate_status)
    version = _version(decisions, config)
    snap = root / version
    manifest_path = snap / "manifest.json"
    created = not manifest_path.exists()
    if created:
        staging = root / f".{version}.staging"
        if staging.exists():
            shutil.rmtree(staging)
        files: dict[str, dict[str, Any]] = {}
        for d in decisions:
            if not d.included:
                continue
            rel = f"training_samples/shard={d.shard}.parquet"
            _copy(data_dir / "training_samples" / f"shard={d.shard}" / "part-0000.parquet", staging / rel)
            files[rel] = {"sha256": d.sha256, "rows": d.rows}
        exports: dict[str, Any] = {}
        for export in exporters:
            for rel, info in export(staging, staging / "exports").items():
                exports[rel] = info
        for rel in exports:
            exports[rel]["sha256"] = sha256_file(staging / rel)
        manifest = {
            "version": version,
            "created_at": (now or dt.datetime.now(dt.timezone.utc)).isoformat(),
            "rows": sum(d.rows for d in decisions if d.included),
            "files": files,
            "exports": exports,
            "shards": [asdict(d) for d in decisions],
            "config": config,
        }
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        if snap.exists():  # a half-written earlier attempt without a manifest
            shutil.rmtree(snap)
        os.replace(staging, snap)
    manifest = json.loads(manifest_path.read_text())
    (root / "LATEST").write_text(version + "\n")
    removed = apply_retention(root, keep=keep, protect=version)
    return SnapshotResult(version, snap, created, manifest["rows"], decisions, removed, manifest)


def apply_retention(root: Path, *, keep: int, protect: str) -> list[str]:
    """Keep the `keep` newest snapshots (never the one just published); delete the rest."""
    snaps = list_snapshots(root)
    doomed = [v for v, _ in snaps[: max(0, len(snaps) - keep)] if v != protect]
    for v in doomed:
        shutil.rmtree(root / v, ignore_errors=True)
    return doomed
