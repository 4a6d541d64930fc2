"""One sample: POST /generate with retries, then check the response before it becomes a row.

Classification (spec §4): connect errors, resets (also a body cut mid-way), read timeouts, 408,
429 and 5xx are retried with jittered exponential backoff; a 400 is final and recorded with the
server's message. A 200 whose body is not a result (an `error` object, or no `output_ids` /
`meta_info`) is the error `server_error_body`, never a success. A 503 "No available workers" from an
sglang-router means the endpoint has nothing to route to: the sample waits for the endpoint (bounded
by the endpoint wait) without spending a retry.

Streaming (`stream=True`, spec §3.5): the response is read as SSE with an idle timeout between
chunks, so a request that goes quiet (a stuck request, a proxy that dropped the connection) is
detected in `stall_timeout_s` however long the generation is; the wait before the first chunk is
bounded separately (`first_chunk_timeout_s`: queued requests send nothing). Only the last event is
parsed when the server streams cumulative `output_ids` (the default), every delta when it streams
increments; when no /server_info says which (a router), each stream's chunks tell. A stalled request is aborted (`/abort_request`, connection closed) and retried with a
new rid. A retry gets a new rid (sample_id + run nonce + attempt): SGLang 0.5.23 refuses
a rid that is still in flight, and the old request may be running server-side after a timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from ..secret import redact
from .endpoint_info import Endpoint, auth_refused, display_url, jittered_backoff, parse_version
from .endpoint_info import error_message as _error_message
from .endpoints import EndpointPool
from .report import RunStats

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# Statuses that say "busy", not "broken": retried, but they do not open the circuit.
BUSY_STATUS = frozenset({408, 429, 503})


@dataclass
class Outcome:
    """Either `response` (a 200 with a usable body) or an error `reason` + `status` + `detail`."""

    response: dict[str, Any] | None
    endpoint: str
    rid: str
    latency_s: float
    reason: str = ""
    status: int | None = None
    detail: str = ""
    attempts: int = 1


class _Retry(Exception):
    def __init__(self, kind: str, status: int | None, detail: str, *, breaker: bool, url: str = "") -> None:
        super().__init__(detail)
        self.url = url
        self.kind = kind
        self.status = status
        self.detail = detail
        self.breaker = breaker


class _Unroutable(Exception):
    """The endpoint (a router) has no worker to send to: wait for it, do not spend a retry."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _Final(Exception):
    def __init__(self, reason: str, status: int | None, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.status = status
        self.detail = detail


def not_a_result(data: Any) -> str | None:
    """Why a 200 body is not a generation result (spec §3.1, §3.5), or None when it is one."""
    if not isinstance(data, dict):
        return f"expected one JSON object, got {type(data).__name__}"
    err = data.get("error")
    if err is not None:
        if isinstance(err, dict):
            return str(err.get("message") or json.dumps(err)[:1000])
        return str(err)
    missing = [k for k in ("output_ids", "meta_info") if k not in data]
    if missing:
        return f"body lacks {' and '.join(missing)} (keys: {sorted(data)[:8]})"
    if not isinstance(data.get("output_ids"), list) or not isinstance(data.get("meta_info"), dict):
        return "output_ids is not a list or meta_info is not an object"
    return None


@dataclass(frozen=True)
class StreamMode:
    """How to read a streamed answer: timeouts, and whether `output_ids` come as deltas (server flag)."""

    first_chunk_timeout_s: float
    stall_timeout_s: float
    stream_interval: int | None


async def _read_stream(r: httpx.Response, ep: Endpoint, mode: StreamMode) -> dict[str, Any]:
    """SSE events -> one result dict; raises _Retry('stall') on silence, _Retry('reset') on a cut stream."""
    loop = asyncio.get_running_loop()
    incremental = ep.incremental_stream
    buf = bytearray()
    last: bytes | None = None
    ids: list[int] = []
    chunks: list[list[int]] = []  # mode not known: every chunk's output_ids, to tell from them
    texts: list[str] = []
    events = 0
    done = False
    try:
        async with asyncio.timeout(mode.first_chunk_timeout_s) as cm:
            async for raw in r.aiter_raw():
                cm.reschedule(loop.time() + mode.stall_timeout_s)
                start = max(0, len(buf) - 1)  # only the new bytes (and one before) can hold a new separator
                buf += raw
                while True:
                    cut = buf.find(b"\n\n", start)
                    if cut < 0:
                        break
                    ev = bytes(buf[:cut]).strip()
                    del buf[: cut + 2]
                    start = 0
                    if not ev.startswith(b"data:"):
                        continue
                    payload = ev[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        continue
                    events += 1
                    last = payload
                    if incremental is not False:
                        try:
                            d = json.loads(payload)
                        except ValueError:  # never out of the request: it would crash the shard's step
                            raise _Retry(
                                "bad_body", 200, f"{ep.name}: stream chunk {events} that is not JSON", breaker=True
                            ) from None
                        if isinstance(d, dict) and isinstance(d.get("output_ids"), list):
                            if incremental:
                                ids.extend(d["output_ids"])
                            else:
                                chunks.append(d["output_ids"])
                            if isinstance(d.get("text"), str):
                                texts.append(d["text"])
                if done:
                    break
    except TimeoutError:
        what = "first chunk" if events == 0 else f"chunk {events + 1}"
        wait = mode.first_chunk_timeout_s if events == 0 else mode.stall_timeout_s
        raise _Retry(
            "stall", None, f"{ep.name}: stream silent for {wait:g}s waiting for the {what}", breaker=False, url=ep.url
        ) from None
    if not done or last is None:
        raise _Retry("reset", None, f"{ep.name}: stream ended without [DONE] after {events} chunks", breaker=True)
    try:
        data = json.loads(last)
    except ValueError:
        raise _Retry("bad_body", 200, f"{ep.name}: stream chunk that is not JSON", breaker=True) from None
    if incremental is None and isinstance(data, dict) and "error" not in data and chunks:
        incremental = _stream_is_delta(ep, chunks, data)
        if incremental:
            ids = [i for c in chunks for i in c]
    if incremental and isinstance(data, dict) and "error" not in data:
        data["output_ids"] = ids
        if ep.server_version.startswith("0.5.9"):
            pass  # 0.5.9 --stream-output: text stays cumulative, the last chunk has all of it
        else:
            data["text"] = "".join(texts)
    return data


_TOLD_DELTA: set[str] = set()  # endpoints whose delta streams were logged once


def _stream_is_delta(ep: Endpoint, chunks: list[list[int]], last: dict[str, Any]) -> bool:
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
    raise _Final(
        "stream_mode_unknown",
        200,
        f"{ep.name}: cannot tell whether the {len(chunks)} stream chunks carry cumulative or delta output_ids "
        f"(lengths {[len(c) for c in chunks[:8]]}..., completion_tokens {n}); the server does not say "
        "(a router hides its workers' /server_info): set the workers' stream mode where the client can "
        "read it, or generate without streaming",
    )


def generate_body(input_ids: list[int], sampling: dict[str, Any], rid: str) -> dict[str, Any]:
    """The POST /generate body of one sample (non-streamed): token ids in, raw output_ids out.

    Every body the client sends is built here, by `stream_body` and by `abort_body`
    (tests/generate/test_sglang_schema.py passes them through SGLang's own request code).
    """
    return {"input_ids": input_ids, "sampling_params": sampling, "rid": rid, "stream": False}


def stream_body(body: dict[str, Any], stream_interval: int | None) -> dict[str, Any]:
    """`body` (from generate_body) as a streamed request; `stream_interval` goes into sampling_params."""
    sp = dict(body["sampling_params"])
    if stream_interval:
        sp["stream_interval"] = stream_interval
    return {**body, "sampling_params": sp, "stream": True}


def abort_body(rid: str) -> dict[str, Any]:
    """The POST /abort_request body that stops one request of ours."""
    return {"rid": rid}


async def _attempt(
    pool: EndpointPool,
    client: httpx.AsyncClient,
    headers: dict[str, str],
    payload: dict[str, Any],
    timeout: httpx.Timeout,
    stats: RunStats,
    stream: StreamMode | None,
    on_endpoint: Any = None,
) -> tuple[dict[str, Any], Endpoint, float]:
    ep = await pool.acquire()
    if on_endpoint is not None:
        on_endpoint(ep)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    ok = False
    breaker = False
    stats.requests_sent += 1
    stats.in_flight += 1
    body = payload if stream is None else stream_body(payload, stream.stream_interval)
    content = json.dumps(body, separators=(",", ":")).encode()
    try:
        try:
            if stream is None:
                r = await client.post(ep.url + "/generate", content=content, headers=headers, timeout=timeout)
                st = r.status_code
                raw = r.content
            else:
                t = httpx.Timeout(
                    connect=timeout.connect, read=stream.first_chunk_timeout_s, write=timeout.write, pool=None
                )
                async with client.stream(
                    "POST", ep.url + "/generate", content=content, headers=headers, timeout=t
                ) as r:
                    st = r.status_code
                    if st == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
                        data = await _read_stream(r, ep, stream)
                        raw = b""
                    else:
                        raw = await r.aread()
                        data = None
        except httpx.ConnectError as e:
            breaker = True
            pool.mark_unhealthy(ep, e)
            raise _Retry("connect", None, f"{ep.name}: connect error: {type(e).__name__}", breaker=True) from None
        except httpx.ConnectTimeout:
            breaker = True
            raise _Retry("connect", None, f"{ep.name}: connect timeout", breaker=True) from None
        except httpx.ReadTimeout:
            if stream is not None:
                # No response headers within the first-chunk limit: the same silence as a stall.
                raise _Retry(
                    "stall",
                    None,
                    f"{ep.name}: no answer within {stream.first_chunk_timeout_s:g}s",
                    breaker=False,
                    url=ep.url,
                ) from None
            # Not a breaker failure: a slow server is working, only our patience ran out.
            raise _Retry(
                "read_timeout", None, f"{ep.name}: read timeout after {timeout.read}s", breaker=False, url=ep.url
            ) from None
        except (
            httpx.RemoteProtocolError,
            httpx.ReadError,
            httpx.WriteError,
            httpx.PoolTimeout,
            httpx.WriteTimeout,
        ) as e:
            breaker = True
            raise _Retry(
                "reset", None, f"{ep.name}: {type(e).__name__}: connection reset or body cut", breaker=True
            ) from None
        except httpx.TransportError as e:
            breaker = True
            raise _Retry("transport", None, f"{ep.name}: {type(e).__name__}", breaker=True) from None
        if st == 200:
            if stream is None or data is None:
                try:
                    data = json.loads(raw)
                except ValueError:
                    breaker = True
                    ctype = r.headers.get("content-type", "?")
                    raise _Retry(
                        "bad_body", 200, f"{ep.name}: 200 with a body that is not JSON ({ctype})", breaker=True
                    ) from None
            why = not_a_result(data)
            if why is not None:
                why = redact(why)  # the server's own words (an error body, a stream error chunk)
            if (
                why is not None
                and stream is not None
                and isinstance(data, dict)
                and isinstance(data.get("error"), dict)
            ):
                # In a stream, request errors found before the first token come as a 200 chunk
                # {"error": {...}} (spec §3.5); 0.5.23 adds the status as `code`, 0.5.9 only sends
                # these for validation errors (400).
                err = data["error"]
                code = err.get("code")
                if not isinstance(code, int) and (parse_version(ep.server_version) or (9,)) < (0, 5, 23):
                    code = 400
                if isinstance(code, int):
                    if code in RETRYABLE_STATUS or err.get("retryable") is True:
                        raise _Retry(f"http_{code}", code, why, breaker=code not in BUSY_STATUS and code >= 500)
                    raise _Final(f"http_{code}", code, why)
            if why is not None:
                # A 200 that is not a result (SGLang answers some errors as HTTP 200 {"error": ...}).
                # Not a transport failure: the circuit stays as it is (breaker=False).
                raise _Final("server_error_body", 200, why)
            ok = True
            return data, ep, loop.time() - t0
        msg = _error_message(raw)
        if st in (401, 403):
            raise auth_refused(f"{ep.name}/generate", st, ep.url, headers)
        if st == 400 and "Duplicate request ID" in msg:
            # A rid of ours still in flight server-side (a killed earlier run): retry with a fresh rid.
            raise _Retry("duplicate_rid", st, msg, breaker=False)
        if st == 503 and "No available workers" in msg:
            # sglang-router with no healthy worker: the endpoint is unroutable, not this sample broken.
            pool.mark_unroutable(ep, f"router: {msg[:120]}")
            raise _Unroutable(f"{ep.name}: 503 {msg[:200]}")
        if st in RETRYABLE_STATUS:
            breaker = st not in BUSY_STATUS
            raise _Retry(f"http_{st}", st, msg, breaker=breaker)
        raise _Final(f"http_{st}", st, msg)
    finally:
        stats.in_flight -= 1
        pool.release(ep, ok=ok, breaker_failure=breaker)


_background: set[asyncio.Task[None]] = set()


def _spawn(coro: Any) -> None:
    # Keep a reference so the fire-and-forget task is not garbage-collected mid-flight.
    t = asyncio.get_running_loop().create_task(coro)
    _background.add(t)
    t.add_done_callback(_background.discard)


async def abort_rid(
    client: httpx.AsyncClient, headers: dict[str, str], url: str, rid: str, timeout: float = 5.0
) -> None:
    """Tell the server to stop a request of ours (best effort: the connection is closed anyway).

    An endpoint that cannot abort (sglang-router 0.3.2 answers 404: docs/sglang-router.md) is named
    once in the log: the abandoned request may keep running on a worker until it finishes.
    """
    try:
        r = await client.post(url + "/abort_request", json=abort_body(rid), headers=headers, timeout=timeout)
    except Exception:
        return
    if r.status_code != 200 and url not in _ABORT_REFUSED:
        _ABORT_REFUSED.add(url)
        log.warning(
            "%s/abort_request answered %d: abandoned requests (stalls, retries) cannot be stopped there and may "
            "keep a worker busy until they finish",
            display_url(url),
            r.status_code,
        )


_ABORT_REFUSED: set[str] = set()  # endpoints whose /abort_request refused, logged once


_abort_quietly = abort_rid


async def generate_one(
    *,
    pool: EndpointPool,
    client: httpx.AsyncClient,
    headers: dict[str, str],
    input_ids: list[int],
    sampling: dict[str, Any],
    rid_base: str,
    read_timeout_s: float,
    connect_timeout_s: float,
    max_retries: int,
    backoff_base_s: float,
    backoff_max_s: float,
    stats: RunStats,
    stream: StreamMode | None = None,
    unroutable_wait_s: float = 900.0,
    in_flight: dict[str, str] | None = None,
) -> Outcome:
    """One sample to completion. `in_flight` (rid -> endpoint URL) lets the caller abort what is running on stop."""
    attempt = 0
    timeouts = 0
    unroutable = 0
    loop = asyncio.get_running_loop()
    unroutable_since: float | None = None
    while True:
        rid = f"{rid_base}-{attempt}" if not unroutable else f"{rid_base}-{attempt}u{unroutable}"
        payload = generate_body(input_ids, sampling, rid)
        # After each read timeout the next attempt waits twice as long: short timeouts plus
        # retries would otherwise throw the same GPU work away forever (spec §8).
        read_t = read_timeout_s * (2**timeouts)
        timeout = httpx.Timeout(connect=connect_timeout_s, read=read_t, write=connect_timeout_s + 60.0, pool=None)

        def track(ep: Endpoint, rid: str = rid) -> None:
            if in_flight is not None:
                in_flight[rid] = ep.url

        try:
            data, ep, lat = await _attempt(pool, client, headers, payload, timeout, stats, stream, track)
        except _Unroutable as e:
            # Not the sample's fault: wait for the endpoint (the pool probes it), keep the retries.
            now = loop.time()
            unroutable_since = unroutable_since or now
            stats.retried["no_available_workers"] += 1
            unroutable += 1
            if now - unroutable_since > unroutable_wait_s:
                return Outcome(
                    None,
                    "",
                    rid,
                    0.0,
                    reason="no_available_workers",
                    status=503,
                    detail=f"{e.detail} for {now - unroutable_since:.0f}s",
                    attempts=attempt + 1,
                )
            await asyncio.sleep(jittered_backoff(min(unroutable, 6), backoff_base_s, backoff_max_s))
            continue
        except _Retry as e:
            if e.kind in ("read_timeout", "stall"):
                if e.kind == "read_timeout":
                    timeouts += 1
                if e.url:
                    _spawn(abort_rid(client, headers, e.url, rid))
            if e.kind == "stall":
                log.warning("request %s stalled (%s): aborted, retrying with a new rid", rid, e.detail)
            if attempt >= max_retries:
                return Outcome(
                    None,
                    "",
                    rid,
                    0.0,
                    reason="retries_exhausted",
                    status=e.status,
                    detail=f"{e.kind} after {attempt + 1} attempts: {e.detail}",
                    attempts=attempt + 1,
                )
            stats.retried[e.kind] += 1
            log.debug("retrying %s after %s", rid, e.kind)
            attempt += 1
            await asyncio.sleep(jittered_backoff(attempt - 1, backoff_base_s, backoff_max_s))
            continue
        except _Final as e:
            return Outcome(None, "", rid, 0.0, reason=e.reason, status=e.status, detail=e.detail, attempts=attempt + 1)
        finally:
            task = asyncio.current_task()
            if in_flight is not None and (task is None or not task.cancelling()):
                in_flight.pop(rid, None)  # kept when cancelled (a stop): the run aborts it on the server
        unroutable_since = None
        raw_fr = (data.get("meta_info") or {}).get("finish_reason")
        fr: dict[str, Any] = raw_fr if isinstance(raw_fr, dict) else {}
        # neither null nor an object: not unfinished but malformed, refused by answer_checks (not retried)
        unfinished = raw_fr is None or (isinstance(raw_fr, dict) and not fr.get("type"))
        if unfinished or fr.get("type") == "abort":
            # An unfinished answer (no finish_reason: a proxy's snapshot of a running request, a stream
            # whose last chunk was dropped) or an aborted one is partial: retried, never stored as a trace.
            code = None if unfinished else fr.get("status_code")
            said = f"{ep.name}: answer without a finish_reason ({raw_fr!r})" if unfinished else str(fr.get("message"))
            msg = redact(said)  # an abort message is the server's text (it may quote the request)
            if isinstance(code, int) and 400 <= code < 500 and code not in (408, 429):
                return Outcome(
                    None, ep.name, rid, lat, reason=f"abort_{code}", status=code, detail=msg, attempts=attempt + 1
                )
            why = "unfinished_answer" if unfinished else "aborted"
            if attempt >= max_retries:
                return Outcome(None, ep.name, rid, lat, reason=why, status=code, detail=msg, attempts=attempt + 1)
            # A streamed scheduler refusal (503 queue full, ...) is an abort chunk with its status.
            retryable = isinstance(code, int) and code in RETRYABLE_STATUS
            stats.retried[f"http_{code}" if retryable else "unfinished" if unfinished else "abort"] += 1
            attempt += 1
            await asyncio.sleep(jittered_backoff(attempt - 1, backoff_base_s, backoff_max_s))
            continue
        return Outcome(data, ep.name, rid, lat, attempts=attempt + 1)
