"""Two publishers on one data dir, in real processes: serialized by the publish lock, never sharing a
staging folder; a publisher killed mid-way leaves LATEST on a complete snapshot, and the next publish
removes its staging folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_train_snapshot import _write_shard

from eagle3_dagster.publish.export import EXPORTERS
from eagle3_dagster.publish.snapshot import (
    PublishLockOptions,
    SnapshotContent,
    build_snapshot,
    read_manifest,
    sha256_file,
)
from eagle3_dagster.storage import DataDirLocked

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("publish_worker.py")


def _ok(g, k):
    return SimpleNamespace(success=True)


def _start(data: Path, run_id: str, mode: str, ready: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(WORKER), str(data), run_id, mode] + ([str(ready)] if ready else [])
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ready(ready: Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if ready.exists() and ready.read_text():
            return ready.read_text()
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the worker never reached its exporter")


def _staging(data: Path) -> list[str]:
    return sorted(p.name for p in (data / "snapshots").iterdir() if p.name.startswith("."))


def _assert_latest_complete(data: Path) -> str:
    root = data / "snapshots"
    latest = (root / "LATEST").read_text().strip()
    m = read_manifest(root, latest)
    assert m is not None and m["version"] == latest
    for rel, info in {**m["files"], **m["exports"]}.items():
        assert sha256_file(root / latest / rel) == info["sha256"], rel
    return latest


@pytest.mark.integration
def test_two_publisher_processes_at_once_both_succeed_one_after_the_other(tmp_path):
    _write_shard(tmp_path, 0, 3)
    _write_shard(tmp_path, 1, 2)
    a = _start(tmp_path, "run-A", "slow")
    b = _start(tmp_path, "run-B", "slow")
    outs = {}
    for name, p in (("A", a), ("B", b)):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs[name] = (json.loads(out.strip().splitlines()[-1]), err)
    (ra, ea), (rb, eb) = outs["A"], outs["B"]
    assert ra["version"] == rb["version"] == ra["latest"] == rb["latest"]
    assert sorted([ra["created"], rb["created"]]) == [False, True]  # the second found the first's snapshot
    # the one that waited was told who holds the lock, by pid, host and run id, and where the lock is
    lock = tmp_path / "snapshots" / ".publish.lock"
    waited = [(e, other) for e, other in ((ea, b), (eb, a)) if "is locked by" in e]
    assert len(waited) == 1
    line, holder = waited[0]
    run = "run-B" if holder is b else "run-A"
    assert f"pid {holder.pid} on host {socket.gethostname()}, run {run}" in line and str(lock) in line
    assert _staging(tmp_path) == [".publish.lock"]
    assert _assert_latest_complete(tmp_path) == ra["version"]


@pytest.mark.integration
def test_a_publisher_that_may_not_wait_fails_with_one_line_naming_the_holder(tmp_path):
    _write_shard(tmp_path, 0, 3)
    ready = tmp_path / "ready"
    holder = _start(tmp_path, "nightly-2026-12-04", "hang", ready)
    try:
        _wait_ready(ready, holder)
        with pytest.raises(DataDirLocked) as e:
            build_snapshot(
                tmp_path,
                [0],
                _ok,
                SnapshotContent(config={"c": 1}),
                lock=PublishLockOptions(wait_s=0, run_id="backfill"),
            )
        msg = str(e.value)
        assert "\n" not in msg
        assert f"pid {holder.pid} on host {socket.gethostname()}, run nightly-2026-12-04" in msg
        assert str(tmp_path / "snapshots" / ".publish.lock") in msg
        assert not (tmp_path / "snapshots" / "LATEST").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.integration
def test_a_publisher_killed_mid_publish_leaves_latest_complete_and_the_next_publish_removes_its_staging(tmp_path):
    _write_shard(tmp_path, 0, 3)
    first = build_snapshot(tmp_path, [0], _ok, SnapshotContent(config={"c": 1}, exporters=EXPORTERS))
    _write_shard(tmp_path, 1, 2)  # new content: the killed publisher was building another version
    ready = tmp_path / "ready"
    victim = _start(tmp_path, "run-killed", "hang", ready)
    staged = Path(_wait_ready(ready, victim))
    assert staged.parent == tmp_path / "snapshots" and staged.name.startswith(".staging-")
    assert f"-{victim.pid}-" in staged.name  # the attempt's own folder
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert staged.is_dir()  # left behind by the SIGKILL
    assert _assert_latest_complete(tmp_path) == first.version  # LATEST never moved to the unfinished one
    # the kernel released the dead run's lock: the next publish takes it at once, without waiting
    again = build_snapshot(
        tmp_path, [0, 1], _ok, SnapshotContent(config={"c": 1}, exporters=EXPORTERS), lock=PublishLockOptions(wait_s=0)
    )
    assert again.removed_staging == [staged.name]
    assert again.version != first.version and again.rows == 5
    assert _staging(tmp_path) == [".publish.lock"]
    assert _assert_latest_complete(tmp_path) == again.version


def test_a_failed_publish_leaves_no_staging_and_latest_unchanged(tmp_path):
    _write_shard(tmp_path, 0, 3)
    first = build_snapshot(tmp_path, [0], _ok, SnapshotContent(config={"c": 1}, exporters=EXPORTERS))
    _write_shard(tmp_path, 1, 2)

    def broken(staging, exports):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_snapshot(tmp_path, [0, 1], _ok, SnapshotContent(config={"c": 1}, exporters=[*EXPORTERS, broken]))
    assert _staging(tmp_path) == [".publish.lock"]
    assert _assert_latest_complete(tmp_path) == first.version


def test_object_storage_publish_says_its_lock_covers_this_host_only_and_still_excludes_local_publishers(tmp_path):
    import uuid

    from eagle3_dagster.publish.snapshot import PUBLISH_LOCK
    from eagle3_dagster.storage import DataDirLock, LockOptions, data_root

    mem = data_root(f"memory://eagle3-test-{uuid.uuid4().hex[:10]}/data")
    told: list[str] = []
    # nothing to publish (no shard): the lock and its warning come first all the same
    locks = tmp_path / "work" / "locks"
    build_snapshot(
        mem, [], _ok, SnapshotContent(config={}), lock=PublishLockOptions(on_wait=told.append, local_lock_dir=locks)
    )
    lock = DataDirLock(mem, PUBLISH_LOCK, what="snapshot publish", options=LockOptions(local_lock_dir=locks))
    assert not lock.covers_all_hosts and lock.path.parent == locks and lock.path.exists()
    assert told == [lock.host_only_warning()] and "this host only" in told[0] and str(lock.path) in told[0]
    with lock, pytest.raises(DataDirLocked, match=f"pid {os.getpid()} on host"):
        build_snapshot(
            mem,
            [],
            _ok,
            SnapshotContent(config={}),
            lock=PublishLockOptions(wait_s=0, on_wait=told.append, local_lock_dir=locks),
        )
