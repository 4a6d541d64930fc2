"""The simulator's /generate answers against SGLang 0.5.23's own response shapes (docs/sglang-schema.md).

The shapes come from SGLang's source (sglang_shapes.derive parses tokenizer_manager.py, schedule_batch.py
and http_server.py of the installed sglang), and every answer is also decoded by SGLang's generated JSON
contract (`api_types.GenerateResponse` / `GenerateStreamError`). A real eagle3-sim answers the client's
own request bodies (generate_body, stream_body, abort_body): single, batch, streamed with cumulative
output_ids (SGLang's default) and with `--incremental-streaming-output`, a running and a queued abort,
and an error after the stream opened.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import sglang_shapes
import sglang_source

from eagle3_dagster.generate import GenerationConfig, sampling_params
from eagle3_dagster.generate.client import abort_body, generate_body, stream_body

_SKIP = sglang_source.unavailable_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=f"SGLang lane not installed: {_SKIP}")

MAX_NEW = 48
PROMPTS = [[1000 + i for i in range(12)], [5000 + i for i in range(20)]]


@pytest.fixture(scope="module")
def src() -> sglang_source.SGLangSource:
    return sglang_source.load()


@pytest.fixture(scope="module")
def shapes(src) -> sglang_shapes.ResponseShapes:
    sh = sglang_shapes.derive(src.read)
    # what the checks below rely on, as SGLang's source says it
    assert {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"} <= sh.base | sh.generation
    assert set(sh.finish_forms) == {"stop", "length", "abort"}
    assert sh.incremental_ids_are_delta and sh.incremental_text_is_delta
    return sh


def _sampling(kimi_profile) -> dict[str, Any]:
    cfg = GenerationConfig.from_profile(kimi_profile, "http://127.0.0.1:9", max_new_tokens=MAX_NEW)
    return sampling_params(cfg)


def _sse(text: str) -> list[dict[str, Any]]:
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    assert events and events[-1] == "[DONE]", f"stream does not end with [DONE]: {text[-200:]!r}"
    return [json.loads(e) for e in events[:-1]]


def check_meta(sh, meta: dict[str, Any], *, final: bool, first: bool) -> None:
    """meta_info keys as tokenizer_manager._handle_batch_output / _stream_one_response build them."""
    keys = set(meta)
    must = sh.base | sh.generation | (sh.finished if final else set()) | (sh.first_sent if first else set())
    assert not must - keys, f"missing meta_info keys {sorted(must - keys)} (final={final}, first={first})"
    assert not keys - must - sh.optional, f"meta_info keys SGLang never sends: {sorted(keys - must - sh.optional)}"
    if not final:
        assert not keys & sh.finished and meta["finish_reason"] is None, meta
    if not first:
        assert not keys & sh.first_sent, f"{sorted(keys & sh.first_sent)} on a later chunk"
    if final:
        check_finish(sh, meta["finish_reason"])


def check_finish(sh, fr: Any) -> None:
    assert isinstance(fr, dict) and fr.get("type") in sh.finish_forms, fr
    assert set(fr) == sh.finish_forms[fr["type"]], f"{fr} is not SGLang's {fr['type']} form"


def check_answer(src, sh, ans: dict[str, Any], rid: str, prompt: list[int]) -> None:
    src.api_types.GenerateResponse.from_json_value(ans)  # SGLang's contract decoder: types
    meta = ans["meta_info"]
    check_meta(sh, meta, final=True, first=True)
    assert meta["id"] == rid and meta["prompt_tokens"] == len(prompt)
    assert meta["completion_tokens"] == len(ans["output_ids"]) > 0
    assert isinstance(ans["text"], str)


async def _post(url: str, body: dict[str, Any], timeout: float = 60.0) -> httpx.Response:
    async with httpx.AsyncClient(timeout=timeout) as c:
        return await c.post(url + "/generate", json=body)


def _stream_of(src, sh, text: str, *, incremental: bool, rids: list[str]) -> dict[int, dict[str, Any]]:
    """Per batch index: the reassembled ids / text of a stream, each chunk checked on the way."""
    out: dict[int, dict[str, Any]] = {}
    for chunk in _sse(text):
        src.api_types.GenerateResponse.from_json_value(chunk)
        i = chunk.get("index", 0)
        st = out.setdefault(i, {"ids": [], "text": "", "chunks": 0, "final": None})
        assert st["final"] is None, f"a chunk after the final one of item {i}"
        meta = chunk["meta_info"]
        final = meta["finish_reason"] is not None
        check_meta(sh, meta, final=final, first=st["chunks"] == 0)
        assert meta["id"] == rids[i]
        ids = chunk["output_ids"]
        if incremental:
            st["ids"] = st["ids"] + ids
            st["text"] += chunk["text"]
        else:
            assert ids[: len(st["ids"])] == st["ids"], "a cumulative chunk does not extend the previous one"
            assert chunk["text"].startswith(st["text"])
            st["ids"], st["text"] = ids, chunk["text"]
        assert meta["completion_tokens"] == len(st["ids"])
        st["chunks"] += 1
        if final:
            st["final"] = meta["finish_reason"]
    assert set(out) == set(range(len(rids)))
    return out


@pytest.mark.integration
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_sim_answers_have_sglangs_shapes(src, shapes, start_sim, kimi_profile, incremental: bool) -> None:
    sim = start_sim(*(["--incremental-streaming-output"] if incremental else []), "--stream-interval", "4")
    sp = _sampling(kimi_profile)

    async def run() -> None:
        # single: the body the client sends, then the same streamed
        single = generate_body(PROMPTS[0], sp, "s-0")
        r = await _post(sim.url, single)
        assert r.status_code == 200, r.text
        ans = r.json()
        check_answer(src, shapes, ans, "s-0", PROMPTS[0])
        r = await _post(sim.url, {**stream_body(single, 4), "rid": "s-1"})
        assert r.headers["content-type"].startswith("text/event-stream")
        st = _stream_of(src, shapes, r.text, incremental=incremental, rids=["s-1"])[0]
        assert st["chunks"] > 2, "too few chunks to tell cumulative from incremental"
        assert (st["ids"], st["text"], st["final"]) == (
            ans["output_ids"],
            ans["text"],
            ans["meta_info"]["finish_reason"],
        )

        # batch: a list answer in order, each item its rid; streamed: chunks carry `index`
        batch = {**generate_body(PROMPTS[0], sp, "b"), "input_ids": PROMPTS, "rid": ["b-0", "b-1"]}
        r = await _post(sim.url, batch)
        answers = r.json()
        assert isinstance(answers, list) and len(answers) == 2
        for a, rid, prompt in zip(answers, ["b-0", "b-1"], PROMPTS):
            check_answer(src, shapes, a, rid, prompt)
        r = await _post(sim.url, {**stream_body(batch, 4), "rid": ["c-0", "c-1"]})
        streams = _stream_of(src, shapes, r.text, incremental=incremental, rids=["c-0", "c-1"])
        for i, a in enumerate(answers):
            assert (streams[i]["ids"], streams[i]["text"]) == (a["output_ids"], a["text"])

    asyncio.run(run())


@pytest.mark.integration
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_logprob_answers_have_sglangs_shapes(src, shapes, start_sim, kimi_profile, incremental: bool) -> None:
    """The client asks for no logprobs; the simulator serves them (a user may), so their shape is checked too:
    the keys add_logprob_to_meta_info sets, and the per-token lists of an incremental chunk cover its tokens."""
    sim = start_sim(*(["--incremental-streaming-output"] if incremental else []), "--stream-interval", "4")
    body = {**generate_body(PROMPTS[0], _sampling(kimi_profile), "lp-0"), "return_logprob": True, "top_logprobs_num": 2}
    ans = asyncio.run(_post(sim.url, body)).json()
    check_answer(src, shapes, ans, "lp-0", PROMPTS[0])
    meta = ans["meta_info"]
    assert shapes.logprob_always | shapes.logprob_top <= set(meta), sorted(meta)
    n = len(ans["output_ids"])
    assert meta["output_token_logprobs_length"] == n
    per_token = sorted(shapes.incremental_keys & set(meta))
    assert per_token and all(len(meta[k]) == n for k in per_token)
    r = asyncio.run(_post(sim.url, {**stream_body(body, 4), "rid": "lp-1"}))
    joined: dict[str, list[Any]] = {k: [] for k in per_token}
    chunks = _sse(r.text)
    _stream_of(src, shapes, r.text, incremental=incremental, rids=["lp-1"])  # the usual chunk checks
    seen = 0
    for chunk in chunks:
        m = chunk["meta_info"]
        if incremental:
            for k in per_token:
                assert len(m[k]) == len(chunk["output_ids"]), f"{k} is not sliced to the chunk's tokens"
                joined[k] += m[k]
        else:
            assert all(len(m[k]) == m["completion_tokens"] for k in per_token)
            joined = {k: m[k] for k in per_token}
        assert m["output_token_logprobs_length"] == m["completion_tokens"] >= seen
        seen = m["completion_tokens"]
    assert joined == {k: meta[k] for k in per_token}


@pytest.mark.integration
def test_abort_answers_have_sglangs_shapes(src, shapes, start_sim, kimi_profile) -> None:
    """A running request aborted (FINISH_ABORT().to_json()) and one aborted in the waiting queue
    (tokenizer_manager._handle_abort_req: its own, shorter meta_info and finish_reason)."""
    sim = start_sim("--max-running-requests", "1", "--token-latency-ms", "40")
    sp = {**_sampling(kimi_profile), "max_new_tokens": 400, "ignore_eos": True}

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            running = asyncio.create_task(
                c.post(sim.url + "/generate", json=stream_body(generate_body(PROMPTS[0], sp, "run-0"), 2))
            )
            await asyncio.sleep(0.5)
            queued = asyncio.create_task(c.post(sim.url + "/generate", json=generate_body(PROMPTS[1], sp, "q-0")))
            await asyncio.sleep(0.3)
            for rid in ("q-0", "run-0"):
                r = await c.post(sim.url + "/abort_request", json=abort_body(rid))
                assert r.status_code == 200
            q, run_r = await queued, await running
        ans = q.json()
        src.api_types.GenerateResponse.from_json_value(ans)
        assert set(ans["meta_info"]) == shapes.queue_abort_meta | shapes.first_sent, sorted(ans["meta_info"])
        assert set(ans["meta_info"]["finish_reason"]) == shapes.queue_abort_finish
        assert ans["meta_info"]["finish_reason"]["type"] == "abort"
        st = _stream_of(src, shapes, run_r.text, incremental=False, rids=["run-0"])[0]
        assert st["final"]["type"] == "abort" and 0 < len(st["ids"]) < 400

    asyncio.run(run())


@pytest.mark.integration
def test_weights_updated_mid_request_show_in_weight_versions(src, shapes, start_sim, kimi_profile) -> None:
    """0.5.23 reports which weights generated which tokens (weight_versions spans) and sets weight_version
    to the last span's version (utils/weight_versions.add_weight_versions_to_meta_info)."""
    assert "weight_versions" in shapes.finished
    sim = start_sim("--token-latency-ms", "30")
    sp = {**_sampling(kimi_profile), "max_new_tokens": 60, "ignore_eos": True}

    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as c:
            task = asyncio.create_task(
                c.post(sim.url + "/generate", json=stream_body(generate_body(PROMPTS[0], sp, "wv-0"), 4))
            )
            await asyncio.sleep(0.8)
            await asyncio.to_thread(sim.faults, weight_version="v2")  # weights updated in place
            return _sse((await task).text)

    final = asyncio.run(run())[-1]
    src.api_types.GenerateResponse.from_json_value(final)
    spans, n = final["meta_info"]["weight_versions"], len(final["output_ids"])
    assert [s["version"] for s in spans] == ["default", "v2"] and final["meta_info"]["weight_version"] == "v2"
    assert spans[0]["start"] == 0 and 0 < spans[0]["end"] == spans[1]["start"] < spans[1]["end"] == n == 60


