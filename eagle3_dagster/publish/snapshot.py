"""Versioned training-dataset snapshots assembled from gated shards, with a manifest and exports.

A snapshot's version is a hash of what a trainer consumes (publish/identity.py:ContentHasher: per row
sample_id, input_ids, loss_mask, model_revision, template_hash, sampling_hash), so regenerating
identical tokens on another machine, port or day gives the same version, and assembling unchanged
inputs again yields the same snapshot rather than a near-copy. The manifest keeps each file's
sha256 (`files`, `exports`), the full content digest (`identity`), a distribution summary
(`summary`), which SGLang release(s) and how many workers served the rows (`served_by`), and what the
snapshot gates decided (`published`, `publish_gate`, `drift`). Shards
are copied in, so deleting or regenerating the working tables never changes a published snapshot.
Memory stays flat however big the snapshot: the content identity and summary read each shard table a
batch at a time (content_and_summary), the shards are copied file to file, and the exports stream
shard by shard (publish/export.py); bench/publish_memory.py measures it (docs/benchmarks-memory.md).

Publishing is a gate of its own (`judge`, see publish/snapshot_gates.py): a refused snapshot (a shard
left out when no partial snapshot was asked for, no rows, every shard excluded, a sudden drop against the
previous one) is not written and LATEST does not move; a snapshot held back by the drift policy is written with `published: false` and LATEST
does not move either. Every attempt is recorded in data/gates/publish/last.json.

Local data: the snapshot is assembled in a staging folder and renamed into place. Object storage
(no rename): the files are written under snapshots/<version>/ and manifest.json is put LAST, so a
snapshot exists exactly when its manifest does; a version folder without one (a crash mid-way) is
deleted and rebuilt, and readers (list_snapshots, LATEST) only ever name versions with a manifest.

One publisher at a time per data dir: build_snapshot holds `snapshots/.publish.lock`
(storage/locks.py: flock, released by the kernel when its holder dies) from reading LATEST to
moving it, so the nightly run and a manual backfill (or two `eagle3 demo`) publish one after the
other; a second one waits up to `lock_wait_s`, naming the holder (pid, host, run id) and the lock
file, then fails with that one line. Each attempt stages in a folder of its own
(`.staging-<version>-<pid>-<random>`), removed on any failure; a staging folder found while
holding the lock belongs to a dead attempt (a SIGKILL) and is deleted before building. LATEST is
written only after the snapshot folder is complete (renamed in, or its manifest put last).
Object storage has no lock: the lock file is local, so it excludes publishers on this host only
(said in a warning on every publish).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from ..stopping import StopRequested, stop_reason, stop_requested
from ..storage import (
    DataDirLock,
    DataPath,
    LockOptions,
    PathLike,
    as_data_path,
    as_given,
    parquet_num_rows,
    sha256_of,
    shard_key,
)
from ..train.summary import STAT_COLUMNS, Summary, sample_stats, summarize
from .card import write_card
from .card_facts import served_by
from .identity import IDENTITY_SCHEME, ContentHasher
from .snapshot_gates import PublishedSnapshot, SnapshotFacts, SnapshotVerdict

GATES = ("prompts", "generations", "training_samples")
PUBLISH_LOCK = "snapshots/.publish.lock"
STAGING_PREFIX = ".staging-"
# how long a publisher waits for another one on the same data dir before failing (one line naming it)
PUBLISH_LOCK_WAIT_S = 1800.0

log = logging.getLogger(__name__)


@dataclass
class ShardDecision:
    shard: str
    included: bool
    reason: str
    rows: int = 0
    sha256: str | None = None
    gates: dict[str, bool] = field(default_factory=dict)


Exporter = Callable[[DataPath, DataPath], dict[str, Any]]  # (snapshot dir, exports dir) -> {rel: info}


@dataclass(frozen=True)
class SnapshotContent:
    """What a snapshot holds besides its shards: the run's config, the exports written into it, the model
    profile that enables the distribution summary (None: no summary), the clock of its times."""

    config: dict[str, Any]
    exporters: Sequence[Exporter] = ()
    profile: Any = None
    now: dt.datetime | None = None


@dataclass(frozen=True)
class PublishPolicy:
    """When a snapshot is published and how many are kept: `judge(facts)` -> its SnapshotVerdict (None: every
    snapshot is published); `allow_partial`: a partial snapshot was asked for; the newest `keep` are kept."""

    judge: Callable[[SnapshotFacts], SnapshotVerdict] | None = None
    allow_partial: bool = False
    keep: int = 7


@dataclass(frozen=True)
class PublishLockOptions(LockOptions):
    """How a publisher takes the data dir's publish lock (storage.LockOptions): it waits for another
    publisher up to PUBLISH_LOCK_WAIT_S unless told otherwise; `on_wait(line)` (default: the log) also hears
    that the lock covers this host only and what dead attempts were cleaned up."""

    wait_s: float = PUBLISH_LOCK_WAIT_S


@dataclass(frozen=True)
class AssembledSnapshot:
    """A snapshot as assembled and judged, before it is written: its identity, shards and manifest fields."""

    version: str
    digest: str
    rows: int
    decisions: Sequence[ShardDecision]
    summary: Summary | None
    gate_fields: dict[str, Any]  # what the gates decided (none when nothing was judged)


@dataclass
class SnapshotResult:
    version: str
    path: Any  # a Path when the data dir was given as a local Path, else a storage.DataPath
    created: bool  # False when an identical snapshot already existed
    rows: int
    shards: list[ShardDecision]
    removed_by_retention: list[str]
    manifest: dict[str, Any]
    published: bool = True  # False: refused by the publish gate (path None) or held back by drift
    verdict: SnapshotVerdict | None = None  # what the snapshot gates decided (None: not judged)
    latest: str | None = None  # what LATEST names after this build
    removed_staging: list[str] = field(default_factory=list)  # staging folders of dead attempts, deleted


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
                failed = [o.name for o in getattr(res, "failed_critical", [])]
                if failed:  # which expectations (e.g. the request failure rate and its top reason)
                    reason += ": " + "; ".join(failed)
        if not f.exists() and reason == "ok":
            reason = "training_samples not materialized"
        if reason != "ok":
            out.append(ShardDecision(key, False, reason, gates=gates))
            continue
        rows = parquet_num_rows(f)
        out.append(ShardDecision(key, True, "all gates passed", rows=rows, sha256=sha256_of(f), gates=gates))
    return out


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


def read_latest(root: PathLike) -> str | None:
    f = as_data_path(root) / "LATEST"
    if not f.exists():
        return None
    return f.read_text().strip() or None


def read_manifest(root: PathLike, version: str | None) -> dict[str, Any] | None:
    if not version:
        return None
    m = as_data_path(root) / version / "manifest.json"
    try:
        return json.loads(m.read_text()) if m.exists() else None
    except ValueError:
        return None


def content_and_summary(
    data: DataPath, decisions: Sequence[ShardDecision], profile: Any = None
) -> tuple[str, Summary | None]:
    """(full content digest, distribution summary or None without a profile) of the included shards.

    Streamed (ContentHasher.update_file): each shard table is read a batch at a time; what is kept for
    the whole snapshot is the per-row scalars (the summary's statistics, the identity's ids and lengths)."""
    import polars as pl

    from .export import BATCH_ROWS

    hasher = ContentHasher()
    stats: list[pl.DataFrame] = []

    def batch_stats(b: Any) -> None:
        stats.append(sample_stats(cast(pl.DataFrame, pl.from_arrow(b)), profile))

    for d in decisions:
        if not d.included:
            continue
        hasher.update_file(
            data / "training_samples" / f"shard={d.shard}" / "part-0000.parquet",
            batch_rows=BATCH_ROWS,
            also_read=STAT_COLUMNS if profile is not None else (),
            on_batch=batch_stats if profile is not None else None,
        )
    summary = None
    if profile is not None:
        summary = summarize(pl.concat(stats) if stats else sample_stats(pl.DataFrame(), profile))
    return hasher.hexdigest(), summary


def request_failures(data: DataPath, decisions: Sequence[ShardDecision]) -> dict[str, dict[str, Any]]:
    """Shard -> its permanently failed generation requests by reason (errors.parquet), for shards with any."""
    from ..generate.report import failures_section
    from ..generate.store import read_generation_errors

    out = {}
    for d in decisions:
        errors = read_generation_errors(data / "generations" / f"shard={d.shard}")
        if errors.height:
            out[d.shard] = failures_section(errors.iter_rows(named=True))
    return out


def build_snapshot(
    data_dir: PathLike,
    shard_ids: Sequence[int],
    gate_status: Callable[[str, int], Any],
    content: SnapshotContent,
    policy: PublishPolicy = PublishPolicy(),
    lock: PublishLockOptions = PublishLockOptions(),
) -> SnapshotResult:
    """Assemble, judge and (if the gates allow) publish a snapshot, holding the data dir's publish lock.

    A shard left out (a failed or missing gate result) refuses the snapshot unless `policy.allow_partial`
    asks for a partial one (the judge decides: `facts.allow_partial`); the manifest names every shard left
    out and why (`shards_left_out`), and so does the data card.

    `policy.judge(facts)` -> the SnapshotVerdict of the assembled snapshot (its rows, shards included and
    left out, summary, LATEST's snapshot). Without a judge every snapshot is published. `lock.on_wait(line)`
    is told once when it waits and when the lock covers this host only.
    Raises storage.DataDirLocked when another publisher still holds the lock after `lock.wait_s`.
    """
    on_wait = lock.on_wait or log.warning
    data_lock = DataDirLock(data_dir, PUBLISH_LOCK, what="snapshot publish", options=replace(lock, on_wait=on_wait))
    warning = data_lock.host_only_warning()
    if warning:
        on_wait(warning)
    with data_lock:
        locked_at = time.time()
        removed_staging = remove_dead_staging(as_data_path(data_dir) / "snapshots")
        for name in removed_staging:
            on_wait(f"removed staging folder {name} of an earlier publish that did not finish")
        for name in remove_stale_latest_tmp(as_data_path(data_dir) / "snapshots", before=locked_at):
            on_wait(f"removed {name}, left by an earlier publish killed while writing LATEST")
        result = _build_snapshot_locked(data_dir, shard_ids, gate_status, content, policy)
        result.removed_staging = removed_staging
        return result


def remove_dead_staging(root: PathLike) -> list[str]:
    """Delete every local staging folder under snapshots/ (call only while holding the publish lock:
    then no live publisher owns one). Also the shared `.<version>.staging` of older versions."""
    root = as_data_path(root)
    if not root.is_local:
        return []  # object storage stages in place; a version folder without a manifest is rebuilt
    removed = []
    for d in root.iterdir():
        if d.name.startswith(STAGING_PREFIX) or (d.name.startswith(".") and d.name.endswith(".staging")):
            d.rmtree()
            removed.append(d.name)
    return removed


def remove_stale_latest_tmp(root: PathLike, *, before: float) -> list[str]:
    """Delete the `.LATEST.*.tmp` files a publisher killed while writing LATEST left behind (call only while
    holding the publish lock; only files older than `before`, when the lock was taken: no live writer's)."""
    root = as_data_path(root)
    if not root.is_local or not root.exists():
        return []  # object storage writes LATEST in one put: no temp object
    removed = []
    for f in root.glob(".LATEST.*.tmp"):
        try:
            if f.local_path.stat().st_mtime < before:
                f.unlink(missing_ok=True)
                removed.append(f.name)
        except FileNotFoundError:
            continue
    return removed


def unpublished_versions(root: PathLike) -> set[str]:
    """Complete snapshots LATEST was never switched to: built after LATEST's snapshot (all of them when
    there is no LATEST), not held back on purpose (manifest `published: false` says that itself). A
    publish stopped or killed between the snapshot's rename and the LATEST write leaves one."""
    root = as_data_path(root)
    latest = read_latest(root)
    snaps = list_snapshots(root)
    after = next((c for v, c in snaps if v == latest), "") if latest else ""
    out = set()
    for version, created in snaps:
        if version == latest or (latest and created <= after):
            continue
        man = read_manifest(root, version) or {}
        if man.get("published", True) is not False:
            out.add(version)
    return out


def _refuse_if_stopped(root: DataPath, version: str, attempt: dict[str, Any], attempt_file: DataPath) -> None:
    """Called just before LATEST -> version, the publish's commit point. A stop requested by then is honoured:
    the snapshot stays complete but unpublished (a rerun publishes it), and StopRequested says so."""
    if stop_requested():
        latest = read_latest(root)
        attempt.update(published=False, stopped=stop_reason() or "stop requested")
        attempt_file.write_text(json.dumps(attempt, indent=1, default=str))
        raise StopRequested(
            f"stopped before LATEST was switched ({stop_reason() or 'stop requested'}): snapshot {version} is "
            f"complete but NOT published, LATEST stays {latest or '(none)'}; a rerun publishes it"
        )


def _build_snapshot_locked(
    data_dir: PathLike,
    shard_ids: Sequence[int],
    gate_status: Callable[[str, int], Any],
    content: SnapshotContent,
    policy: PublishPolicy,
) -> SnapshotResult:
    data = as_data_path(data_dir)
    root = data / "snapshots"
    judge, allow_partial, now = policy.judge, policy.allow_partial, content.now
    decisions = decide_shards(data, shard_ids, gate_status)
    digest, summary = content_and_summary(data, decisions, content.profile)
    version = digest[:16]
    rows = sum(d.rows for d in decisions if d.included)
    latest = read_latest(root)
    verdict = None
    # the same content as LATEST needs no new judgement, unless shards are left out that no one agreed to leave
    unasked = not allow_partial and not all(d.included for d in decisions)
    if judge is not None and (latest != version or unasked):
        verdict = judge(_judged_snapshot(rows, decisions, summary, read_manifest(root, latest), allow_partial))
    published = verdict is None or verdict.publish
    gate_fields = _gate_fields(verdict, latest)
    refused = verdict is not None and not verdict.publish_gate.success
    attempt = {
        "version": version,
        "rows": rows,
        "published": published,
        "written": not refused,
        "at": (now or dt.datetime.now(dt.UTC)).isoformat(),
        "latest_before": latest,
        "verdict": verdict.to_json() if verdict is not None else None,
        "summary": summary,
    }
    attempt_file = data / "gates" / "publish" / "last.json"
    if refused:
        attempt_file.write_text(json.dumps(attempt, indent=1, default=str))
        # The publish gate failed: nothing is written, LATEST stays where it was.
        manifest = {"version": version, "rows": rows, **gate_fields, "summary": summary}
        return SnapshotResult(
            version, None, False, rows, decisions, [], manifest, published=False, verdict=verdict, latest=latest
        )
    snap = root / version
    assembled = AssembledSnapshot(version, digest, rows, decisions, summary, gate_fields)
    created = _write_snapshot(data, snap, assembled, content)
    manifest = json.loads((snap / "manifest.json").read_text())
    if published:
        manifest = _publish(root, version, manifest, attempt, attempt_file, same_as_latest=latest == version)
    if verdict is None and judge is not None:
        attempt["verdict"] = _verdict_of_latest(manifest)
    attempt_file.write_text(json.dumps(attempt, indent=1, default=str))  # after the snapshot exists
    removed = apply_retention(root, keep=policy.keep, protect=version, also_protect=read_latest(root))
    return SnapshotResult(
        version,
        as_given(snap, data_dir),
        created,
        manifest["rows"],
        decisions,
        removed,
        manifest,
        published=published,
        verdict=verdict,
        latest=read_latest(root),
    )


def _judged_snapshot(
    rows: int,
    decisions: Sequence[ShardDecision],
    summary: Summary | None,
    previous: dict[str, Any] | None,
    allow_partial: bool,
) -> SnapshotFacts:
    """What the publish and drift gates judge: the assembled snapshot beside the previous published one."""
    return SnapshotFacts(
        rows=rows,
        shards_included=sum(1 for d in decisions if d.included),
        summary=summary or Summary(),
        previous=PublishedSnapshot.from_manifest(previous) if previous is not None else None,
        excluded={d.shard: d.reason for d in decisions if not d.included},
        allow_partial=allow_partial,
    )


def _gate_fields(verdict: SnapshotVerdict | None, latest: str | None) -> dict[str, Any]:
    """The manifest fields a judged snapshot carries (none when nothing was judged)."""
    if verdict is None:
        return {}
    published = verdict.publish
    fields: dict[str, Any] = {
        "published": published,
        "publish_gate": verdict.publish_gate.to_json(),
        "drift": verdict.drift.to_json() if verdict.drift is not None else None,
        "previous_version": latest,
    }
    if not published:
        fields["not_published_because"] = list(verdict.reasons)
    return fields


def _write_snapshot(data: DataPath, snap: DataPath, assembled: AssembledSnapshot, content: SnapshotContent) -> bool:
    """Write the snapshot folder unless it exists (True: written now); an existing one judged again gets the
    latest decision's fields, its files unchanged."""
    manifest_path = snap / "manifest.json"
    if manifest_path.exists():
        if assembled.gate_fields:
            # The same content judged again against another LATEST (e.g. held back before): the files are
            # unchanged, the decision fields are the latest one.
            manifest = json.loads(manifest_path.read_text())
            manifest.update(assembled.gate_fields)
            manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        return False
    # Local: build beside the final folder, then one rename. Object storage: build in place,
    # manifest last (a folder without a manifest is an unfinished attempt: start it over).
    # a folder of this attempt's own (never shared with another publisher), removed on any failure
    root = data / "snapshots"
    staging = (
        root / f"{STAGING_PREFIX}{assembled.version}-{os.getpid()}-{uuid.uuid4().hex[:8]}" if data.is_local else snap
    )
    staging.rmtree()
    staging.mkdir()
    try:
        _assemble(data, staging, snap, manifest_path, assembled, content)
    finally:
        if data.is_local:
            staging.rmtree()
    return True


def _publish(
    root: DataPath,
    version: str,
    manifest: dict[str, Any],
    attempt: dict[str, Any],
    attempt_file: DataPath,
    *,
    same_as_latest: bool,
) -> dict[str, Any]:
    """Move LATEST to `version` (unless a stop was asked for first); the manifest with its published_at."""
    _refuse_if_stopped(root, version, attempt, attempt_file)
    manifest = stamp_published_at(
        root, root / version / "manifest.json", manifest, same_as_latest=same_as_latest, now=str(attempt["at"])
    )
    attempt["published_at"] = manifest["published_at"]
    (root / "LATEST").write_text(version + "\n")  # the publish's commit point
    return manifest


def _verdict_of_latest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The same content as LATEST: nothing new was judged; what was decided when it was published holds."""
    return {
        "publish": True,
        "reasons": [],
        "publish_gate": manifest.get("publish_gate"),
        "drift": manifest.get("drift"),
        "same_as_latest": True,
    }


def stamp_published_at(
    root: DataPath, manifest_path: DataPath, manifest: dict[str, Any], *, same_as_latest: bool, now: str
) -> dict[str, Any]:
    """The manifest with `published_at`: when this content became LATEST. A publish of the content LATEST
    already names (a rerun that found nothing new) keeps the time of the first one; a snapshot published
    before the field existed takes LATEST's own modification time. LATEST itself is still rewritten by
    every publish: its age is the freshness signal (a night that ran and found nothing new is fresh)."""
    at = manifest.get("published_at") if same_as_latest else None
    if same_as_latest and not at:
        mtime = (root / "LATEST")._info().mtime
        if mtime is not None:
            at = (mtime if mtime.tzinfo else mtime.replace(tzinfo=dt.UTC)).isoformat()
    if not at:
        at = now
    if manifest.get("published_at") != at:
        manifest = {**manifest, "published_at": at}
        manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return manifest


def _assemble(
    data: DataPath,
    staging: DataPath,
    snap: DataPath,
    manifest_path: DataPath,
    assembled: AssembledSnapshot,
    content: SnapshotContent,
) -> None:
    """Copy the shards and write the exports into `staging`, then make the snapshot appear at `snap`
    whole: locally one rename of the finished folder, on object storage the manifest put last."""
    decisions = assembled.decisions
    files: dict[str, dict[str, Any]] = {}
    for d in decisions:
        if not d.included:
            continue
        rel = f"training_samples/shard={d.shard}.parquet"
        (data / "training_samples" / f"shard={d.shard}" / "part-0000.parquet").copy_to(staging / rel)
        files[rel] = {"sha256": d.sha256, "rows": d.rows}
    exports: dict[str, Any] = {}
    for export in content.exporters:
        for rel, info in export(staging, staging / "exports").items():
            exports[rel] = info
    for rel in exports:
        exports[rel]["sha256"] = sha256_of(staging / rel)
    manifest = {
        "version": assembled.version,
        "identity": {"sha256": assembled.digest, "of": IDENTITY_SCHEME},
        "created_at": (content.now or dt.datetime.now(dt.UTC)).isoformat(),
        "rows": assembled.rows,
        "files": files,
        "exports": exports,
        "shards": [asdict(d) for d in decisions],
        # a partial snapshot (asked for): every shard it leaves out and why ({} when it has them all)
        "shards_left_out": {d.shard: d.reason for d in decisions if not d.included},
        # generation requests that failed for good, per shard (included or not): reasons, counts, examples
        "request_failures": request_failures(data, decisions),
        "config": content.config,
        "summary": assembled.summary,
        # which SGLang release(s) and how many workers made the rows, read from the copied tables
        "served_by": served_by(staging / rel for rel in files),
        **assembled.gate_fields,
    }
    manifest["card"] = write_card(data, staging, manifest)  # README.md, the Hugging Face dataset card
    body = json.dumps(manifest, indent=2, sort_keys=True, default=str)
    if data.is_local:
        (staging / "manifest.json").local_path.write_text(body)
        snap.rmtree()  # a half-written earlier attempt without a manifest
        os.replace(staging.local_path, snap.local_path)
    else:
        manifest_path.write_text(body)


def apply_retention(root: PathLike, *, keep: int, protect: str, also_protect: str | None = None) -> list[str]:
    """Keep the `keep` newest snapshots (never the one just built, nor the one LATEST names)."""
    root = as_data_path(root)
    snaps = list_snapshots(root)
    doomed = [v for v, _ in snaps[: max(0, len(snaps) - keep)] if v not in (protect, also_protect)]
    for v in doomed:
        # Manifest first: a half-deleted snapshot is never listed as complete.
        (root / v / "manifest.json").unlink(missing_ok=True)
        (root / v).rmtree()
    return doomed
