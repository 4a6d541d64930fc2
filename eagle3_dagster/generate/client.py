"""One sample: POST /generate with retries, then check the response before it becomes a row.

Classification (spec §4): connect errors, resets (also a body cut mid-way), read timeouts, 408,
429 and 5xx are retried with jittered exponential backoff; a 400 is final and recorded with the
server's message. A 200 whose body is not a result (an `error` object, or no `output_ids` /
`meta_info`) is the error `server_error_body`, never a success. A 503 "No available workers" from an
sglang-router means the endpoint has nothing to route to: the sample waits for the endpoint (bounded
by the endpoint wait) without spending a retry.

Streaming (`stream=True`, spec §3.5) is read by sse.py. A stalled request is aborted (`/abort_request`, connection closed) and retried with a
new rid. A retry gets a new rid (sample_id + run nonce + attempt): SGLang 0.5.23 refuses
a rid that is still in flight, and the old request may be running server-side after a timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ..secret import printable, redact
from .endpoint_info import Endpoint, auth_refused, display_url, jittered_backoff, parse_version
from .endpoint_info import error_message as _error_message
from .endpoints import EndpointPool
from .report import RunStats
from .request_errors import (
    REQUEST_DEADLINE,
    RETRYABLE_STATUS,
    DeadlineExceeded,
    FinalFailure,
    RetryableFailure,
    UnroutableEndpoint,
    counts_against_circuit,
    http_status,
)
from .sse import StreamMode, read_stream

log = logging.getLogger(__name__)


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
    # the worker a gateway says served the answer (smg's ROUTED_WORKER_HEADER), "" when it does not say
    worker: str = ""


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


# smg (Shepherd Model Gateway) names the worker that served an answer, after its own retries on other
# workers, in this response header (docs/smg.md); sglang-router 0.3.2 does not.
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"


@dataclass(frozen=True)
class _Reply:
    """What came back before it is judged: the status, the raw body, or an SSE stream already folded
    into one result (`data`); the worker a gateway named ("" when none)."""

    status: int
    raw: bytes
    data: Any = None
    content_type: str = "?"
    worker: str = ""


async def _post(
    client: httpx.AsyncClient,
    ep: Endpoint,
    content: bytes,
    headers: dict[str, str],
    timeout: httpx.Timeout,
    stream: StreamMode | None,
) -> _Reply:
    """POST /generate and read the answer (JSON, or SSE within the stream's timeouts)."""
    if stream is None:
        r = await client.post(ep.url + "/generate", content=content, headers=headers, timeout=timeout)
        return _Reply(r.status_code, r.content, None, r.headers.get("content-type", "?"), _worker(r))
    t = httpx.Timeout(connect=timeout.connect, read=stream.first_chunk_timeout_s, write=timeout.write, pool=None)
    async with client.stream("POST", ep.url + "/generate", content=content, headers=headers, timeout=t) as r:
        ctype = r.headers.get("content-type", "?")
        if r.status_code == 200 and ctype.startswith("text/event-stream"):
            return _Reply(200, b"", await read_stream(r, ep, stream), ctype, _worker(r))
        return _Reply(r.status_code, await r.aread(), None, ctype, _worker(r))


def _worker(r: httpx.Response) -> str:
    """The worker a gateway names in its answer, without any user:password part ("" when it names none)."""
    named = r.headers.get(ROUTED_WORKER_HEADER, "").strip()
    return display_url(named.rstrip("/")) if named else ""


def _transport_retry(
    e: httpx.TransportError, ep: Endpoint, timeout: httpx.Timeout, stream: StreamMode | None
) -> RetryableFailure:
    """A transport failure as a retry (whether it counts against the circuit: request_errors.counts_against_circuit)."""
    name = ep.name
    if isinstance(e, httpx.ConnectError):
        return RetryableFailure("connect", None, f"{name}: connect error: {type(e).__name__}")
    if isinstance(e, httpx.ConnectTimeout):
        return RetryableFailure("connect", None, f"{name}: connect timeout")
    if isinstance(e, httpx.ReadTimeout):
        if stream is not None:
            # No response headers within the first-chunk limit: the same silence as a stall.
            wait = stream.first_chunk_timeout_s
            return RetryableFailure("stall", None, f"{name}: no answer within {wait:g}s", url=ep.url)
        return RetryableFailure("read_timeout", None, f"{name}: read timeout after {timeout.read}s", url=ep.url)
    if isinstance(
        e, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.PoolTimeout, httpx.WriteTimeout)
    ):
        return RetryableFailure("reset", None, f"{name}: {type(e).__name__}: connection reset or body cut")
    return RetryableFailure("transport", None, f"{name}: {type(e).__name__}")