@pytest.mark.integration
def test_error_after_the_stream_opened_has_sglangs_shape(src, shapes, start_sim, kimi_profile) -> None:
    sim = start_sim("--context-length", "64")
    body = stream_body(generate_body(list(range(1000, 1100)), _sampling(kimi_profile), "long-0"), 4)
    r = asyncio.run(_post(sim.url, body))
    [chunk] = _sse(r.text)
    src.api_types.GenerateStreamError.from_json_value(chunk)
    assert set(chunk) == {"error"} and set(chunk["error"]) == shapes.stream_error, chunk


def test_the_shape_checks_fail_on_what_sglang_does_not_send(src, shapes) -> None:
    """The checks above can fail: answers SGLang 0.5.23 would never give are refused."""
    good = {
        "text": "hi",
        "output_ids": [1, 2],
        "meta_info": {
            "id": "r-0",
            "finish_reason": {"type": "length", "length": 2},
            "prompt_tokens": 3,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": 2,
            "cached_tokens": 0,
            "e2e_latency": 0.1,
            "weight_versions": [{"version": "default", "start": 0, "end": 2}],
            "response_sent_to_client_ts": 1.0,
        },
    }
    check_answer(src, shapes, good, "r-0", [7, 8, 9])
    meta = good["meta_info"]
    bad_meta = {
        "0.5.9's total_retractions": {
            **{k: v for k, v in meta.items() if k != "num_retractions"},
            "total_retractions": 0,
        },
        "no cached_tokens": {k: v for k, v in meta.items() if k != "cached_tokens"},
        "a finished answer without weight_versions": {k: v for k, v in meta.items() if k != "weight_versions"},
        "a stop without matched": {**meta, "finish_reason": {"type": "stop"}},
        "an abort with a reason SGLang has not": {
            **meta,
            "finish_reason": {"type": "abort", "message": "x", "code": 1},
        },
        "a finish type SGLang has not": {**meta, "finish_reason": {"type": "eos"}},
    }
    for name, m in bad_meta.items():
        with pytest.raises(AssertionError):
            check_answer(src, shapes, {**good, "meta_info": m}, "r-0", [7, 8, 9])
            pytest.fail(f"accepted {name}")
    # SGLang's own contract decoder refuses wrong JSON types
    with pytest.raises(src.api_types.JsonContractError):
        check_answer(src, shapes, {**good, "meta_info": {**meta, "completion_tokens": "2"}}, "r-0", [7, 8, 9])
    with pytest.raises(src.api_types.JsonContractError):
        check_answer(src, shapes, {**good, "output_ids": ["1"]}, "r-0", [7, 8, 9])
    # a later stream chunk that repeats response_sent_to_client_ts, an intermediate one with e2e_latency
    with pytest.raises(AssertionError, match="response_sent_to_client_ts"):
        check_meta(shapes, meta, final=True, first=False)
    with pytest.raises(AssertionError):
        check_meta(shapes, {**meta, "finish_reason": None}, final=False, first=True)
