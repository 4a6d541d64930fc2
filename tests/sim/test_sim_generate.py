"""/generate over real HTTP: response shape, Kimi-shaped output, sampling params, batches, rids, n."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from sim_helpers import KIMI_EOS, KIMI_THINK_END, QWEN_ARGS, chat_ids, faults, gen, stats

from eagle3_dagster.sim.process import start_simulator

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "ping", "description": "Ping."}},
]
TOOLS_TS = (
    "# Tools\n\n## functions\nnamespace functions {\n// Get weather for a city.\ntype get_weather = (_: {\n"
    "  city: string\n}) => any;\n// Ping.\ntype ping = (_: {}) => any;\n}\n"
)


def natural(sim, ids: list[int]) -> list[int]:
    """The model's full output for a prompt (large budget)."""
    r = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_single_request_is_kimi_shaped_and_self_consistent(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "What is 2+2?")
    assert ids[-1] == 163606  # the template prefills <think>
    r = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000, "temperature": 1.0, "top_p": 0.95}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    d = r.json()
    assert set(d) == {"text", "output_ids", "meta_info"}
    out, meta = d["output_ids"], d["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": KIMI_EOS}
    assert out[-1] == KIMI_EOS and out.count(KIMI_EOS) == 1
    assert out.count(KIMI_THINK_END) == 1 and 0 < out.index(KIMI_THINK_END) < len(out) - 1
    assert 163606 not in out  # the prompt already opened the reasoning
    assert meta["completion_tokens"] == len(out) and meta["prompt_tokens"] == len(ids)
    assert meta["reasoning_tokens"] == out.index(KIMI_THINK_END)
    assert meta["weight_version"] == "default" and meta["num_retractions"] == 0
    assert "total_retractions" not in meta
    assert isinstance(meta["e2e_latency"], float) and meta["response_sent_to_client_ts"] > 1.7e9
    # text = decode(output_ids minus the stop token); Kimi's </think> is not special in these files.
    assert d["text"] == kimi_tok.decode(out[:-1], skip_special_tokens=True)
    assert "</think>" in d["text"]
    # the ids are what the real tokenizer makes of the decoded text (the output is re-encodable)
    assert kimi_tok.encode(kimi_tok.decode(out, skip_special_tokens=False), add_special_tokens=False) == out


def test_output_depends_on_prompt_not_rid(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "Name three colours.")
    a = gen(sim, {"input_ids": ids, "rid": "a1", "sampling_params": {"max_new_tokens": 4000}}).json()
    b = gen(sim, {"input_ids": ids, "rid": "b2", "sampling_params": {"max_new_tokens": 4000}}).json()
    c = gen(
        sim, {"input_ids": chat_ids(kimi_tok, "Name four colours."), "sampling_params": {"max_new_tokens": 4000}}
    ).json()
    assert a["meta_info"]["id"] == "a1" and b["meta_info"]["id"] == "b2"
    assert a["output_ids"] == b["output_ids"]
    assert c["output_ids"] != a["output_ids"]


def test_default_max_new_tokens_is_128(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "Explain recursion.")
    full = natural(sim, ids)
    assert len(full) > 128  # outputs are mostly longer than the default, so the trap is visible
    d = gen(sim, {"input_ids": ids}).json()
    assert d["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
    assert d["output_ids"] == full[:128]


def test_max_new_tokens_truncates_with_length(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "Truncate me")
    full = natural(sim, ids)
    d = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 10}}).json()
    assert d["output_ids"] == full[:10]
    assert d["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    assert d["meta_info"]["completion_tokens"] == 10
    z = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}}).json()
    assert z["output_ids"] == [] and z["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_stop_token_ids_stop_at_think_end_and_include_it(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "Stop at the end of thinking")
    full = natural(sim, ids)
    d = gen(
        sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000, "stop_token_ids": [KIMI_THINK_END]}}
    ).json()
    cut = full.index(KIMI_THINK_END) + 1
    assert d["output_ids"] == full[:cut]
    assert d["meta_info"]["finish_reason"] == {"type": "stop", "matched": KIMI_THINK_END}
    assert d["text"] == kimi_tok.decode(full[: cut - 1], skip_special_tokens=True)  # stop token trimmed from text


