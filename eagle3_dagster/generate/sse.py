"""Reading a streamed /generate answer (SSE, spec §3.5) into one result.

The response is read with an idle timeout between events, so a request that goes quiet (a stuck
request, a proxy that dropped the connection) is detected in `stall_timeout_s` however long the
generation is; the wait before the first chunk is bounded separately (`first_chunk_timeout_s`:
queued requests send nothing). Only a complete event counts as news: bytes that never complete one (a
byte every few seconds) are silence. A stream that keeps sending events and never finishes is ended by
the request's overall deadline (client.py). Only the last event is parsed when the server streams cumulative
`output_ids` (the default), every delta when it streams increments; when no /server_info says which
(a router), each stream's chunks tell.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

from .endpoint_info import Endpoint
from .request_errors import FinalFailure, RetryableFailure

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamMode:
    """How to read a streamed answer: timeouts, and how often the server sends a chunk."""

    first_chunk_timeout_s: float
    stall_timeout_s: float
    stream_interval: int | None


class SseEvents:
    """Bytes as they arrive -> the `data:` payloads of the events they complete; `done` once [DONE] came."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.done = False
        self.completed = 0  # complete events seen (data or not): what resets the stall timer

    def feed(self, raw: bytes) -> list[bytes]:
        start = max(0, len(self._buf) - 1)  # only the new bytes (and one before) can hold a new separator
        self._buf += raw
        payloads: list[bytes] = []
        while (cut := self._buf.find(b"\n\n", start)) >= 0:
            ev = bytes(self._buf[:cut]).strip()
            del self._buf[: cut + 2]
            start = 0
            self.completed += 1
            if not ev.startswith(b"data:"):
                continue
            payload = ev[5:].strip()
            if payload == b"[DONE]":
                self.done = True
            else:
                payloads.append(payload)
        return payloads


@dataclass
class StreamChunks:
    """What a stream's chunks carried: their ids appended (deltas), kept per chunk (mode not known: to
    tell from them), or only the last chunk kept (cumulative: it has them all)."""

    incremental: bool | None
    events: int = 0
    last: bytes | None = None
    ids: list[int] = field(default_factory=list)
    chunks: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def add(self, payload: bytes, ep: Endpoint) -> None:
        self.events += 1
        self.last = payload
        if self.incremental is False:
            return
        try:
            d = json.loads(payload)
        except ValueError:  # never out of the request: it would crash the shard's step
            msg = f"{ep.name}: stream chunk {self.events} that is not JSON"
            raise RetryableFailure("bad_body", 200, msg) from None
        if isinstance(d, dict) and isinstance(d.get("output_ids"), list):
            if self.incremental:
                self.ids.extend(d["output_ids"])
            else:
                self.chunks.append(d["output_ids"])
            if isinstance(d.get("text"), str):
                self.texts.append(d["text"])

    def fold(self, data: Any, ep: Endpoint) -> Any:
        """The last chunk `data` as the whole answer: with every delta's ids (and text) when they were deltas."""
        if not isinstance(data, dict) or "error" in data:
            return data
        incremental = self.incremental
        if incremental is None and self.chunks:
            incremental = stream_is_delta(ep, self.chunks, data)
            if incremental:
                self.ids = [i for c in self.chunks for i in c]
        if incremental:
            data["output_ids"] = self.ids
            if not ep.server_version.startswith("0.5.9"):
                data["text"] = "".join(self.texts)  # 0.5.9 --stream-output: text stays cumulative
        return data


async def read_stream(r: httpx.Response, ep: Endpoint, mode: StreamMode) -> Any:
    """SSE events -> one result; RetryableFailure 'stall' on silence, 'reset' on a cut stream,
    'bad_body' on a chunk that is not JSON."""
    events = SseEvents()
    acc = StreamChunks(ep.incremental_stream)
    await _consume(r, ep, mode, events, acc)
    if not events.done or acc.last is None:
        msg = f"{ep.name}: stream ended without [DONE] after {acc.events} chunks"
        raise RetryableFailure("reset", None, msg)
    try:
        data = json.loads(acc.last)
    except ValueError:
        raise RetryableFailure("bad_body", 200, f"{ep.name}: stream chunk that is not JSON") from None
    return acc.fold(data, ep)


async def _consume(r: httpx.Response, ep: Endpoint, mode: StreamMode, events: SseEvents, acc: StreamChunks) -> None:
    """Read until [DONE], each event within the stall timeout (the first within its own)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(mode.first_chunk_timeout_s) as cm:
            async for raw in r.aiter_raw():
                seen = events.completed
                payloads = events.feed(raw)
                if events.completed != seen:  # bytes that complete no event are no sign of life
                    cm.reschedule(loop.time() + mode.stall_timeout_s)
                for payload in payloads:
                    acc.add(payload, ep)
                if events.done:
                    break
    except TimeoutError:
        what = "first chunk" if acc.events == 0 else f"chunk {acc.events + 1}"
        wait = mode.first_chunk_timeout_s if acc.events == 0 else mode.stall_timeout_s
        msg = f"{ep.name}: stream silent for {wait:g}s waiting for the {what}"
        raise RetryableFailure("stall", None, msg, url=ep.url) from None


_TOLD_DELTA: set[str] = set()  # endpoints whose delta streams were logged once


def stream_is_delta(ep: Endpoint, chunks: list[list[int]], last: dict[str, Any]) -> bool:
    """Whether a stream's chunks carried deltas, told from the chunks (the server did not say).

    Cumulative chunks (SGLang's default) each start with the previous chunk's ids; delta chunks
    (--incremental-streaming-output) carry only the new ids. `meta_info.completion_tokens` of the
    last chunk settles it: the last chunk's length (cumulative) or the sum (delta). Where both
    readings give the same ids the answer does not matter; where neither fits, the sample fails
    loudly (stream_mode_unknown) rather than keep a guess.
    """
    meta = last.get("meta_info")
    n = meta.get("completion_tokens") if isinstance(meta, dict) else None
    prefix_grows = all(len(b) >= len(a) and b[: len(a)] == a for a, b in itertools.pairwise(chunks))
    total = sum(len(c) for c in chunks)
    delta: bool | None = None
    if n is None:
        if not prefix_grows:
            delta = True  # cumulative chunks always extend the previous one
        elif total == len(chunks[-1]):
            delta = False  # at most one non-empty chunk: both readings give the same ids
    elif prefix_grows and len(chunks[-1]) == n:
        delta = False  # (if the sum is n too, every other chunk is empty: the same ids)
    elif total == n:
        delta = True
    if delta is not None:
        if delta and ep.name not in _TOLD_DELTA:
            _TOLD_DELTA.add(ep.name)
            log.warning(
                "endpoint %s streams delta output_ids (--incremental-streaming-output), told from the chunks: "
                "it does not report its stream mode",
                ep.name,
            )
        return delta
    raise FinalFailure(
        "stream_mode_unknown",
        200,
        f"{ep.name}: cannot tell whether the {len(chunks)} stream chunks carry cumulative or delta output_ids "
        f"(lengths {[len(c) for c in chunks[:8]]}..., completion_tokens {n}); the server does not say "
        "(a router hides its workers' /server_info): set the workers' stream mode where the client can "
        "read it, or generate without streaming",
    )