def _stream_error_chunk(err: dict[str, Any], why: str, ep: Endpoint) -> str:
    """Raise for a stream's error chunk that carries a status. In a stream, request errors found before
    the first token come as a 200 chunk {"error": {...}} (spec §3.5); 0.5.23 adds the status as `code`,
    0.5.9 only sends these for validation errors (400). A code that is no HTTP status is named in the
    message returned (the chunk is then a server error body)."""
    code = http_status(err.get("code"))
    if err.get("code") is not None and code is None:
        why += f" (its code {printable(repr(err.get('code')))[:60]} is no HTTP status)"
    elif code is None and (parse_version(ep.server_version) or (9,)) < (0, 5, 23):
        code = 400
    if code is not None:
        if code in RETRYABLE_STATUS or err.get("retryable") is True:
            raise RetryableFailure(f"http_{code}", code, why)
        raise FinalFailure(f"http_{code}", code, why)
    return why


def _result_of_200(reply: _Reply, ep: Endpoint, stream: StreamMode | None) -> dict[str, Any]:
    """The result of a 200, or the error it is: a body that is not JSON is retried, an error body is final."""
    data = reply.data
    if data is None:
        try:
            data = json.loads(reply.raw)
        except ValueError:
            msg = f"{ep.name}: 200 with a body that is not JSON ({reply.content_type})"
            raise RetryableFailure("bad_body", 200, msg) from None
    why = not_a_result(data)
    if why is None:
        return data
    why = printable(redact(why))  # the server's own words (an error body, a stream error chunk)
    if stream is not None and isinstance(data, dict) and isinstance(data.get("error"), dict):
        why = _stream_error_chunk(data["error"], why, ep)
    # A 200 that is not a result (SGLang answers some errors as HTTP 200 {"error": ...}).
    # Not a transport failure: the circuit stays as it is.
    raise FinalFailure("server_error_body", 200, why)


def _status_failure(reply: _Reply, ep: Endpoint, pool: EndpointPool, headers: dict[str, str]) -> Exception:
    """What a non-200 answer is: retried (with or without counting against the circuit), final, or unroutable."""
    st = reply.status
    msg = _error_message(reply.raw)
    if st in (401, 403):
        return auth_refused(f"{ep.name}/generate", st, ep.url, headers)
    if st == 400 and "Duplicate request ID" in msg:
        # A rid of ours still in flight server-side (a killed earlier run): retry with a fresh rid.
        return RetryableFailure("duplicate_rid", st, msg)
    if st == 503 and "No available workers" in msg:
        # sglang-router with no healthy worker: the endpoint is unroutable, not this sample broken.
        pool.mark_unroutable(ep, f"router: {msg[:120]}")
        return UnroutableEndpoint(f"{ep.name}: 503 {msg[:200]}")
    if st in RETRYABLE_STATUS:
        return RetryableFailure(f"http_{st}", st, msg)
    return FinalFailure(f"http_{st}", st, msg)


