"""A server that goes away mid-shard and comes back on the same URL serving another model (a redeploy,
an operator restarting it with other weights). SGLang answers do not name the model and a fresh server's
weight_version is "default" again, so only /model_info tells: it is read again whenever the endpoint comes
back. Before, it was read once per run, and the new model's tokens were stored under the old revision.
Real simulator processes over HTTP, real Parquet.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.endpoint_info import EndpointRefusedError

pytestmark = pytest.mark.integration

OTHER_MODEL = "someone/Another-Model-1T"


def test_a_server_back_with_another_model_is_refused_never_mixed_into_the_shard(start_sim, tmp_path: Path):
    prompts = make_prompts(16, seed=181)
    sim = start_sim("--token-latency-ms", "4")
    model0 = httpx.get(sim.url + "/model_info", timeout=5).json()["model_path"]
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
    other = start_sim("--token-latency-ms", "4", "--model-path", OTHER_MODEL, port=sim.sp.port)  # same URL
    t.join(60)
    assert not t.is_alive()
    # the step fails, naming what the URL serves now and what the shard was started with
    err = box.get("error")
    assert isinstance(err, EndpointRefusedError), box
    assert OTHER_MODEL in str(err) and model0 in str(err)
    assert other.requests() == 0  # not one request to the other model
    gens = read_generations(out)
    assert 0 < gens.height < prompts.height  # what the first server answered is kept (a rerun resumes)
    assert set(gens["model_revision"]) == {f"{model0}@default"}
