"""Streaming (SSE framing, cumulative chunks, batch index) and the auxiliary endpoints."""

from __future__ import annotations

import json

import httpx
from sim_helpers import KIMI_EOS, QWEN_ARGS, chat_ids, gen, sse_events

from eagle3_dagster.sim.process import start_simulator


def test_stream_is_cumulative_and_ends_with_done(sim, kimi_tok):
    ids = chat_ids(kimi_tok, "stream me")
    full = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()
    r = gen(
        sim,
        {
            "input_ids": ids,
            "stream": True,
            "rid": "s1",
            "sampling_params": {"max_new_tokens": 4000, "stream_interval": 7},
        },
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r.text)
    assert ev[-1] == "[DONE]"
    chunks = [json.loads(e) for e in ev[:-1]]
    assert len(chunks) >= 3
    prev: list[int] = []
    for c in chunks:
        assert set(c) == {"text", "output_ids", "meta_info"}  # no index for a single request
        assert c["output_ids"][: len(prev)] == prev  # cumulative
        prev = c["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["output_ids"] == full["output_ids"] and last["text"] == full["text"]
    assert last["meta_info"]["finish_reason"] == {"type": "stop", "matched": KIMI_EOS}
    assert last["meta_info"]["completion_tokens"] == len(full["output_ids"])
    assert "response_sent_to_client_ts" in chunks[0]["meta_info"]
    assert "e2e_latency" in last["meta_info"] and "e2e_latency" not in chunks[0]["meta_info"]
    assert all(c["meta_info"]["id"] == "s1" for c in chunks)


def test_batch_stream_chunks_carry_index(sim, kimi_tok):
    p0, p1 = chat_ids(kimi_tok, "batch stream 0"), chat_ids(kimi_tok, "batch stream 1")
    r = gen(sim, {"input_ids": [p0, p1], "stream": True, "sampling_params": {"max_new_tokens": 12}})
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    assert {c["index"] for c in chunks} == {0, 1}
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"]}
    assert len(finals[0]["output_ids"]) == len(finals[1]["output_ids"]) == 12


def test_health_model_and_server_info(sim, sim059):
    for s in (sim, sim059):
        for p in ("/health", "/health_generate"):
            r = httpx.get(s.url + p)
            assert r.status_code == 200 and r.content == b""
    mi = httpx.get(sim.url + "/model_info").json()
    assert mi == httpx.get(sim.url + "/get_model_info").json()
    assert mi["model_path"] == "moonshotai/Kimi-K2.5" and mi["is_generation"] is True
    assert mi["weight_version"] == "default" and mi["reasoning_parser"] == "kimi_k2"
    old = httpx.get(sim059.url + "/model_info").json()
    assert "served_model_name" not in old and "reasoning_parser" not in old
    si = httpx.get(sim.url + "/server_info").json()
    assert set(httpx.get(sim.url + "/get_server_info").json()) == set(si)
    assert si["version"] == "0.5.23" and si["context_length"] == 8192 and si["max_running_requests"] == 64
    assert si["max_total_num_tokens"] == 6000 and isinstance(si["internal_states"], list)
    assert {"last_gen_throughput", "memory_usage"} <= set(si["internal_states"][0])
    assert si["frontend"] == "python"
    assert httpx.get(sim059.url + "/server_info").json()["version"] == "0.5.9"
    assert httpx.get(sim.url + "/ready").status_code == 200
    assert httpx.get(sim059.url + "/ready").status_code == 404  # no /ready in 0.5.9
    models = httpx.get(sim.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["max_model_len"] == 8192


def test_tokenize_detokenize_round_trip(sim, kimi_tok):
    r = httpx.post(sim.url + "/tokenize", json={"prompt": "Hello </think> world", "add_special_tokens": False}).json()
    assert r["tokens"] == kimi_tok.encode("Hello </think> world", add_special_tokens=False)
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 8192
    d = httpx.post(sim.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert d["text"] == "Hello </think> world"


def test_orjson_style_compact_body(sim, kimi_tok):
    r = gen(sim, {"input_ids": chat_ids(kimi_tok, "compact"), "sampling_params": {"max_new_tokens": 3}})
    assert r.text.startswith('{"text":') and '", "' not in r.text[:40]


def test_stream_never_shows_a_broken_utf8_character(sim, kimi_tok):
    # Find a prompt whose output has multi-byte characters split across tokens.
    for i in range(40):
        ids = chat_ids(kimi_tok, f"unicode {i}")
        out = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000}}).json()["output_ids"]
        if any(kimi_tok.decode(out[:k]).endswith("\ufffd") for k in range(1, len(out))):
            break
    else:
        raise AssertionError("no output with a split multi-byte character")
    r = gen(sim, {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 4000}})
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    assert all("\ufffd" not in c["text"] for c in chunks)
    assert chunks[-1]["output_ids"] == out


def test_incremental_streaming_and_seed_flags(qsim, qwen_tok):
    """--incremental-streaming-output sends deltas; --seed gives another (still deterministic) model."""
    ids = list(
        qwen_tok.apply_chat_template(
            [{"role": "user", "content": "flags"}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    body = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 4000}}
    base = gen(qsim, {**body, "stream": False}).json()["output_ids"]
    with start_simulator(extra_args=QWEN_ARGS + ["--incremental-streaming-output", "--seed", "7"]) as s:
        full = gen(s, {**body, "stream": False}).json()
        again = gen(s, {**body, "stream": False, "rid": "other"}).json()
        chunks = [json.loads(e) for e in sse_events(gen(s, body).text)[:-1]]
    assert full["output_ids"] == again["output_ids"] != base
    assert len(chunks) > 3
    assert [i for c in chunks for i in c["output_ids"]] == full["output_ids"]
    assert "".join(c["text"] for c in chunks) == full["text"]