async def _attempt(
    transport: Transport,
    payload: dict[str, Any],
    timeout: httpx.Timeout,
    on_endpoint: Callable[[Endpoint], None] | None = None,
) -> tuple[dict[str, Any], Endpoint, float, str]:
    """One request on the endpoint the pool picks: its result, or the failure raised (RetryableFailure, FinalFailure,
    UnroutableEndpoint, AuthError); the endpoint is released with whether it counts against its circuit."""
    pool, client, headers, stats, stream = (
        transport.pool,
        transport.client,
        transport.headers,
        transport.stats,
        transport.stream,
    )
    ep = await pool.acquire()
    if on_endpoint is not None:
        on_endpoint(ep)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    ok = breaker = False
    stats.requests_sent += 1
    stats.in_flight += 1
    body = payload if stream is None else stream_body(payload, stream.stream_interval)
    content = json.dumps(body, separators=(",", ":")).encode()
    try:
        try:
            reply = await _post(client, ep, content, headers, timeout, stream)
        except httpx.TransportError as e:
            if isinstance(e, httpx.ConnectError):
                pool.mark_unhealthy(ep, e)
            raise _transport_retry(e, ep, timeout, stream) from None
        if reply.status != 200:
            raise _status_failure(reply, ep, pool, headers)
        data = _result_of_200(reply, ep, stream)
        ok, breaker = answer_release(data, ep)
        return data, ep, loop.time() - t0, reply.worker
    except RetryableFailure as e:
        breaker = e.breaker
        raise
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


@dataclass(frozen=True)
class Transport:
    """What every request of a run goes through: the endpoint pool, the HTTP client and the headers it sends,
    the run's counters, and how answers come back (`stream`, None: one JSON answer)."""

    pool: EndpointPool
    client: httpx.AsyncClient
    headers: dict[str, str]
    stats: RunStats
    stream: StreamMode | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """How one sample is retried: how many times, how long each read may wait, the backoff between
    attempts, and how long an unroutable endpoint is waited for."""

    read_timeout_s: float
    connect_timeout_s: float
    max_retries: int
    backoff_base_s: float
    backoff_max_s: float
    unroutable_wait_s: float = 900.0
    deadline_s: float = 10800.0  # the whole request, every attempt and backoff included (EAGLE3_REQUEST_DEADLINE_S)

    def timeout(self, read_timeouts: int) -> httpx.Timeout:
        # After each read timeout the next attempt waits twice as long: short timeouts plus
        # retries would otherwise throw the same GPU work away forever (spec §8).
        read_t = self.read_timeout_s * (2**read_timeouts)
        c = self.connect_timeout_s
        return httpx.Timeout(connect=c, read=read_t, write=c + 60.0, pool=None)

    def backoff(self, n: int) -> float:
        return jittered_backoff(n, self.backoff_base_s, self.backoff_max_s)


@dataclass
class _Tries:
    """Where one sample's retries stand: attempts spent, read timeouts seen, waits for a routable endpoint."""

    attempt: int = 0
    timeouts: int = 0
    unroutable: int = 0
    unroutable_since: float | None = None

    def rid(self, rid_base: str) -> str:
        # A retry gets a new rid: the old request may still be running server-side.
        if not self.unroutable:
            return f"{rid_base}-{self.attempt}"
        return f"{rid_base}-{self.attempt}u{self.unroutable}"

    def failed(
        self, rid: str, *, reason: str, status: int | None, detail: str, endpoint: str = "", lat: float = 0.0
    ) -> Outcome:
        return Outcome(None, endpoint, rid, lat, reason=reason, status=status, detail=detail, attempts=self.attempt + 1)


def _unfinished(data: dict[str, Any], ep: Endpoint) -> tuple[str, int | None, str] | None:
    """(why, status, message) of an answer that is partial, or None when it finished.

    An unfinished answer (no finish_reason: a proxy's snapshot of a running request, a stream whose
    last chunk was dropped) or an aborted one is partial: never stored as a trace. A finish_reason
    neither null nor an object is not unfinished but malformed, refused by answer_checks."""
    raw_fr = (data.get("meta_info") or {}).get("finish_reason")
    fr: dict[str, Any] = raw_fr if isinstance(raw_fr, dict) else {}
    unfinished = raw_fr is None or (isinstance(raw_fr, dict) and not fr.get("type"))
    if not unfinished and fr.get("type") != "abort":
        return None
    raw_code = None if unfinished else fr.get("status_code")
    code = http_status(raw_code)
    said = f"{ep.name}: answer without a finish_reason ({raw_fr!r})" if unfinished else str(fr.get("message"))
    if raw_code is not None and code is None:  # named in the message, never a reason code or a status column
        said += f" (status_code {repr(raw_code)[:60]} is no HTTP status)"
    msg = printable(redact(said))  # an abort message is the server's text (it may quote the request)
    return ("unfinished_answer" if unfinished else "aborted"), code, msg


