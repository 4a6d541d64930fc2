"""Versioned training-dataset snapshots assembled from gated shards, with a manifest and exports.

A snapshot's version is a hash of what it contains (each included shard file's sha256, plus the
config that produced it), so assembling unchanged inputs again yields the same version and the
same bytes: the second nightly run with nothing new produces an identical snapshot rather than a
near-copy. Shards are copied in, so deleting or regenerating the working tables never changes a
published snapshot.

Local data: the snapshot is assembled in a staging folder and renamed into place. Object storage
(no rename): the files are written under snapshots/<version>/ and manifest.json is put LAST, so a
snapshot exists exactly when its manifest does; a version folder without one (a crash mid-way) is
deleted and rebuilt, and readers (list_snapshots, LATEST) only ever name versions with a manifest.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..storage import DataPath, PathLike, _native, as_data_path, parquet_num_rows, sha256_of, shard_key

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
    path: Any  # a Path when the data dir was given as a local Path, else a storage.DataPath
    created: bool  # False when an identical snapshot already existed
    rows: int
    shards: list[ShardDecision]
    removed_by_retention: list[str]
    manifest: dict[str, Any]


def sha256_file(path: PathLike) -> str:
    return sha256_of(path)


def decide_shards(
    data_dir: PathLike, shard_ids: Sequence[int], gate_status: Callable[[str, int], Any]
) -> list[ShardDecision]:
    """Which shards a snapshot may use, and why each other one is left out."""
    data_dir = as_data_path(data_dir)
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
        rows = parquet_num_rows(f)
        out.append(ShardDecision(key, True, "all gates passed", rows=rows, sha256=sha256_of(f), gates=gates))
    return out


def _version(decisions: list[ShardDecision], config: dict[str, Any]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for d in decisions:
        if d.included:
            h.update(f"{d.shard}:{d.sha256}\n".encode())
    return h.hexdigest()[:16]


def list_snapshots(root: PathLike) -> list[tuple[str, str]]:
    """(version, created_at) of every complete snapshot (one with a manifest), oldest first."""
    out = []
    for m in as_data_path(root).glob("*/manifest.json"):
        if m.parent.name.startswith("."):
            continue  # a local staging folder
        try:
            out.append((m.parent.name, json.loads(m.read_text())["created_at"]))
        except (ValueError, KeyError):
            continue
    return sorted(out, key=lambda x: (x[1], x[0]))


def build_snapshot(
    data_dir: PathLike,
    shard_ids: Sequence[int],
    gate_status: Callable[[str, int], Any],
    *,
    config: dict[str, Any],
    keep: int = 7,
    exporters: Sequence[Callable[[DataPath, DataPath], dict[str, Any]]] = (),
    now: dt.datetime | None = None,
) -> SnapshotResult:
    given = data_dir
    data = as_data_path(data_dir)
    root = data / "snapshots"
    decisions = decide_shards(data, shard_ids, gate_status)
    version = _version(decisions, config)
    snap = root / version
    manifest_path = snap / "manifest.json"
    created = not manifest_path.exists()
    if created:
        # Local: build beside the final folder, then one rename. Object storage: build in place,
        # manifest last (a folder without a manifest is an unfinished attempt: start it over).
        staging = root / f".{version}.staging" if data.is_local else snap
        staging.rmtree()
        staging.mkdir()
        files: dict[str, dict[str, Any]] = {}
        for d in decisions:
            if not d.included:
                continue
            rel = f"training_samples/shard={d.shard}.parquet"
            (data / "training_samples" / f"shard={d.shard}" / "part-0000.parquet").copy_to(staging / rel)
            files[rel] = {"sha256": d.sha256, "rows": d.rows}
        exports: dict[str, Any] = {}
        for export in exporters:
            for rel, info in export(staging, staging / "exports").items():
                exports[rel] = info
        for rel in exports:
            exports[rel]["sha256"] = sha256_of(staging / rel)
        manifest = {
            "version": version,
            "created_at": (now or dt.datetime.now(dt.UTC)).isoformat(),
            "rows": sum(d.rows for d in decisions if d.included),
            "files": files,
            "exports": exports,
            "shards": [asdict(d) for d in decisions],
            "config": config,
        }
        body = json.dumps(manifest, indent=2, sort_keys=True, default=str)
        if data.is_local:
            (staging / "manifest.json").local_path.write_text(body)
            snap.rmtree()  # a half-written earlier attempt without a manifest
            os.replace(staging.local_path, snap.local_path)
        else:
            manifest_path.write_text(body)
    manifest = json.loads(manifest_path.read_text())
    (root / "LATEST").write_text(version + "\n")
    removed = apply_retention(root, keep=keep, protect=version)
    return SnapshotResult(version, _native(snap, given), created, manifest["rows"], decisions, removed, manifest)


def apply_retention(root: PathLike, *, keep: int, protect: str) -> list[str]:
    """Keep the `keep` newest snapshots (never the one just published); delete the rest."""
    root = as_data_path(root)
    snaps = list_snapshots(root)
    doomed = [v for v, _ in snaps[: max(0, len(snaps) - keep)] if v != protect]
    for v in doomed:
        # Manifest first: a half-deleted snapshot is never listed as complete.
        (root / v / "manifest.json").unlink(missing_ok=True)
        (root / v).rmtree()
    return doomed
