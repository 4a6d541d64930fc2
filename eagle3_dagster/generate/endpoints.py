"""A fleet of SGLang servers (or routers): health, least-outstanding balancing, circuit breaker.

States: an endpoint is routable when its last /health was 200 and its circuit is not open.
/health 503 means starting or draining (spec §4.3): not routable yet, probed again. After
`breaker_threshold` consecutive transport/5xx failures the circuit opens for a cooldown (doubling
on every re-open, capped); after it, a /health 200 makes it half-open: one trial request at a
time; a success closes the circuit, a failure opens it again. /health alone cannot close it,
because a server can answer /health while every /generate fails.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

log = logging.getLogger(__name__)


class NoEndpointError(RuntimeError):
    """No endpoint became routable within the configured wait."""


class AuthError(RuntimeError):
    """The server refused the API key (401/403). The key itself is never part of the message."""


class ModelRevisionError(RuntimeError):
    """The endpoints serve different model revisions; mixing them would poison a dataset."""


def display_url(url: str) -> str:
    """The URL without any user:password part, for logs and metadata."""
    p = urlsplit(url)
    if p.username or p.password:
        host = p.hostname or ""
        if p.port:
            host = f"{host}:{p.port}"
        return urlunsplit((p.scheme, host, p.path, p.query, p.fragment))
    return url


@dataclass
class Endpoint:
    url: str
    name: str
    healthy: bool = False  # last /health answered 200
    circuit_open: bool = False
    half_open: bool = False
    open_until: float = 0.0
    cooldown_s: float = 0.0
    mismatched: bool = False  # serves another model revision: never routable in this run
    outstanding: int = 0
    consecutive_failures: int = 0
    requests: int = 0
    succeeded: int = 0
    failures: int = 0
    circuit_opens: int = 0
    health_503: int = 0
    revision_checked: bool = False
    revision: str = ""
    server_info: dict[str, Any] = field(default_factory=dict)

    @property
    def routable(self) -> bool:
        if not self.healthy or self.circuit_open or self.mismatched:
            return False
        return not self.half_open or self.outstanding == 0  # half-open: one trial request at a time

    def stats(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "succeeded": self.succeeded,
            "failures": self.failures,
            "circuit_opens": self.circuit_opens,
            "health_503": self.health_503,
        }


def model_revision_of(info: dict[str, Any]) -> str:
    path = str(info.get("model_path") or info.get("served_model_name") or "unknown-model")
    wv = info.get("weight_version")
    return f"{path}@{wv if wv is not None else 'default'}"


def max_running_of(info: dict[str, Any]) -> int | None:
    """max_running_requests from /server_info; the per-DP effective value when the server reports it."""
    states = info.get("internal_states")
    if isinstance(states, list) and states:
        raw = [s.get("effective_max_running_requests_per_dp") for s in states if isinstance(s, dict)]
        vals = [int(v) for v in raw if isinstance(v, (int, float)) and v > 0]
        if vals:
            return sum(vals)
    v = info.get("max_running_requests")
    if isinstance(v, (int, float)) and v > 0:
        return int(v)
    return None


class EndpointPool:
    def __init__(
        self,
        urls: tuple[str, ...],
        client: httpx.AsyncClient,
        headers: dict[str, str],
        *,
        health_timeout_s: float,
        health_interval_s: float,
        probe_interval_s: float,
        breaker_threshold: int,
        wait_for_endpoint_s: float,
        cooldown_base_s: float = 1.0,
        cooldown_max_s: float = 30.0,
    ) -> None:
        self.cooldown_base_s = cooldown_base_s
        self.cooldown_max_s = cooldown_max_s
        self.endpoints = [Endpoint(url=u, name=display_url(u)) for u in urls]
        self.client = client
        self._headers = headers  # holds the bearer key: never logged, never in reprs
        self.health_timeout_s = health_timeout_s
        self.health_interval_s = health_interval_s
        self.probe_interval_s = probe_interval_s
        self.breaker_threshold = breaker_threshold
        self.wait_for_endpoint_s = wait_for_endpoint_s
        self.model_revision: str | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._rr = 0

    def __repr__(self) -> str:
        return f"EndpointPool({[e.name for e in self.endpoints]!r})"

    # -- probing ---------------------------------------------------------------------------
    async def _get_json(self, ep: Endpoint, path: str) -> dict[str, Any] | None:
        try:
            r = await self.client.get(ep.url + path, headers=self._headers, timeout=self.health_timeout_s)
        except httpx.HTTPError:
            return None
        if r.status_code in (401, 403):
            raise AuthError(f"{ep.name}{path} answered {r.status_code}: the API key (env var) is missing or wrong")
        if r.status_code != 200:
            return None
        try:
            data = r.json()
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    async def check_health(self, ep: Endpoint) -> bool:
        try:
            r = await self.client.get(ep.url + "/health", headers=self._headers, timeout=self.health_timeout_s)
            ok = r.status_code == 200
            if r.status_code == 503:
                ep.health_503 += 1
        except httpx.HTTPError:
            ok = False
        if ok and not ep.revision_checked:
            ok = await self._check_revision(ep)
        was = ep.routable
        ep.healthy = ok
        if ok and ep.circuit_open and time.monotonic() >= ep.open_until:
            log.info("endpoint %s: cooldown over and /health 200: half-open (one trial request)", ep.name)
            ep.circuit_open = False
            ep.half_open = True
        if ep.routable != was:
            log.info("endpoint %s is now %s", ep.name, "routable" if ep.routable else "not routable")
            self._changed.set()
        return ep.routable

    async def _check_revision(self, ep: Endpoint) -> bool:
        """First time an endpoint is healthy: read what it serves; refuse a different revision."""
        info = await self._get_json(ep, "/model_info")
        if info is None:
            info = await self._get_json(ep, "/get_model_info")
        if info is None:
            return False  # not ready to tell us what it serves: not routable yet
        rev = model_revision_of(info)
        ep.revision = rev
        if self.model_revision is None:
            self.model_revision = rev
        elif rev != self.model_revision:
            log.error("endpoint %s serves %s, the run uses %s: excluded", ep.name, rev, self.model_revision)
            ep.mismatched = True
        ep.server_info = await self._get_json(ep, "/server_info") or await self._get_json(ep, "/get_server_info") or {}
        ep.revision_checked = True
        return not ep.mismatched

    async def start(self, *, configured_revision: str | None) -> None:
        """Probe every endpoint, wait (bounded) until one is routable, then keep probing in the background."""
        if configured_revision is not None:
            self.model_revision = configured_revision
        if configured_revision is not None:
            # The caller pinned the revision: still read /server_info, but do not compare revisions.
            for ep in self.endpoints:
                ep.revision_checked = True
            await asyncio.gather(*(self._read_server_info(ep) for ep in self.endpoints))
        await asyncio.gather(*(self.check_health(ep) for ep in self.endpoints))
        revs = {ep.name: ep.revision for ep in self.endpoints if ep.revision}
        if len(set(revs.values())) > 1:
            # Which one is "right" is not ours to guess: pin GenerationConfig.model_revision or fix the fleet.
            raise ModelRevisionError(f"the endpoints serve different model revisions: {revs}")
        self._task = asyncio.create_task(self._monitor(), name="endpoint-monitor")
        await self.wait_routable()

    async def _read_server_info(self, ep: Endpoint) -> None:
        ep.server_info = await self._get_json(ep, "/server_info") or await self._get_json(ep, "/get_server_info") or {}

    async def _monitor(self) -> None:
        last_full = time.monotonic()
        while True:
            await asyncio.sleep(self.probe_interval_s)
            full = time.monotonic() - last_full >= self.health_interval_s
            if full:
                last_full = time.monotonic()
            todo = [ep for ep in self.endpoints if not ep.mismatched and (full or not ep.routable)]
            try:
                await asyncio.gather(*(self.check_health(ep) for ep in todo))
            except AuthError as e:
                log.error("%s", e)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    # -- routing ---------------------------------------------------------------------------
    async def wait_routable(self) -> None:
        deadline = time.monotonic() + self.wait_for_endpoint_s
        while not any(ep.routable for ep in self.endpoints):
            left = deadline - time.monotonic()
            if left <= 0:
                states = {ep.name: ("mismatched" if ep.mismatched else "circuit-open" if ep.circuit_open else "unhealthy") for ep in self.endpoints}
                raise NoEndpointError(f"no routable SGLang endpoint after {self.wait_for_endpoint_s:.0f}s: {states}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, self.probe_interval_s))
            except TimeoutError:
                pass

    async def acquire(self) -> Endpoint:
        """The routable endpoint with the fewest outstanding requests (ties rotate)."""
        while True:
            cands = [ep for ep in self.endpoints if ep.routable]
            if cands:
                low = min(ep.outstanding for ep in cands)
                best = [ep for ep in cands if ep.outstanding == low]
                self._rr += 1
                ep = best[self._rr % len(best)]
                ep.outstanding += 1
                ep.requests += 1
                return ep
            await self.wait_routable()

    def release(self, ep: Endpoint, *, ok: bool, breaker_failure: bool) -> None:
        ep.outstanding -= 1
        if ok:
            ep.succeeded += 1
            ep.consecutive_failures = 0
            if ep.half_open:
                log.info("endpoint %s: trial request succeeded, circuit closed", ep.name)
                ep.half_open = False
                ep.cooldown_s = 0.0
            self._changed.set()  # a slot freed up (matters for a half-open endpoint)
            return
        ep.failures += 1
        if breaker_failure:
            ep.consecutive_failures += 1
            if not ep.circuit_open and (ep.half_open or ep.consecutive_failures >= self.breaker_threshold):
                self._open(ep)
        self._changed.set()

    def _open(self, ep: Endpoint) -> None:
        ep.circuit_open = True
        ep.half_open = False
        ep.circuit_opens += 1
        ep.cooldown_s = min(self.cooldown_max_s, max(self.cooldown_base_s, ep.cooldown_s * 2))
        ep.open_until = time.monotonic() + ep.cooldown_s
        log.warning("endpoint %s failed %d times in a row: out of rotation for %.1fs", ep.name,
                    ep.consecutive_failures, ep.cooldown_s)

    def mark_unhealthy(self, ep: Endpoint) -> None:
        """A connect error: the server is not there (restarting?); stop routing until a probe passes."""
        if ep.healthy:
            ep.healthy = False
            self._changed.set()

    def max_in_flight(self, headroom: int, fallback: int = 64) -> int:
        vals = [max_running_of(ep.server_info) for ep in self.endpoints if not ep.mismatched]
        known = [v for v in vals if v]
        if not known:
            return fallback
        return sum(known) + headroom * len(known)

    def per_endpoint(self) -> dict[str, dict[str, int]]:
        return {ep.name: ep.stats() for ep in self.endpoints}


def jittered_backoff(attempt: int, base: float, cap: float) -> float:
    """Full jitter (AWS style): spreads a thundering herd after a 503 burst or a restart."""
    return random.uniform(0, min(cap, base * (2**attempt)))
