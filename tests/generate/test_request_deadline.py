"""A server that trickles its answer and never finishes (fleet fault trickle): a byte every fraction of a second
keeps every per-read timeout (non-streamed) and, on a stream, every idle timer that counts bytes from ever
firing. Each request has an overall deadline (EAGLE3_REQUEST_DEADLINE_S): past it the attempt is abandoned and
aborted on the server, and the sample fails loudly with reason request_deadline (not permanent: the next run
sends it again). On a stream, bytes that complete no SSE event are silence: the stall timeout catches them.
Real simulator over HTTP, real Parquet. Before, each of these runs hung for as long as the server trickled.
"""

from __future__ import annotations

import logging
import time

import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generation_errors, read_generations

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

N = 4
TICK_S = 0.2  # the trickle: one byte (or one SSE comment) this often, far inside every timeout below


def _idle(sim, within_s: float = 10.0) -> bool:
    """The trickled request left the server (aborted, or its connection closed)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if sim.stats()["in_flight"] == 0:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("stream", "shape"), [(False, "bytes"), (True, "keepalive")])
def test_an_answer_that_never_finishes_fails_at_the_request_deadline(clean_sim, tmp_path, caplog, stream, shape):
    prompts = make_prompts(N, seed=601)
    clean_sim.faults(trickle=1, trickle_every_s=TICK_S, trickle_as=shape)
    out = tmp_path / "s"
    # every per-read and stall timeout is longer than the deadline: only the deadline can end the request
    cfg = make_config(clean_sim.url, stream=stream, read_timeout_s=30.0, stall_timeout_s=30.0, request_deadline_s=8.0)
    caplog.set_level(logging.WARNING)
    rep = generate_shard(prompts, out, cfg)
    assert (rep.succeeded, rep.failed) == (N - 1, 1) and rep.reconciles
    assert rep.errors_by_kind == {"request_deadline": 1}
    [row] = read_generation_errors(out).iter_rows(named=True)
    assert "no complete answer within the request deadline of 8s (EAGLE3_REQUEST_DEADLINE_S)" in row["detail"]
    assert row["sample_id"] not in set(read_generations(out)["sample_id"])
    assert any("request_deadline" in r.getMessage() or "request deadline" in r.getMessage() for r in caplog.records)
    assert _idle(clean_sim)  # aborted on the server, not left trickling
    rep2 = generate_shard(prompts, out, cfg)  # not permanent: the next run sends it again
    assert (rep2.skipped_cached, rep2.succeeded, rep2.failed) == (N - 1, 1, 0)


def test_a_stream_of_bytes_that_complete_no_event_is_a_stall(clean_sim, tmp_path):
    prompts = make_prompts(N, seed=602)
    clean_sim.faults(trickle=1, trickle_every_s=TICK_S, trickle_as="bytes")
    out = tmp_path / "s"
    cfg = make_config(
        clean_sim.url,
        stream=True,
        first_chunk_timeout_s=1.0,
        stall_timeout_s=1.0,
        max_retries=0,
        request_deadline_s=60.0,
    )
    rep = generate_shard(prompts, out, cfg)
    assert (rep.succeeded, rep.failed) == (N - 1, 1)
    assert rep.errors_by_kind == {"retries_exhausted": 1}  # caught within a second, not at the deadline
    assert rep.failure_details["retries_exhausted"].startswith("stall after 1 attempts")
    assert "stream silent for 1s waiting for the first chunk" in rep.failure_details["retries_exhausted"]
    assert _idle(clean_sim)


def test_the_deadline_is_a_setting_with_bounds():
    from eagle3_dagster.config import Settings, SettingsError
    from eagle3_dagster.generate.config import GenerationConfig, deployment_fields

    # one default, declared with the setting: GenerationConfig's is read from it
    assert Settings.from_env({}).fleet.request_deadline_s == 10800.0
    assert (
        GenerationConfig(endpoints=("http://x:1",), max_new_tokens=8, temperature=1, top_p=1).request_deadline_s
        == 10800
    )
    s = Settings.from_env({"EAGLE3_REQUEST_DEADLINE_S": "7200"})
    assert deployment_fields(s)["request_deadline_s"] == 7200.0
    for bad in ("0", "-5", "5", "1e9", "soon"):
        with pytest.raises(SettingsError, match="EAGLE3_REQUEST_DEADLINE_S"):
            Settings.from_env({"EAGLE3_REQUEST_DEADLINE_S": bad})