def answer_release(data: dict[str, Any], ep: Endpoint) -> tuple[bool, bool]:
    """(succeeded, counts against the circuit) of a 200 result, for the endpoint's pool. An abort that
    carries a status is how a stream says what a non-streamed request answers as that HTTP status (a
    scheduler refusal: 503 queue full, 400 input too long; spec §3.5, §4.1): released as that error is."""
    partial = _unfinished(data, ep)
    code = partial[1] if partial is not None else None
    if not isinstance(code, int):
        return True, False
    return False, counts_against_circuit(f"http_{code}", code)


def _partial_is_final(code: int | None) -> bool:
    """An abort with a client-error status is the request's fault: the same request fails the same way."""
    return isinstance(code, int) and 400 <= code < 500 and code not in (408, 429)


def _partial_retry_kind(why: str, code: int | None) -> str:
    # A streamed scheduler refusal (503 queue full, ...) is an abort chunk with its status.
    if isinstance(code, int) and code in RETRYABLE_STATUS:
        return f"http_{code}"
    return "unfinished" if why == "unfinished_answer" else "abort"


async def _attempt_by(
    deadline: float,
    transport: Transport,
    payload: dict[str, Any],
    timeout: httpx.Timeout,
    on_endpoint: Callable[[Endpoint], None],
) -> tuple[dict[str, Any], Endpoint, float, str]:
    """`_attempt`, cut at the request's deadline (loop time): DeadlineExceeded naming the endpoint it was on.
    A per-read timeout cannot end an answer that trickles a byte every few seconds; this does."""
    on: list[Endpoint] = []

    def note(ep: Endpoint) -> None:
        on.append(ep)
        on_endpoint(ep)

    cm = asyncio.timeout_at(deadline)
    try:
        async with cm:
            return await _attempt(transport, payload, timeout, note)
    except TimeoutError:
        if not cm.expired():
            raise
        raise DeadlineExceeded(on[-1].name if on else "", on[-1].url if on else "") from None


async def generate_one(
    transport: Transport,
    *,
    input_ids: list[int],
    sampling: dict[str, Any],
    rid_base: str,
    policy: RetryPolicy,
    in_flight: dict[str, str] | None = None,
) -> Outcome:
    """One sample to completion through `transport`, within the policy's deadline. `in_flight` (rid ->
    endpoint URL) lets the caller abort what is running on stop."""
    client, headers, stats = transport.client, transport.headers, transport.stats
    tries = _Tries()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + policy.deadline_s
    while True:
        rid = tries.rid(rid_base)
        if loop.time() >= deadline:  # spent in earlier attempts and their backoff
            return _past_deadline(tries, DeadlineExceeded("", ""), rid, policy, stats, client, headers)

        def track(ep: Endpoint, rid: str = rid) -> None:
            if in_flight is not None:
                in_flight[rid] = ep.url

        try:
            data, ep, lat, worker = await _attempt_by(
                deadline, transport, generate_body(input_ids, sampling, rid), policy.timeout(tries.timeouts), track
            )
        except UnroutableEndpoint as e:
            failed = _wait_unroutable(tries, e, rid, loop.time(), policy, stats)
            if failed is not None:
                return failed
            await _nap(policy.backoff(min(tries.unroutable, 6)), deadline)
            continue
        except RetryableFailure as e:
            failed = _note_retry(tries, e, rid, policy, stats, client, headers)
            if failed is not None:
                return failed
            await _nap(policy.backoff(tries.attempt - 1), deadline)
            continue
        except FinalFailure as e:
            return tries.failed(rid, reason=e.reason, status=e.status, detail=e.detail)
        except DeadlineExceeded as e:
            return _past_deadline(tries, e, rid, policy, stats, client, headers)
        finally:
            task = asyncio.current_task()
            if in_flight is not None and (task is None or not task.cancelling()):
                in_flight.pop(rid, None)  # kept when cancelled (a stop): the run aborts it on the server
        tries.unroutable_since = None
        partial = _unfinished(data, ep)
        if partial is None:
            return Outcome(data, ep.name, rid, lat, attempts=tries.attempt + 1, worker=worker)
        failed = _partial_failed(partial, ep, tries, rid, lat, policy, stats)
        if failed is not None:
            return failed
        await _nap(policy.backoff(tries.attempt - 1), deadline)