def test_ignore_eos_runs_past_the_stop_token(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "Ignore eos")
    full = natural(sim, ids)
    m = len(full) + 20
    d = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": m, "ignore_eos": True}}).json()
    assert d["meta_info"]["finish_reason"] == {"type": "length", "length": m}
    assert len(d["output_ids"]) == m and d["output_ids"][: len(full)] == full  # EOS emitted, then more tokens


def test_min_new_tokens_masks_eos(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "min new tokens")
    full = natural(sim, ids)
    mn = len(full) + 5
    d = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000, "min_new_tokens": mn}}).json()
    out = d["output_ids"]
    assert len(out) > mn and out[-1] == KIMI_EOS and KIMI_EOS not in out[:-1]
    assert d["meta_info"]["finish_reason"] == {"type": "stop", "matched": KIMI_EOS}
    assert out[: len(full) - 1] == full[:-1]


def test_stop_vs_length_precedence_per_version(sim, sim059, kimi_tok):
    ids = chat_ids(kimi_tok, "Precedence")
    full = natural(sim, ids)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": len(full)}}
    new, old = gen(sim, body).json(), gen(sim059, body).json()
    assert new["output_ids"] == old["output_ids"] == full
    assert new["meta_info"]["finish_reason"] == {"type": "stop", "matched": KIMI_EOS}
    assert old["meta_info"]["finish_reason"] == {"type": "length", "length": len(full)}
    assert "total_retractions" in old["meta_info"] and "reasoning_tokens" not in old["meta_info"]
    assert new["text"] == kimi_tok.decode(full[:-1], skip_special_tokens=True)  # stop: stop token trimmed
    assert old["text"] == kimi_tok.decode(full, skip_special_tokens=True)  # length: full decode, specials skipped


def test_text_flags_affect_text_only(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "Text flags")
    base = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()
    raw = gen(
        sim,
        {
            "input_ids": ids,
            "sampling_params": {
                "max_new_tokens": 4000,
                "skip_special_tokens": False,
                "spaces_between_special_tokens": False,
                "no_stop_trim": True,
            },
        },
    ).json()
    assert raw["output_ids"] == base["output_ids"]
    assert raw["text"].endswith("<|im_end|>") and not base["text"].endswith("<|im_end|>")


def test_put_and_unknown_top_level_keys(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "PUT works")
    r = gen(
        sim,
        {"input_ids": ids, "sampling_params": {"max_new_tokens": 5}, "whatever": {"x": 1}, "model": "m"},
        method="PUT",
    )
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 5


def test_batch_keeps_order_and_expands_string_rid(sim, kimi_tok):
    p0, p1 = chat_ids(kimi_tok, "batch zero"), chat_ids(kimi_tok, "batch one")
    r = gen(sim, {"input_ids": [p0, p1], "rid": "job", "sampling_params": {"max_new_tokens": 4000}})
    assert r.status_code == 200
    d = r.json()
    assert isinstance(d, list) and [x["meta_info"]["id"] for x in d] == ["job_0", "job_1"]
    assert d[0]["output_ids"] == natural(sim, p0) and d[1]["output_ids"] == natural(sim, p1)
    # per-item sampling params
    r = gen(
        sim,
        {"input_ids": [p0, p1], "rid": ["a", "b"], "sampling_params": [{"max_new_tokens": 3}, {"max_new_tokens": 4}]},
    )
    assert [len(x["output_ids"]) for x in r.json()] == [3, 4]


