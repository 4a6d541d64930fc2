"""A drafter swapped under a running shard. Answers do not say which drafter served them and the drafter was
read from /server_info once, at the start: a server that swapped drafters between two health probes (a quick
restart, a worker replaced behind a router) had every later row attributed to the old drafter, and the run said
SUCCESS. Now the drafter is read again before each chunk of rows is written and whenever an endpoint comes back:
at a change the run stops, naming both drafters; the rows answered since the drafter was last confirmed are not
stored; every stored row names the drafter that served it, and the rerun generates the rest under the new one.
Real simulator processes over HTTP (fleet fault drafter_after / next_draft_model_path), real Parquet.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.endpoint_info import EndpointRefusedError, ServingChangedError
from eagle3_dagster.sim.record import read_recorded

pytestmark = pytest.mark.integration

N = 10
OLD, NEW = "test/kimi-eagle3-a", "test/kimi-eagle3-b"
SPEC = ("--speculative-draft-model-path", OLD, "--speculative-num-draft-tokens", "4")


def test_a_drafter_swapped_mid_run_stops_the_run_and_no_row_names_the_wrong_drafter(start_sim, tmp_path: Path):
    log = tmp_path / "requests.jsonl"
    sim = start_sim(*SPEC, "--record-requests", str(log))
    sim.faults(drafter_after=4, next_draft_model_path=NEW)  # requests 1-4 under OLD, from the 5th on NEW
    prompts = make_prompts(N, seed=808)
    out = tmp_path / "s"
    cfg = make_config(sim.url, max_in_flight=1, flush_every_n=2)  # one request at a time: a known order
    with pytest.raises(ServingChangedError) as ei:
        generate_shard(prompts, out, cfg)
    msg = str(ei.value)
    assert OLD in msg and NEW in msg and "its drafter changed under the running shard" in msg
    assert "not stored" in msg and "rerun" in msg
    first_four = {r["rid"] for r in read_recorded(log)[:4]}
    rows = read_generations(out)
    # only answers confirmed under OLD were written, each naming OLD: none of NEW's answers is called OLD's
    assert 0 < rows.height <= 4 and set(rows["rid"]) <= first_four
    assert set(rows["spec_draft_model_path"]) == {OLD}

    rerun = generate_shard(prompts, out, cfg)  # the rest, under the drafter the server runs now
    assert rerun.skipped_cached == rows.height and rerun.succeeded == N - rows.height and rerun.failed == 0
    after = read_generations(out)
    by_drafter = dict(zip(after["rid"], after["spec_draft_model_path"]))
    assert {by_drafter[r] for r in rows["rid"]} == {OLD}
    assert {d for r, d in by_drafter.items() if r not in set(rows["rid"])} == {NEW}


def test_a_server_back_from_a_restart_with_another_drafter_stops_the_run(start_sim, tmp_path: Path):
    prompts = make_prompts(16, seed=809)
    sim = start_sim(*SPEC, "--token-latency-ms", "4")
    sim.faults(crash_after=7)  # the 7th /generate kills the server mid-response
    out = tmp_path / "s"
    cfg = make_config(sim.url, max_in_flight=4, breaker_cooldown_s=0.2, wait_for_endpoint_s=20.0)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["report"] = generate_shard(prompts, out, cfg)
        except Exception as e:  # the test asserts which one
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while sim.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sim.proc.poll() is not None, "the crash fault did not fire"
    time.sleep(0.5)  # the client sees connection refused meanwhile
    swapped = start_sim(
        "--speculative-draft-model-path",
        NEW,
        "--speculative-num-draft-tokens",
        "4",
        "--token-latency-ms",
        "4",
        port=sim.sp.port,
    )
    t.join(60)
    assert not t.is_alive()
    err = box.get("error")
    # the endpoint is refused for the run (the only one: the step fails), naming both drafters
    assert isinstance(err, ServingChangedError | EndpointRefusedError), box
    assert OLD in str(err) and NEW in str(err)
    assert swapped.requests() == 0  # not one request to the swapped drafter under the old drafter's name
    rows = read_generations(out)
    assert set(rows["spec_draft_model_path"]) <= {OLD}
