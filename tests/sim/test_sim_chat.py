"""Why the pipeline uses /generate: the same prompt through the emulated OpenAI chat endpoint loses `</think>`."""

from __future__ import annotations

import httpx
from sim_helpers import KIMI_THINK_END, chat_ids, gen

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


def test_generate_keeps_think_end_while_chat_puts_everything_in_reasoning(sim, kimi_tok):
    ids = chat_ids(kimi_tok, MSGS[0]["content"])
    g = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()
    assert KIMI_THINK_END in g["output_ids"]
    c = httpx.post(
        sim.url + "/v1/chat/completions", json={"model": "x", "messages": MSGS, "max_tokens": 4000}, timeout=30
    ).json()
    assert c["sim_prompt_ids"] == ids and c["sim_output_ids"] == g["output_ids"]  # same tokens generated
    msg = c["choices"][0]["message"]
    assert msg["content"] is None  # the answer was swallowed into reasoning
    answer = kimi_tok.decode(g["output_ids"][g["output_ids"].index(KIMI_THINK_END) + 1 : -1])
    assert msg["reasoning_content"].endswith(answer.strip()) and "</think>" not in msg["reasoning_content"]
    assert c["choices"][0]["finish_reason"] == "stop" and c["usage"]["completion_tokens"] == len(g["output_ids"])


def test_chat_split_is_right_when_special_tokens_are_kept(sim, kimi_tok):
    ids = chat_ids(kimi_tok, MSGS[0]["content"])
    out = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()["output_ids"]
    c = httpx.post(
        sim.url + "/v1/chat/completions",
        json={"messages": MSGS, "max_tokens": 4000, "skip_special_tokens": False},
        timeout=30,
    ).json()
    msg = c["choices"][0]["message"]
    cut = out.index(KIMI_THINK_END)
    assert msg["reasoning_content"] == kimi_tok.decode(out[:cut])
    assert msg["content"] == kimi_tok.decode(out[cut + 1 : -1])


def test_qwen3_chat_split_works(qsim, qwen_tok):
    c = httpx.post(qsim.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4000}, timeout=30).json()
    msg = c["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"] and "</think>" not in msg["content"]
