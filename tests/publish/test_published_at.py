"""A publish that finds the content LATEST already names keeps the first "published at" and says
"unchanged since"; LATEST is still rewritten (its age is the freshness signal)."""

from __future__ import annotations

import datetime as dt
import json
import os
from types import SimpleNamespace

from test_train_snapshot import _gates, _write_shard

from eagle3_dagster.publish.snapshot import SnapshotContent, build_snapshot
from eagle3_dagster.report.charts import top_section
from eagle3_dagster.report.html import latest_age

DAY = dt.timedelta(days=1)


def _attempt(data) -> dict:
    return json.loads((data / "gates" / "publish" / "last.json").read_text())


def _manifest(snap) -> dict:
    return json.loads((snap.path / "manifest.json").read_text())


def test_an_identical_rerun_keeps_published_at_and_says_unchanged_since(tmp_path):
    _write_shard(tmp_path, 0, 3)
    first = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=3)
    a = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}, now=first))
    latest = tmp_path / "snapshots" / "LATEST"
    os.utime(latest, (first.timestamp(), first.timestamp()))  # LATEST written at that first publish
    assert _manifest(a)["published_at"] == first.isoformat()
    age = latest_age(tmp_path, max_age=DAY)
    assert age is not None and age.unchanged_since is None
    assert age.describe().startswith(f"LATEST is {a.version}, published 3h 0m ago")

    b = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}))  # tonight: nothing changed
    assert (b.version, b.created) == (a.version, False)
    assert _manifest(b)["published_at"] == first.isoformat()
    att = _attempt(tmp_path)
    assert att["published_at"] == first.isoformat() and att["at"] > first.isoformat()
    page = "".join(top_section(SimpleNamespace(attempt=att, snapshots=[], shards=[])))
    assert f"unchanged since {first.isoformat()}" in page and "published at" not in page
    # the rerun is still a publish for freshness: LATEST is young, the first publish is named
    age = latest_age(tmp_path, max_age=DAY)
    assert age is not None and not age.stale and age.unchanged_since == first
    assert f"unchanged since {first.isoformat()} (published again 0s ago" in age.describe()
    assert "unchanged since" in age.describe(for_page=True)


def test_new_content_and_a_return_to_earlier_content_are_new_publishes(tmp_path):
    t = [dt.datetime(2026, 12, d, 2, tzinfo=dt.UTC) for d in (1, 2, 3)]
    _write_shard(tmp_path, 0, 3)
    a = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}, now=t[0]))
    _write_shard(tmp_path, 0, 4)
    b = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}, now=t[1]))
    assert _manifest(b)["published_at"] == t[1].isoformat() != _manifest(a)["published_at"]
    page = "".join(top_section(SimpleNamespace(attempt=_attempt(tmp_path), snapshots=[], shards=[])))
    assert f"published at {t[1].isoformat()}" in page and "unchanged" not in page
    _write_shard(tmp_path, 0, 3)  # back to the first content: LATEST moves to it now
    again = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}, now=t[2]))
    assert again.version == a.version and _manifest(again)["published_at"] == t[2].isoformat()
