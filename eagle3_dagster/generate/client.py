"""One sample: POST /generate with retries, then check the response before it becomes a row.

Classification (spec §4): connect errors, resets (also a body cut mid-way), read timeouts, 408,
429 and 5xx are retried with jittered exponential backoff; a 400 is final and recorded with the
server's message. A retry gets a new rid (sample_id + run nonce + attempt): SGLang 0.5.23 refuses
a rid that is still in flight, and the old request may be running server-side after a timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from .endpoints import AuthError, Endpoint, EndpointPool, jittered_backoff
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


class _Final(Exception):
    def __init__(self, reason: str, status: int | None, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.status = status
        self.detail = detail


def _error_message(body: bytes) -> str:
    """The server's message from any of the §4.1 error shapes, else the raw text (truncated)."""
    text = body.decode("utf-8", "replace")
    try:
        d = json.loads(text)
    except ValueError:
        return text[:1000]
    if isinstance(d, dict):
        err = d.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:1000]
        if isinstance(err, str):
            return err[:1000]
        if "message" in d:
            return str(d["message"])[:1000]
    return text[:1000]


def integrity_violations(resp: dict[str, Any]) -> list[str]:
    """Checks the spec asks for on every response (§3.1, §7); violations are recorded, never hidden."""
    out: list[str] = []
    ids = resp.get("output_ids")
    meta = resp.get("meta_info") or {}
    if not isinstance(ids, list):
        return ["output_ids_missing"]
    ct = meta.get("completion_tokens")
    if ct is None:
        out.append("completion_tokens_missing")
    elif len(ids) != ct:
        out.append(f"len_output_ids_{len(ids)}_ne_completion_tokens_{ct}")
    fr = meta.get("finish_reason")
    if isinstance(fr, dict) and fr.get("type") == "stop":
        m = fr.get("matched")
        if isinstance(m, int) and not isinstance(m, bool):
            if not ids or ids[-1] != m:
                out.append(f"stop_matched_{m}_ne_last_output_id_{ids[-1] if ids else None}")
    elif isinstance(fr, dict) and fr.get("type") == "length":
        n = fr.get("length")
        if isinstance(n, int) and len(ids) != n:
            out.append(f"length_finish_{n}_ne_len_output_ids_{len(ids)}")
    return out


async def _attempt(
    pool: EndpointPool,
    client: httpx.AsyncClient,
    headers: dict[str, str],
    body: bytes,
    timeout: httpx.Timeout,
    stats: RunStats,
) -> tuple[dict[str, Any], Endpoint, float]:
    ep = await pool.acquire()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    ok = False
    breaker = False
    stats.requests_sent += 1
    stats.in_flight += 1
    try:
        try:
            r = await client.post(ep.url + "/generate", content=body, headers=headers, timeout=timeout)
        except httpx.ConnectError as e:
            breaker = True
            pool.mark_unhealthy(ep)
            raise _Retry("connect", None, f"{ep.name}: connect error: {type(e).__name__}", breaker=True) from None
        except httpx.ConnectTimeout:
            breaker = True
            raise _Retry("connect", None, f"{ep.name}: connect timeout", breaker=True) from None
        except httpx.ReadTimeout:
            # Not a breaker failure: a slow server is working, only our patience ran out.
            raise _Retry("read_timeout", None, f"{ep.name}: read timeout after {timeout.read}s", breaker=False, url=ep.url) from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.PoolTimeout, httpx.WriteTimeout) as e:
            breaker = True
            raise _Retry("reset", None, f"{ep.name}: {type(e).__name__}: connection reset or body cut", breaker=True) from None
        except httpx.TransportError as e:
            breaker = True
            raise _Retry("transport", None, f"{ep.name}: {type(e).__name__}", breaker=True) from None
        st = r.status_code
        if st == 200:
            try:
                data = json.loads(r.content)
            except ValueError:
                breaker = True
                raise _Retry("bad_body", 200, f"{ep.name}: 200 with a body that is not JSON", breaker=True) from None
            if not isinstance(data, dict):
                raise _Final("unexpected_body", 200, f"expected one JSON object, got {type(data).__name__}")
            ok = True
            return data, ep, loop.time() - t0
        msg = _error_message(r.content)
        if st in (401, 403):
            raise AuthError(f"{ep.name}/generate answered {st}: the API key (env var) is missing or wrong")
        if st == 400 and "Duplicate request ID" in msg:
            # A rid of ours still in flight server-side (a killed earlier run): retry with a fresh rid.
            raise _Retry("duplicate_rid", st, msg, breaker=False)
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


async def _abort_quietly(client: httpx.AsyncClient, headers: dict[str, str], url: str, rid: str) -> None:
    """After our timeout the server may still be generating: tell it to stop (best effort)."""
    try:
        await client.post(url + "/abort_request", json={"rid": rid}, headers=headers, timeout=5.0)
    except Exception:
        pass


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
) -> Outcome:
    attempt = 0
    timeouts = 0
    while True:
        rid = f"{rid_base}-{attempt}"
        body = json.dumps(
            {"input_ids": input_ids, "sampling_params": sampling, "rid": rid, "stream": False},
            separators=(",", ":"),
        ).encode()
        # After each read timeout the next attempt waits twice as long: short timeouts plus
        # retries would otherwise throw the same GPU work away forever (spec §8).
        read_t = read_timeout_s * (2**timeouts)
        timeout = httpx.Timeout(connect=connect_timeout_s, read=read_t, write=connect_timeout_s + 60.0, pool=None)
        try:
            data, ep, lat = await _attempt(pool, client, headers, body, timeout, stats)
        except _Retry as e:
            if e.kind == "read_timeout":
                timeouts += 1
                if e.url:
                    _spawn(_abort_quietly(client, headers, e.url, rid))
            if attempt >= max_retries:
                return Outcome(None, "", rid, 0.0, reason="retries_exhausted", status=e.status,
                               detail=f"{e.kind} after {attempt + 1} attempts: {e.detail}", attempts=attempt + 1)
            stats.retried[e.kind] += 1
            log.debug("retrying %s after %s", rid, e.kind)
            attempt += 1
            await asyncio.sleep(jittered_backoff(attempt - 1, backoff_base_s, backoff_max_s))
            continue
        except _Final as e:
            return Outcome(None, "", rid, 0.0, reason=e.reason, status=e.status, detail=e.detail, attempts=attempt + 1)
        fr = (data.get("meta_info") or {}).get("finish_reason")
        if isinstance(fr, dict) and fr.get("type") == "abort":
            code = fr.get("status_code")
            msg = str(fr.get("message"))
            if isinstance(code, int) and 400 <= code < 500 and code not in (408, 429):
                return Outcome(None, ep.name, rid, lat, reason=f"abort_{code}", status=code, detail=msg, attempts=attempt + 1)
            # An aborted sample is partial: retry it rather than store half a trace.
            if attempt >= max_retries:
                return Outcome(None, ep.name, rid, lat, reason="aborted", status=code, detail=msg, attempts=attempt + 1)
            stats.retried["abort"] += 1
            attempt += 1
            await asyncio.sleep(jittered_backoff(attempt - 1, backoff_base_s, backoff_max_s))
            continue
        return Outcome(data, ep.name, rid, lat, attempts=attempt + 1)
