"""Error codes, bodies and validation order (spec §4.1, §4.2, §9.2-9.4), per version profile."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from sim_helpers import CONTEXT, QWEN_ARGS, gen, sse_events, stats

from eagle3_dagster.sim.process import start_simulator

P = [1000 + i for i in range(20)]


def test_wrong_structural_types_give_pydantic_shaped_400(sim):
    for body in (
        {"input_ids": "abc"},
        {"input_ids": [[1, 2], "x"]},
        {"input_ids": P, "sampling_params": 3},
        {"input_ids": P, "rid": 5},
        {"input_ids": P, "stream": "yes"},
    ):
        r = gen(sim, body)
        assert r.status_code == 400, body
        d = r.json()
        assert set(d) == {"object", "message", "type", "param", "code"}
        assert d["object"] == "error" and d["type"] == "Bad Request" and d["code"] == 400 and d["param"] is None
    r = httpx.post(sim.url + "/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "Bad Request"


def test_contract_gate_0523_vs_internal_error_059(sim, sim059):
    body = {"input_ids": P, "sampling_params": {"max_new_tokens": 4, "seed": 1}}
    r = gen(sim, body)
    assert r.status_code == 400
    msg = r.json()["error"]
    assert isinstance(msg, str) and msg.startswith("unknown field `seed`, expected one of `max_new_tokens`")
    assert "`sampling_seed`" in msg
    r = gen(sim059, body)
    assert r.status_code == 500 and r.headers["content-type"].startswith("text/plain")
    assert r.text == "Internal Server Error"
    r = gen(sim, {"input_ids": P, "sampling_params": {"max_new_tokens": 1.5}})
    assert r.status_code == 400 and r.json() == {"error": "invalid type: floating point `1.5`, expected i32"}
    r = gen(sim, {"input_ids": P, "sampling_params": {"temperature": "hot"}})
    assert r.json() == {"error": 'invalid type: string "hot", expected f32'}
    # 0.5.9 has no schema: a string where a number belongs blows up (500), a float int passes
    r = gen(sim059, {"input_ids": P, "sampling_params": {"max_new_tokens": "5"}})
    assert r.status_code == 500 and r.text == "Internal Server Error"
    r = gen(sim059, {"input_ids": P, "sampling_params": {"max_new_tokens": 5.0}})
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 5


@pytest.mark.parametrize(
    "sp,msg",
    [
        ({"temperature": -1}, "temperature must be non-negative, got -1."),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0."),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        ({"min_p": 2}, "min_p must be in [0, 1], got 2."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"frequency_penalty": 3}, "frequency_penalty must be in [-2, 2], got 3."),
        ({"presence_penalty": -3}, "presence_penalty must be in [-2, 2], got -3."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        ({"max_new_tokens": 5, "min_new_tokens": 6}, "min_new_tokens must be in [0, max_new_tokens(5)], got 6."),
        ({"regex": "a", "json_schema": "{}"}, "Only one of regex, json_schema, or ebnf can be set."),
    ],
)
def test_range_checks_have_sglang_messages(sim, sp, msg):
    r = gen(sim, {"input_ids": P, "sampling_params": sp})
    assert r.status_code == 400 and r.json() == {"error": {"message": msg}}


def test_repetition_penalty_zero_differs_by_version(sim, sim059):
    body = {"input_ids": P, "sampling_params": {"max_new_tokens": 1, "repetition_penalty": 0}}
    r = gen(sim, body)
    assert r.status_code == 400 and r.json()["error"]["message"] == "repetition_penalty must be in (0, 2], got 0."
    assert gen(sim059, body).status_code == 200


def test_empty_input_ids(sim):
    for ids in ([], [[]], [P, []]):
        r = gen(sim, {"input_ids": ids})
        assert r.status_code == 400 and r.json() == {"error": {"message": "input_ids cannot be empty."}}


def test_context_length_check_is_strict_in_0523_and_inclusive_in_059(sim, sim059):
    body = {"input_ids": P, "sampling_params": {"max_new_tokens": CONTEXT - len(P)}}  # exactly the context
    ok = gen(sim, body)
    assert ok.status_code == 200
    r = gen(sim059, body)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens. You requested a "
        f"total of {CONTEXT} tokens: {len(P)} tokens from the input messages and {CONTEXT - len(P)} tokens for the "
        "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
        "the limit."
    )
    over = {"input_ids": P, "sampling_params": {"max_new_tokens": CONTEXT - len(P) + 1}}
    assert gen(sim, over).status_code == 400
    long = [7] * CONTEXT
    r = gen(sim, {"input_ids": long, "sampling_params": {"max_new_tokens": 1}})
    assert r.json() == {
        "error": {
            "message": f"The input ({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens)."
        }
    }


def test_validation_order_context_before_ranges_before_features(sim):
    r = gen(sim, {"input_ids": [7] * CONTEXT, "sampling_params": {"temperature": -1}, "return_hidden_states": True})
    assert "longer than the model's context length" in r.json()["error"]["message"]
    r = gen(sim, {"input_ids": P, "sampling_params": {"temperature": -1}, "return_hidden_states": True})
    assert r.json()["error"]["message"].startswith("temperature must be non-negative")
    r = gen(sim, {"input_ids": P, "return_hidden_states": True})
    assert r.status_code == 400 and "hidden states" in r.json()["error"]["message"]


def test_scheduler_input_length_check_non_stream_and_stream(sim):
    info = httpx.get(sim.url + "/server_info").json()
    m = info["max_req_input_len"]
    assert m == min(CONTEXT - 1, info["max_total_num_tokens"] - 1) - 5
    ids = [7] * m
    r = gen(sim, {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        f"Input length ({m} tokens) exceeds the maximum allowed length ({m} "
        "tokens). Use a shorter input or enable --allow-auto-truncate."
    )
    r = gen(sim, {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r.text)
    assert ev[-1] == "[DONE]"
    chunk = json.loads(ev[0])
    fr = chunk["meta_info"]["finish_reason"]
    assert fr["type"] == "abort" and fr["status_code"] == 400 and "exceeds the maximum allowed length" in fr["message"]
    assert chunk["output_ids"] == []


def test_pre_generation_error_inside_a_200_stream(sim, sim059):
    body = {"input_ids": P, "stream": True, "sampling_params": {"top_p": 0}}
    r = gen(sim, body)
    assert r.status_code == 200
    ev = sse_events(r.text)
    assert ev[-1] == "[DONE]" and len(ev) == 2
    assert json.loads(ev[0]) == {
        "error": {
            "message": "top_p must be in (0, 1], got 0.",
            "type": "invalid_request_error",
            "code": 400,
            "retryable": False,
        }
    }
    ev = sse_events(gen(sim059, body).text)
    assert json.loads(ev[0]) == {"error": {"message": "top_p must be in (0, 1], got 0."}}
    # the contract gate runs before the stream opens: plain 400
    r = gen(sim, {"input_ids": P, "stream": True, "sampling_params": {"seed": 3}})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)


@pytest.mark.integration
def test_api_key_from_env(monkeypatch):
    key = "sk-sim-test-secret-123"
    with start_simulator(
        extra_args=QWEN_ARGS + ["--api-key-env", "SIM_KEY_FOR_TEST"], env={"SIM_KEY_FOR_TEST": key}
    ) as s:
        for h in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": key}):
            r = gen(s, {"input_ids": P, "sampling_params": {"max_new_tokens": 2}}, headers=h)
            assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
            assert httpx.get(s.url + "/model_info", headers=h).status_code == 401
        ok = gen(
            s, {"input_ids": P, "sampling_params": {"max_new_tokens": 2}}, headers={"Authorization": f"Bearer {key}"}
        )
        assert ok.status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200  # health is exempt
        assert httpx.get(s.url + "/health_generate").status_code == 200
        assert stats_with(s, key)["errors"]["401"] == 6
    assert key not in s.log_path.read_text()
    assert os.environ.get("SIM_KEY_FOR_TEST") is None  # passed to the child only


def stats_with(s, key: str) -> dict:
    return httpx.get(s.url + "/_sim/stats", headers={"Authorization": f"Bearer {key}"}).json()


def test_error_statuses_are_counted(sim):
    before = stats(sim)
    gen(sim, {"input_ids": []})
    after = stats(sim)
    assert after["requests"] == before["requests"] + 1
    assert after["errors"].get("400", 0) == before["errors"].get("400", 0) + 1
