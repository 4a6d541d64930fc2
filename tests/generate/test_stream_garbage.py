"""A stream chunk that is not JSON (a proxy injecting text into an SSE stream) is a bad body: retried like
a final chunk that is not JSON, never an exception out of the request (that would fail the shard's step:
Dagster would retry the whole step and send every request again). In-process: the client's own stream reader
over httpx's MockTransport, no server."""

from __future__ import annotations

import asyncio

import httpx
import pytest

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
