"""A changed deployment (eagle3-sim --weight-version --reasoning-scale): what SGLang reports and what the
model produces, next to the unchanged simulator on the same prompt."""

from __future__ import annotations

import httpx
from sim_helpers import KIMI_ARGS, chat_ids, gen

from eagle3_dagster.sim.process import start_simulator


def _reasoning_len(ids: list[int], think_end: int) -> int:
    return ids.index(think_end)


def test_new_weight_version_and_shorter_reasoning(sim, kimi_tok, kimi_profile):
    prompt = chat_ids(kimi_tok, "Explain why the sky is blue, step by step.")
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096, "temperature": 0.6}}
    with start_simulator(
        extra_args=KIMI_ARGS + ["--weight-version", "v2-int4", "--reasoning-scale", "0.2"], ready_timeout=60
    ) as changed:
        info = httpx.get(changed.url + "/model_info", timeout=10).json()
        assert info["weight_version"] == "v2-int4"
        assert httpx.get(sim.url + "/model_info", timeout=10).json()["weight_version"] == "default"
        new = gen(changed, body).json()
        old = gen(sim, body).json()
    assert new["meta_info"]["weight_version"] == "v2-int4" and old["meta_info"]["weight_version"] == "default"
    te = kimi_profile.think_end_id
    r_new, r_old = _reasoning_len(new["output_ids"], te), _reasoning_len(old["output_ids"], te)
    assert 0.1 * r_old < r_new < 0.35 * r_old, (r_new, r_old)
    # the answer after </think> is the same model answer
    assert new["output_ids"][r_new:] == old["output_ids"][r_old:]
    # a bad scale is a one-line startup error naming the flag
    with start_simulator(extra_args=KIMI_ARGS + ["--reasoning-scale", "0"], wait_for="none") as bad:
        bad.proc.wait(timeout=60)
        assert bad.proc.returncode == 2 and "--reasoning-scale must be in (0, 1]" in bad.log_tail()
