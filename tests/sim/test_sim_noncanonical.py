"""`--noncanonical-rate`: outputs a real sampler emits — the same text as usual, in a token split the
tokenizer would never produce — at a configurable share of samples, reproducibly per prompt."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sim_helpers import KIMI_ARGS, KIMI_DIR, chat_ids, gen, stats

from eagle3_dagster.sim.process import SimProcess, start_simulator

pytestmark = pytest.mark.integration

N = 24


@pytest.fixture(scope="module")
def ncsim() -> Iterator[SimProcess]:
    with start_simulator(extra_args=KIMI_ARGS + ["--noncanonical-rate", "0.5"], ready_timeout=60) as s:
        yield s


def _batch(s: SimProcess, prompts: list[list[int]]) -> list[dict[str, Any]]:
    r = gen(s, {"input_ids": prompts, "sampling_params": {"max_new_tokens": 4000}}, timeout=60)
    r.raise_for_status()
    return r.json()


def test_splits_keep_the_text_and_break_canonical_encoding(sim, ncsim, kimi_tok):
    prompts = [chat_ids(kimi_tok, f"Question {i}: what is {i} squared? 答案?") for i in range(N)]
    canonical, split = _batch(sim, prompts), _batch(ncsim, prompts)
    changed = 0
    for c, s in zip(canonical, split):
        c_ids, s_ids = c["output_ids"], s["output_ids"]
        dec = lambda ids: kimi_tok.decode(ids, skip_special_tokens=False)
        assert dec(s_ids) == dec(c_ids) and s["text"] == c["text"]  # the text is unchanged
        assert s_ids[-1] == c_ids[-1]  # still ends with the end-of-turn token
        if s_ids != c_ids:
            changed += 1
            # up to three tokens, each replaced by two whose bytes concatenate to it
            assert 1 <= len(s_ids) - len(c_ids) <= 3
            assert kimi_tok.encode(dec(s_ids), add_special_tokens=False) != s_ids
            assert s["meta_info"]["completion_tokens"] == len(s_ids)
        else:
            assert kimi_tok.encode(dec(c_ids)[: -len("<|im_end|>")], add_special_tokens=False) == c_ids[:-1]
    st = stats(ncsim)["noncanonical"]
    assert st["samples_split"] == changed and st["rejected_checks"] == 0
    assert 0.2 * N <= changed <= 0.8 * N  # rate 0.5
    # a retried request reproduces the sample exactly (the split is a function of the prompt)
    assert [x["output_ids"] for x in _batch(ncsim, prompts)] == [x["output_ids"] for x in split]


def test_bad_rate_is_a_clear_startup_error():
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_dagster.sim.server",
            "--model",
            "kimi-k2.5",
            "--tokenizer",
            KIMI_DIR,
            "--port",
            "0",
            "--noncanonical-rate",
            "1.5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert "--noncanonical-rate must be within [0, 1], got 1.5" in p.stderr