async def _nap(seconds: float, deadline: float) -> None:
    """A backoff sleep that ends by the request's deadline (the loop then records the deadline failure)."""
    await asyncio.sleep(max(0.0, min(seconds, deadline - asyncio.get_running_loop().time())))


def _partial_failed(
    partial: tuple[str, int | None, str],
    ep: Endpoint,
    tries: _Tries,
    rid: str,
    lat: float,
    policy: RetryPolicy,
    stats: RunStats,
) -> Outcome | None:
    """The failed Outcome of a partial answer (`_unfinished`), or None when it is sent again (counted)."""
    why, code, msg = partial
    if _partial_is_final(code):
        return tries.failed(rid, reason=f"abort_{code}", status=code, detail=msg, endpoint=ep.name, lat=lat)
    if tries.attempt >= policy.max_retries:
        return tries.failed(rid, reason=why, status=code, detail=msg, endpoint=ep.name, lat=lat)
    stats.retried[_partial_retry_kind(why, code)] += 1
    tries.attempt += 1
    return None


def _past_deadline(
    tries: _Tries,
    e: DeadlineExceeded,
    rid: str,
    policy: RetryPolicy,
    stats: RunStats,
    client: httpx.AsyncClient,
    headers: dict[str, str],
) -> Outcome:
    """The request ran out of its overall deadline: the abandoned request aborted on the server, the sample
    failed with reason request_deadline (not permanent: the next run sends it again)."""
    if e.url:
        _spawn(abort_rid(client, headers, e.url, rid))
    where = f" on {e.endpoint}" if e.endpoint else ""
    detail = (
        f"no complete answer within the request deadline of {policy.deadline_s:g}s (EAGLE3_REQUEST_DEADLINE_S) "
        f"after {tries.attempt + 1} attempt(s){where}: a server that answers too slowly or trickles its answer "
        "and never finishes; aborted"
    )
    if stats.errors[REQUEST_DEADLINE] < 3:
        log.warning("request %s: %s", rid, detail)
    return tries.failed(rid, reason=REQUEST_DEADLINE, status=None, detail=detail, endpoint=e.endpoint)


def _wait_unroutable(
    tries: _Tries, e: UnroutableEndpoint, rid: str, now: float, policy: RetryPolicy, stats: RunStats
) -> Outcome | None:
    """Not the sample's fault: wait for the endpoint (the pool probes it), keep the retries; the
    failure once the endpoint wait is over."""
    tries.unroutable_since = tries.unroutable_since or now
    stats.retried["no_available_workers"] += 1
    tries.unroutable += 1
    waited = now - tries.unroutable_since
    if waited > policy.unroutable_wait_s:
        return tries.failed(rid, reason="no_available_workers", status=503, detail=f"{e.detail} for {waited:.0f}s")
    return None


def _note_retry(
    tries: _Tries,
    e: RetryableFailure,
    rid: str,
    policy: RetryPolicy,
    stats: RunStats,
    client: httpx.AsyncClient,
    headers: dict[str, str],
) -> Outcome | None:
    """A retryable failure: the abandoned request aborted on the server, the attempt counted; the
    failure once the retries are spent."""
    if e.kind in ("read_timeout", "stall"):
        if e.kind == "read_timeout":
            tries.timeouts += 1
        if e.url:
            _spawn(abort_rid(client, headers, e.url, rid))
    if e.kind == "stall":
        log.warning("request %s stalled (%s): aborted, retrying with a new rid", rid, e.detail)
    if tries.attempt >= policy.max_retries:
        detail = f"{e.kind} after {tries.attempt + 1} attempts: {e.detail}"
        return tries.failed(rid, reason="retries_exhausted", status=e.status, detail=detail)
    stats.retried[e.kind] += 1
    log.debug("retrying %s after %s", rid, e.kind)
    tries.attempt += 1
    return None