def test_batch_rid_rules(sim, sim059, kimi_tok):
    p = chat_ids(kimi_tok, "rid rules")
    r = gen(sim, {"input_ids": [p, p], "rid": ["only-one"]})
    assert r.status_code == 400 and "mismatch" in r.json()["error"]["message"]
    r = gen(sim, {"input_ids": [p, p], "rid": ["dup", "dup"], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "Duplicate request IDs detected within the request: ['dup']"}}
    r = gen(sim059, {"input_ids": [p, p], "rid": ["dup", "dup"], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200  # 0.5.9 has no duplicate check


def test_n_samples_are_prompt_major_with_fresh_ids(sim, kimi_tok):
    p0, p1 = chat_ids(kimi_tok, "n zero"), chat_ids(kimi_tok, "n one")
    r = gen(sim, {"input_ids": [p0, p1], "rid": "mine", "sampling_params": {"max_new_tokens": 4000, "n": 2}})
    d = r.json()
    assert r.status_code == 200 and len(d) == 4
    rids = [x["meta_info"]["id"] for x in d]
    assert len(set(rids)) == 4 and all(re.fullmatch(r"[0-9a-f]{32}", x) for x in rids)
    assert d[0]["output_ids"] == natural(sim, p0) and d[2]["output_ids"] == natural(sim, p1)  # prompt-major
    assert d[0]["output_ids"] != d[1]["output_ids"]  # samples of one prompt differ
    single = gen(sim, {"input_ids": p0, "sampling_params": {"max_new_tokens": 5, "n": 2}}).json()
    assert isinstance(single, list) and len(single) == 2
    # n must agree across a per-item list
    r = gen(sim, {"input_ids": [p0, p1], "sampling_params": [{"n": 1}, {"n": 2}]})
    assert r.status_code == 400


def test_cached_tokens_is_longest_prefix_seen(sim, kimi_tok):
    flush = httpx.post(sim.url + "/flush_cache", timeout=5)
    assert flush.status_code == 200 and flush.text.startswith("Cache flushed.")
    system = [1000 + i for i in range(40)]
    a = system + [5, 6, 7]
    first = gen(sim, {"input_ids": a, "sampling_params": {"max_new_tokens": 1}}).json()["meta_info"]
    assert first["cached_tokens"] == 0
    again = gen(sim, {"input_ids": a, "sampling_params": {"max_new_tokens": 1}}).json()["meta_info"]
    assert again["cached_tokens"] == len(a) - 1  # capped at prompt_len - 1
    other = gen(sim, {"input_ids": system + [9, 9], "sampling_params": {"max_new_tokens": 1}}).json()["meta_info"]
    assert other["cached_tokens"] == len(system)
    httpx.post(sim.url + "/flush_cache", timeout=5)
    assert (
        gen(sim, {"input_ids": a, "sampling_params": {"max_new_tokens": 1}}).json()["meta_info"]["cached_tokens"] == 0
    )


def test_tool_call_section_names_a_declared_tool(sim, kimi_tok):
    calls = 0
    for i in range(12):
        msgs = [{"role": "user", "content": f"Weather question number {i}?"}]
        ids = list(
            kimi_tok.apply_chat_template(
                msgs, tools=TOOLS, tools_ts_str=TOOLS_TS, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        out = natural(sim, ids)
        if 163595 not in out:
            continue
        calls += 1
        text = kimi_tok.decode(out, skip_special_tokens=False)
        m = re.search(
            r"</think>.*<\|tool_calls_section_begin\|>(.*)<\|tool_calls_section_end\|><\|im_end\|>$", text, re.S
        )
        assert m, text[-300:]
        found = re.findall(
            r"<\|tool_call_begin\|>functions\.(\w+):(\d+)<\|tool_call_argument_begin\|>(\{[^<]*\})<\|tool_call_end\|>",
            m.group(1),
        )
        assert 1 <= len(found) <= 2 and "".join(
            f"<|tool_call_begin|>functions.{n}:{k}<|tool_call_argument_begin|>{a}<|tool_call_end|>" for n, k, a in found
        ) == m.group(1)
        for k, (name, index, args) in enumerate(found):
            assert name in {"get_weather", "ping"} and index == str(k)  # ids count the conversation's calls
            if name == "get_weather":
                assert '"city"' in args
        for marker in (163595, 163596):
            assert out.count(marker) == 1
        for marker in (163597, 163598, 163599):
            assert out.count(marker) == len(found)
    assert calls >= 3
    # without tools: never a tool call
    for i in range(5):
        assert 163595 not in natural(sim, chat_ids(kimi_tok, f"No tools here {i}"))


def test_instant_mode_prompt_gets_answer_only(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "Quick answer", thinking=False)
    assert ids[-2:] == [163606, KIMI_THINK_END]
    out = natural(sim, ids)
    assert KIMI_THINK_END not in out and out[-1] == KIMI_EOS


def test_qwen3_shape(qsim, qwen_tok):
    ids = list(
        qwen_tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    d = gen(qsim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()
    out = d["output_ids"]
    assert out[0] == 151667 and qwen_tok.decode(out[:2]) == "<think>\n"
    assert out.count(151668) == 1 and out[-1] == 151645
    assert d["meta_info"]["finish_reason"] == {"type": "stop", "matched": 151645}
    assert qwen_tok.decode(out).split("</think>")[1].startswith("\n\n")
    off = list(
        qwen_tok.apply_chat_template(
            [{"role": "user", "content": "hi"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            enable_thinking=False,
        )
    )
    out = gen(qsim, {"input_ids": off, "sampling_params": {"max_new_tokens": 4000}}).json()["output_ids"]
    assert 151667 not in out and 151668 not in out and out[-1] == 151645


def test_modes_reproduce_output_bugs(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "bug modes")
    full = natural(sim, ids)
    faults(sim, mode="drop-think-end")
    d = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()
    assert KIMI_THINK_END not in d["output_ids"]
    assert d["output_ids"] == [t for t in full if t != KIMI_THINK_END]
    faults(sim, mode="echo-prompt-tail")
    d = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()
    assert d["output_ids"] == ids[-3:] + full
    assert d["meta_info"]["completion_tokens"] == len(full) != len(d["output_ids"])
    assert stats(sim)["mode"] == "echo-prompt-tail"


def test_return_logprob_triples_match_output_ids(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "logprobs")
    d = gen(
        sim, {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 8}}
    ).json()
    lps = d["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == d["output_ids"] and all(lp <= 0 for lp, _, _ in lps)
    assert all(len(x) == 2 for x in d["meta_info"]["output_top_logprobs"])


@pytest.mark.integration
def test_mode_flag_on_the_command_line():
    """--mode is the CLI form of the runtime switch tested above."""
    ids = [1000 + i for i in range(10)]
    with start_simulator(extra_args=QWEN_ARGS + ["--mode", "echo-prompt-tail"]) as s:
        d = gen(s, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()
        assert stats(s)["mode"] == "echo-prompt-tail"
    assert d["output_ids"][:3] == ids[-3:] and len(d["output_ids"]) == d["meta_info"]["completion_tokens"] + 3


def test_max_new_tokens_null_runs_to_the_natural_end(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "no budget")
    d = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": None}}).json()
    assert d["output_ids"] == natural(sim, ids) and d["meta_info"]["finish_reason"]["type"] == "stop"


def test_stop_string_cuts_text_and_keeps_ids_through_it(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "stop strings")
    full = natural(sim, ids)
    d = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000, "stop": ["</think>"]}}).json()
    assert d["meta_info"]["finish_reason"] == {"type": "stop", "matched": "</think>"}
    assert d["output_ids"] == full[: full.index(KIMI_THINK_END) + 1]
    assert "</think>" not in d["text"]
    kept = gen(
        sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000, "stop": "</think>", "no_stop_trim": True}}
    ).json()
    assert kept["text"].endswith("</think>")


def test_text_prompt_and_prompt_token_ids(sim, sim059, kimi_tok):
    text = kimi_tok.decode(chat_ids(kimi_tok, "text prompt"), skip_special_tokens=False)
    body = {"text": text, "return_prompt_token_ids": True, "sampling_params": {"max_new_tokens": 3}}
    d = gen(sim, body).json()
    assert d["prompt_token_ids"] == chat_ids(kimi_tok, "text prompt")
    assert d["output_ids"] == natural(sim, chat_ids(kimi_tok, "text prompt"))[:3]
    assert "prompt_token_ids" not in gen(sim059, body).json()


def test_n_samples_share_the_warmed_prefix(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "fresh prompt for n warmup")
    d = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "n": 3}}).json()
    assert [x["meta_info"]["cached_tokens"] for x in d] == [len(ids) - 1] * 3


def test_qwen3_tool_call_names_a_declared_tool(qsim, qwen_tok):
    calls = set()
    for i in range(10):
        ids = list(
            qwen_tok.apply_chat_template(
                [{"role": "user", "content": f"weather {i}"}],
                tools=TOOLS,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        out = gen(qsim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()["output_ids"]
        text = qwen_tok.decode(out, skip_special_tokens=False)
        m = re.search(r"</think>\n\n((?:<tool_call>\n\{.*?\}\n</tool_call>\n?)+)<\|im_end\|>$", text, re.S)
        if m:
            bodies = re.findall(r"<tool_call>\n(\{.*?\})\n</tool_call>", m.group(1), re.S)
            assert out.count(151657) == out.count(151658) == len(bodies) >= 1
            calls.update(json.loads(b)["name"] for b in bodies)
    assert calls and calls <= {"get_weather", "ping"}
