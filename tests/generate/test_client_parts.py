"""The client's parts alone, without a server: how a transport failure, a status and a 200 body are
classified (retried or final, counted against the circuit or not), which answers are partial, and the
retry policy's rids and timeouts."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from eagle3_dagster.generate.client import (
    RetryPolicy,
    _partial_is_final,
    _partial_retry_kind,
    _Reply,
    _result_of_200,
    _status_failure,
    _transport_retry,
    _Tries,
    _unfinished,
    answer_release,
)
from eagle3_dagster.generate.endpoint_info import AuthError, Endpoint
from eagle3_dagster.generate.request_errors import (
    FinalFailure,
    RetryableFailure,
    UnroutableEndpoint,
    counts_against_circuit,
)

EP = Endpoint(url="http://127.0.0.1:1", name="127.0.0.1:1", server_version="0.5.23")
TIMEOUT = httpx.Timeout(connect=1.0, read=7.0, write=61.0, pool=None)
STREAM: Any = object()  # only "streamed or not" matters to the classification below


class FakePool:
    def __init__(self) -> None:
        self.unroutable: list[str] = []

    def mark_unroutable(self, ep: Endpoint, why: str) -> None:
        self.unroutable.append(why)


@pytest.mark.parametrize(
    ("error", "kind", "breaker"),
    [
        (httpx.ConnectError("x"), "connect", True),
        (httpx.ConnectTimeout("x"), "connect", True),
        (httpx.ReadTimeout("x"), "read_timeout", False),
        (httpx.RemoteProtocolError("x"), "reset", True),
        (httpx.ReadError("x"), "reset", True),
        (httpx.PoolTimeout("x"), "reset", True),
        (httpx.UnsupportedProtocol("x"), "transport", True),
    ],
)
def test_transport_failures_are_retried_and_only_a_slow_server_spares_the_circuit(
    error: httpx.TransportError, kind: str, breaker: bool
) -> None:
    r = _transport_retry(error, EP, TIMEOUT, None)
    assert (r.kind, r.breaker) == (kind, breaker)


def test_one_rule_says_which_failures_count_against_the_circuit() -> None:
    assert [k for k in ("connect", "reset", "bad_body", "transport") if counts_against_circuit(k, None)] == [
        "connect",
        "reset",
        "bad_body",
        "transport",
    ]
    assert not any(counts_against_circuit(k, None) for k in ("read_timeout", "stall", "duplicate_rid"))
    assert [st for st in (400, 408, 429, 500, 502, 503, 504) if counts_against_circuit(f"http_{st}", st)] == [
        500,
        502,
        504,
    ]
    with pytest.raises(ValueError, match="no circuit rule"):
        RetryableFailure("new_kind", None, "x")  # a new kind must be placed on one side of the rule


def test_a_read_timeout_names_the_wait_and_a_streamed_one_is_a_stall() -> None:
    plain = _transport_retry(httpx.ReadTimeout("x"), EP, TIMEOUT, None)
    assert "read timeout after 7.0s" in plain.detail and plain.url == EP.url
    mode = type("M", (), {"first_chunk_timeout_s": 2.5})()
    streamed = _transport_retry(httpx.ReadTimeout("x"), EP, TIMEOUT, mode)
    assert streamed.kind == "stall" and "no answer within 2.5s" in streamed.detail


def status(code: int, body: dict[str, Any] | str) -> _Reply:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return _Reply(code, raw)


def test_statuses_are_retried_final_or_unroutable() -> None:
    pool = FakePool()
    busy = _status_failure(status(429, {"error": {"message": "busy"}}), EP, pool, {})  # type: ignore[arg-type]
    broken = _status_failure(status(502, "bad gateway"), EP, pool, {})  # type: ignore[arg-type]
    final = _status_failure(status(400, {"error": {"message": "bad"}}), EP, pool, {})  # type: ignore[arg-type]
    dup = _status_failure(status(400, {"error": {"message": "Duplicate request ID r-0"}}), EP, pool, {})  # type: ignore[arg-type]
    assert isinstance(busy, RetryableFailure) and not busy.breaker
    assert isinstance(broken, RetryableFailure) and broken.breaker and broken.kind == "http_502"
    assert isinstance(final, FinalFailure) and final.reason == "http_400"
    assert isinstance(dup, RetryableFailure) and dup.kind == "duplicate_rid" and not dup.breaker
    assert pool.unroutable == []


def test_a_router_without_workers_is_unroutable_and_marked_so() -> None:
    pool = FakePool()
    e = _status_failure(status(503, {"error": {"message": "No available workers"}}), EP, pool, {})  # type: ignore[arg-type]
    assert isinstance(e, UnroutableEndpoint) and pool.unroutable == ["router: No available workers"]


def test_a_refused_key_is_an_auth_error() -> None:
    e = _status_failure(status(401, "no"), EP, FakePool(), {"Authorization": "Bearer k"})  # type: ignore[arg-type]
    assert isinstance(e, AuthError)


def test_a_200_result_is_returned_and_a_200_error_body_is_final() -> None:
    ok = {"output_ids": [1], "meta_info": {}}
    assert _result_of_200(_Reply(200, json.dumps(ok).encode()), EP, None) == ok
    with pytest.raises(FinalFailure) as final:
        _result_of_200(_Reply(200, b'{"error": {"message": "boom"}}'), EP, None)
    assert final.value.reason == "server_error_body"
    with pytest.raises(RetryableFailure) as bad:
        _result_of_200(_Reply(200, b"<html>", content_type="text/html"), EP, None)
    assert bad.value.kind == "bad_body" and "(text/html)" in bad.value.detail


def test_a_streamed_error_chunk_carries_its_status() -> None:
    busy = {"error": {"message": "queue full", "code": 503}}
    with pytest.raises(RetryableFailure) as retry:
        _result_of_200(_Reply(200, b"", busy), EP, STREAM)
    assert retry.value.kind == "http_503"
    with pytest.raises(FinalFailure) as final:
        _result_of_200(_Reply(200, b"", {"error": {"message": "bad", "code": 400}}), EP, STREAM)
    assert final.value.reason == "http_400"
    old = Endpoint(url=EP.url, name=EP.name, server_version="0.5.9")  # 0.5.9 sends these for 400s only
    with pytest.raises(FinalFailure) as old_final:
        _result_of_200(_Reply(200, b"", {"error": {"message": "bad"}}), old, STREAM)
    assert old_final.value.reason == "http_400"


def answer(finish: Any) -> dict[str, Any]:
    return {"output_ids": [1], "meta_info": {"finish_reason": finish}}


def test_unfinished_and_aborted_answers_are_partial() -> None:
    assert _unfinished(answer({"type": "stop"}), EP) is None
    assert _unfinished(answer("stop"), EP) is None  # malformed, not partial: answer_checks refuses it
    why, code, msg = _unfinished(answer(None), EP) or ("", 0, "")
    assert (why, code) == ("unfinished_answer", None) and "without a finish_reason" in msg
    assert _unfinished(answer({"type": "abort", "status_code": 503, "message": "full"}), EP) == ("aborted", 503, "full")


def test_a_client_error_abort_is_final_and_a_busy_one_is_retried_by_its_status() -> None:
    assert _partial_is_final(400) and not _partial_is_final(429) and not _partial_is_final(503)
    assert not _partial_is_final(None)
    assert _partial_retry_kind("aborted", 503) == "http_503"
    assert _partial_retry_kind("aborted", None) == "abort"
    assert _partial_retry_kind("unfinished_answer", None) == "unfinished"


def test_each_try_gets_a_new_rid_and_each_read_timeout_doubles_the_next_wait() -> None:
    tries = _Tries()
    assert tries.rid("s-n") == "s-n-0"
    tries.attempt, tries.unroutable = 2, 1
    assert tries.rid("s-n") == "s-n-2u1"
    policy = RetryPolicy(read_timeout_s=5.0, connect_timeout_s=1.0, max_retries=3, backoff_base_s=0, backoff_max_s=0)
    assert policy.timeout(0).read == 5.0 and policy.timeout(2).read == 20.0
    assert policy.timeout(0).write == 61.0
    failed = tries.failed("s-n-2u1", reason="retries_exhausted", status=None, detail="gave up")
    assert failed.response is None and failed.attempts == 3


def test_sse_events_are_cut_at_blank_lines_across_reads_and_done_ends_them() -> None:
    from eagle3_dagster.generate.sse import SseEvents

    ev = SseEvents()
    assert ev.feed(b'data: {"a":1}\n') == []
    assert ev.feed(b'\n: a comment\n\ndata: {"b"') == [b'{"a":1}']
    assert ev.feed(b":2}\n\ndata: [DONE]\n\n") == [b'{"b":2}']
    assert ev.done


def test_stream_chunks_fold_deltas_into_the_last_answer() -> None:
    from eagle3_dagster.generate.sse import StreamChunks

    acc = StreamChunks(incremental=True)
    acc.add(b'{"output_ids":[1,2],"text":"ab"}', EP)
    acc.add(b'{"output_ids":[3],"text":"c","meta_info":{}}', EP)
    assert acc.fold({"output_ids": [3], "text": "c", "meta_info": {}}, EP)["output_ids"] == [1, 2, 3]
    assert acc.fold({"error": {"message": "x"}}, EP) == {"error": {"message": "x"}}  # an error is left as said


@pytest.mark.parametrize("code", [400, 500, 502, 503])
def test_a_streamed_abort_with_a_status_is_released_as_that_http_status(code: int) -> None:
    plain = _status_failure(status(code, {"error": {"message": "x"}}), EP, FakePool(), {})  # type: ignore[arg-type]
    plain_breaker = plain.breaker if isinstance(plain, RetryableFailure) else False  # a 400 is final: no circuit
    aborted = answer({"type": "abort", "message": "x", "status_code": code})
    assert answer_release(aborted, EP) == (False, plain_breaker)


def test_finished_unfinished_and_our_own_aborts_leave_the_circuit_alone() -> None:
    assert answer_release(answer({"type": "stop"}), EP) == (True, False)
    assert answer_release(answer(None), EP) == (True, False)  # retried as unfinished, not an endpoint failure
    assert answer_release(answer({"type": "abort", "message": "Aborted", "status_code": None}), EP) == (True, False)
