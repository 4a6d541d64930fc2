"""`eagle3 report` and the HTML report say how old snapshots/LATEST is, and when it is past EAGLE3_SNAPSHOT_MAX_AGE."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT

pytestmark = pytest.mark.integration  # runs the real `eagle3 report` CLI in a subprocess


def _publish(data: Path, version: str, age_s: float) -> None:
    snap = data / "snapshots" / version
    snap.mkdir(parents=True)
    (snap / "manifest.json").write_text(
        json.dumps({"version": version, "created_at": "2026-11-01T02:00:00+00:00", "rows": 3, "shards": []})
    )
    latest = data / "snapshots" / "LATEST"
    latest.write_text(version + "\n")
    t = time.time() - age_s
    os.utime(latest, (t, t))


def _report(data: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_dagster.app.cli",
            "report",
            "--data-dir",
            str(data),
            "--work-dir",
            str(data.parent / "work"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=120,
        env={**os.environ, **env},
    )


def test_report_says_how_old_latest_is_and_flags_a_missed_night(tmp_path):
    data, out = tmp_path / "data", tmp_path / "report.html"
    r = _report(data, out)
    assert r.returncode == 0 and "no snapshot published yet" in r.stderr
    assert "nothing published yet" in out.read_text()

    _publish(data, "abc123", age_s=30 * 3600)  # the last publish was 30 hours ago: a night was missed
    r = _report(data, out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)  # stdout stays the path, for scripts
    assert "LATEST is abc123, published 1d 6h ago" in r.stderr
    assert "OLDER than the allowed 1d 2h (EAGLE3_SNAPSHOT_MAX_AGE)" in r.stderr
    page = out.read_text()
    # the static page is read later: an absolute UTC time, the age only as of the page's build
    published = dt.datetime.fromtimestamp((data / "snapshots" / "LATEST").stat().st_mtime, dt.UTC)
    assert ">stale<" in page and f"published at {published:%Y-%m-%d %H:%M:%S} UTC (1d 6h before this report" in page
    assert " ago" not in page

    os.utime(data / "snapshots" / "LATEST")  # tonight's publish (an identical snapshot rewrites LATEST)
    r = _report(data, out)
    assert "within the allowed 1d 2h" in r.stderr and ">fresh<" in out.read_text()
    # the allowed age is the setting; a bad value is refused by name, without a traceback
    t = time.time() - 60
    os.utime(data / "snapshots" / "LATEST", (t, t))
    r = _report(data, out, EAGLE3_SNAPSHOT_MAX_AGE="10s")
    assert re.search(r"published 1m \d+s ago", r.stderr), r.stderr
    assert "OLDER than the allowed 10s" in r.stderr
    r = _report(data, out, EAGLE3_SNAPSHOT_MAX_AGE="tomorrow")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "EAGLE3_SNAPSHOT_MAX_AGE" in r.stderr and "'tomorrow'" in r.stderr
