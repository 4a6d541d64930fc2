"""A stream chunk that is not JSON (a proxy injecting text into an SSE stream) is a bad body: retried like
a final chunk that is not JSON, never an exception out of the request (that would fail the shard's step:
Dagster would retry the whole step and send every request again). A streamed failure counts against the
endpoint's circuit exactly when its non-streamed twin does. In-process: the client's own stream reader
over httpx's MockTransport, no server."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from eagle3_dagster.generate.client import _Reply, _result_of_200, _status_failure, _transport_retry
from eagle3_dagster.generate.endpoint_info import Endpoint
from eagle3_dagster.generate.request_errors import RetryableFailure
from eagle3_dagster.generate.sse import StreamMode, read_stream

FINAL = b'data: {"text":"","output_ids":[7],"meta_info":{"id":"r","finish_reason":{"type":"stop","matched":7}}}\n\n'


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self):
        for part in self.body.split(b"\n\n"):  # one network read an event, as a server flushes them
            yield part + b"\n\n"


async def _read(body: bytes, incremental: bool | None) -> dict:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Chunks(body.rstrip()))

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        async with client.stream("POST", "http://sglang/generate") as r:
            ep = Endpoint("http://sglang", "sglang", incremental_stream=incremental)
            return await read_stream(r, ep, StreamMode(5.0, 5.0, None))


@pytest.mark.parametrize("incremental", [True, None])
def test_a_chunk_that_is_not_json_is_a_bad_body_never_an_exception(incremental):
    body = b'data: {"text":"","output_ids":[5],"meta_info":{}}\n\ndata: <html>proxy says hi\n\n' + FINAL
    with pytest.raises(RetryableFailure) as e:
        asyncio.run(_read(body + b"data: [DONE]\n\n", incremental))
    assert e.value.kind == "bad_body" and "not JSON" in e.value.detail


def test_a_well_formed_delta_stream_reads_whole():
    body = b'data: {"text":"","output_ids":[5],"meta_info":{}}\n\n' + FINAL + b"data: [DONE]\n\n"
    assert asyncio.run(_read(body, True))["output_ids"] == [5, 7]


def _plain_failure(fail) -> RetryableFailure:
    try:
        failure = fail()
    except RetryableFailure as e:
        return e
    assert isinstance(failure, RetryableFailure)
    return failure


EP = Endpoint("http://sglang", "sglang", server_version="0.5.23")
TIMEOUT = httpx.Timeout(connect=1.0, read=7.0, write=61.0, pool=None)
FIRST = b'data: {"text":"","output_ids":[5],"meta_info":{}}\n\n'
STREAMED = {
    "reset": FIRST,  # the stream ends (cleanly) after a chunk, without the final chunk and [DONE]
    "bad_body mid-stream": FIRST + b"data: <html>proxy says hi\n\n" + FINAL + b"data: [DONE]\n\n",
    "bad_body last": FIRST + b"data: <html>proxy says hi\n\ndata: [DONE]\n\n",
    "http_500": b'data: {"error":{"message":"boom","code":500}}\n\ndata: [DONE]\n\n',
    "http_502": b'data: {"error":{"message":"bad gateway","code":502}}\n\ndata: [DONE]\n\n',
    "http_503": b'data: {"error":{"message":"queue full","code":503}}\n\ndata: [DONE]\n\n',
}
PLAIN = {
    "reset": lambda: _transport_retry(httpx.RemoteProtocolError("incomplete body"), EP, TIMEOUT, None),
    "bad_body mid-stream": lambda: _result_of_200(_Reply(200, b"<html>", content_type="text/html"), EP, None),
    "bad_body last": lambda: _result_of_200(_Reply(200, b"<html>", content_type="text/html"), EP, None),
    "http_500": lambda: _status_failure(_Reply(500, b"Internal Server Error"), EP, None, {}),
    "http_502": lambda: _status_failure(_Reply(502, b"bad gateway"), EP, None, {}),
    "http_503": lambda: _status_failure(_Reply(503, b'{"message":"queue full"}'), EP, None, {}),
}


def _streamed_via_client(body: bytes, incremental: bool | None) -> RetryableFailure:
    """A streamed body as the client judges it: read by the stream reader, then as a 200 result."""
    ep = Endpoint(EP.url, EP.name, server_version=EP.server_version, incremental_stream=incremental)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(_sse(body))) as client:
            async with client.stream("POST", "http://sglang/generate") as r:
                data = await read_stream(r, ep, StreamMode(5.0, 5.0, None))
        _result_of_200(_Reply(200, b"", data), ep, StreamMode(5.0, 5.0, None))

    with pytest.raises(RetryableFailure) as e:
        asyncio.run(go())
    return e.value


def _sse(body: bytes):
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Chunks(body.rstrip()))

    return answer


# (a cumulative stream's chunks before the last are not read: a bad one there is no failure)
CASES = [(c, inc) for c in sorted(STREAMED) for inc in (None, False) if (c, inc) != ("bad_body mid-stream", False)]


@pytest.mark.parametrize(("case", "incremental"), CASES)
def test_a_streamed_failure_counts_against_the_circuit_as_its_non_streamed_twin(case, incremental):
    streamed, plain = _streamed_via_client(STREAMED[case], incremental), _plain_failure(PLAIN[case])
    assert streamed.kind == plain.kind == case.split()[0]
    assert streamed.breaker == plain.breaker, f"{case}: streamed {streamed.breaker}, not streamed {plain.breaker}"
    assert streamed.breaker == (case.split()[0] in ("reset", "bad_body", "http_500", "http_502"))


def test_silence_spares_the_circuit_streamed_or_not():
    stream_mode = StreamMode(2.5, 2.5, None)
    assert not _transport_retry(httpx.ReadTimeout("x"), EP, TIMEOUT, stream_mode).breaker  # stall: no headers
    assert not _transport_retry(httpx.ReadTimeout("x"), EP, TIMEOUT, None).breaker  # read_timeout
