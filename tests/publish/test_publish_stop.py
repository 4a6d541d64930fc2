"""A stop (Ctrl-C / SIGTERM) during publish is honoured at the commit point: the snapshot is left complete
but LATEST does not move, StopRequested says so, the report marks the snapshot unpublished and a rerun
publishes it. A `.LATEST.*.tmp` a publisher killed while writing LATEST left is removed by the next one."""

from __future__ import annotations

import datetime as dt
import os
import time

import pytest
from test_train_snapshot import _gates, _write_shard

from eagle3_dagster import stopping
from eagle3_dagster.publish.snapshot import (
    PublishLockOptions,
    SnapshotContent,
    build_snapshot,
    read_latest,
    read_manifest,
    unpublished_versions,
)
from eagle3_dagster.report.model import collect_snapshots
from eagle3_dagster.storage import as_data_path


@pytest.fixture(autouse=True)
def _no_stop_left():
    stopping.reset()
    yield
    stopping.reset()


def test_a_stop_before_the_latest_switch_leaves_latest_and_a_rerun_publishes(tmp_path):
    root = tmp_path / "snapshots"
    _write_shard(tmp_path, 0, 3)
    first = build_snapshot(
        tmp_path, [0], _gates(), SnapshotContent(config={}, now=dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    )
    assert read_latest(root) == first.version
    _write_shard(tmp_path, 0, 4)  # new content: a new version
    stopping.request_stop("SIGTERM received")
    with pytest.raises(stopping.StopRequested, match="before LATEST was switched.*NOT published, LATEST stays"):
        build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}, now=dt.datetime(2026, 12, 2, tzinfo=dt.UTC)))
    assert read_latest(root) == first.version
    (stopped,) = unpublished_versions(root)
    assert read_manifest(root, stopped) is not None  # complete, only not published
    views = {v.version: v for v in collect_snapshots(as_data_path(tmp_path))}
    assert views[stopped].unpublished and not views[first.version].unpublished
    stopping.reset()
    again = build_snapshot(
        tmp_path, [0], _gates(), SnapshotContent(config={}, now=dt.datetime(2026, 12, 3, tzinfo=dt.UTC))
    )
    assert again.version == stopped and read_latest(root) == stopped and not again.created
    assert unpublished_versions(root) == set()


def test_a_stale_latest_tmp_is_removed_under_the_lock_and_a_fresh_one_kept(tmp_path):
    root = tmp_path / "snapshots"
    _write_shard(tmp_path, 0, 3)
    build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}))
    stale = root / ".LATEST.0123abcd.tmp"  # a publisher killed between the tmp write and its rename
    stale.write_text("deadbeef\n")
    old = time.time() - 60
    os.utime(stale, (old, old))
    fresh = root / ".LATEST.fffffff0.tmp"  # newer than our lock: not ours to judge
    fresh.write_text("x\n")
    future = time.time() + 600
    os.utime(fresh, (future, future))
    lines: list[str] = []
    build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}), lock=PublishLockOptions(on_wait=lines.append))
    assert not stale.exists() and fresh.exists()
    assert any(".LATEST.0123abcd.tmp" in line and "killed while writing LATEST" in line for line in lines)


def test_without_latest_every_complete_snapshot_is_unpublished(tmp_path):
    root = tmp_path / "snapshots"
    _write_shard(tmp_path, 0, 3)
    stopping.request_stop("SIGINT received")
    with pytest.raises(stopping.StopRequested, match=r"LATEST stays \(none\)"):
        build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}))
    assert read_latest(root) is None and len(unpublished_versions(root)) == 1
