"""A wrong EAGLE3_SGLANG_URL in a user's first hour: a cached shard needs no server, anything else fails in
seconds with one line naming the URL and what answered, and no stack trace reaches the terminal."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from proc_helpers import EAGLE3, command_env

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.sim.process import free_port

pytestmark = pytest.mark.integration


def _demo(env: dict[str, str], shards: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [EAGLE3, "demo", "--shards", shards],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a 10-minute endpoint wait fails the bound below, not this timeout
    )
    return r, time.monotonic() - t0


def test_a_dead_url_costs_nothing_when_cached_and_seconds_otherwise(tmp_path: Path):
    env = command_env(tmp_path)
    first, _ = _demo(env, "0000")  # the demo's own simulator: shard 0000 is generated and stored
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]

    dead = f"http://127.0.0.1:{free_port()}"
    env["EAGLE3_SGLANG_URL"] = dead
    cached, took = _demo(env, "0000")
    out = cached.stdout + cached.stderr
    assert took < 60, f"{took:.0f}s for a shard with nothing to generate:\n{out[-3000:]}"
    assert "waiting for an SGLang endpoint" not in out and "NoEndpointError" not in out, out[-3000:]
    assert "no SGLang endpoint answers; all" in out and "nothing to send" in out, out[-3000:]
    assert cached.returncode == 0 and "result:     SUCCESS" in out, out[-3000:]

    fresh, took = _demo(env, "0001")  # nothing stored: the server is needed and is not there
    out = fresh.stdout + fresh.stderr
    assert took < 90, f"{took:.0f}s to name a dead endpoint:\n{out[-3000:]}"
    assert fresh.returncode != 0
    # named before any work (ingest, tokenize), then again by the shard that needed it
    assert fresh.stdout.splitlines()[0] == (
        f"[demo] warning: EAGLE3_SGLANG_URL {dead}: connection refused; no server there: start it, or fix "
        "EAGLE3_SGLANG_URL (unset, `eagle3 demo` starts its own simulator); a shard with prompts to send fails"
    ), fresh.stdout[:2000]
    assert "Traceback" not in out and "Stack Trace" not in out, out[-5000:]
    named = [ln for ln in out.splitlines() if ln.startswith("error:") and f"{dead}: connection refused" in ln]
    assert named, out[-3000:]
    nxt = [ln for ln in out.splitlines() if ln.startswith("next:")]
    assert len(nxt) == 1 and "EAGLE3_SGLANG_URL" in nxt[0] and "inspect" not in nxt[0], nxt
