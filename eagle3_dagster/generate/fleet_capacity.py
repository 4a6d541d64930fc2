"""How many GPU slots and servers stand behind each configured endpoint, read once (`eagle3 check`, `eagle3 plan`).

A plain SGLang server says its `max_running_requests` in `/server_info`. A router (sglang-router / SMG:
it answers `/readiness`) says nothing useful there (0.3.2 serves a stub), so its workers are listed
(`/workers`, or `/list_workers`) and each one's own `/server_info` is read, the way the generate client
sizes its in-flight window (endpoints.EndpointPool._check_router_workers): a worker that does not
answer counts with the mean of those that do (`router_window`), and the line printed says so.

The same `/server_info` answers name the drafter each endpoint speculates with (drafter.drafter_of; a
router: its workers' one, drafter.router_drafter), which a probe prompt's cache key holds (probes.py).

Nothing is raised: an endpoint that is down is unknown (slots None, and why), and the caller says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from .drafter import DrafterIdentity, drafter_of, router_drafter
from .endpoint_info import (
    ROUTER_WORKER_LISTS,
    auth_refused,
    describe_error,
    display_url,
    is_router_readiness,
    max_running_of,
    router_window,
    worker_url,
    workers_listed,
)


@dataclass(frozen=True)
class EndpointCapacity:
    """What one endpoint adds to the fleet."""

    endpoint: str  # display form (no credentials)
    slots: int | None  # max_running_requests; a router: Σ over its workers (unreachable: the mean); None: unknown
    workers: int | None = None  # a router: the workers it lists; None: a plain server
    unreachable: tuple[str, ...] = ()  # a router's workers whose /server_info did not tell their capacity
    why: str = ""  # why the capacity is unknown
    # the drafter its /server_info names (None: no speculation); drafter_known False: no /server_info answered
    drafter: DrafterIdentity | None = None
    drafter_known: bool = False
    # a router: each listed worker's drafter (a probe key holds them all: rows carry the serving worker's)
    worker_drafters: tuple[DrafterIdentity | None, ...] = ()

    @property
    def drafters(self) -> tuple[DrafterIdentity | None, ...]:
        """The drafters that generate behind this endpoint (EndpointPool.drafters does the same in a run)."""
        return self.worker_drafters or (self.drafter,)

    @property
    def servers(self) -> int:
        """Servers that generate behind this endpoint: a router's listed workers, else 1."""
        return self.workers if self.workers else 1

    def describe(self) -> str:
        if self.workers is None:
            return f"{self.endpoint}: " + (f"{self.slots} slots" if self.slots else f"capacity unknown ({self.why})")
        head = f"router {self.endpoint}: {self.workers} worker{'s' if self.workers != 1 else ''}"
        if not self.slots:
            return f"{head}, capacity unknown ({self.why})"
        n = len(self.unreachable)
        note = (
            f" ({n} worker{'s' if n != 1 else ''} unreachable, counted as the mean: {', '.join(self.unreachable)})"
            if n
            else ""
        )
        return f"{head}, {self.slots} slots{note}"


def router_capacity(
    endpoint: str, per_worker: Mapping[str, int | None], drafters: Mapping[str, DrafterIdentity | None] | None = None
) -> EndpointCapacity:
    """A router's capacity from each listed worker's max_running_requests (None: not reachable / not said),
    and its drafter from the workers' (`drafters`; a worker not reachable counts as not speculating, as the
    router's own stub /server_info says)."""
    if not per_worker:
        return EndpointCapacity(endpoint, None, 0, why="the router lists no worker (/workers, /list_workers)")
    slots = router_window(list(per_worker.values()))
    unreachable = tuple(w for w, v in per_worker.items() if not v)
    why = "" if slots else f"no worker told its max_running_requests: {', '.join(unreachable)}"
    drafter = router_drafter(dict(drafters)) if drafters else None
    return EndpointCapacity(
        endpoint,
        slots,
        len(per_worker),
        unreachable if slots else (),
        why,
        drafter,
        drafters is not None,
        tuple((drafters or {}).values()),
    )


def _get_json(client: httpx.Client, url: str, path: str) -> tuple[Any, str]:
    """(the JSON answer, "") or (None, why not) for one GET."""
    try:
        r = client.get(url + path)
    except httpx.HTTPError as e:
        return None, describe_error(e, path, float(client.timeout.read or 0))
    if r.status_code in (401, 403):  # names the credential that was sent and refused, and what to do
        return None, str(auth_refused(f"{display_url(url)}{path}", r.status_code, url, client.headers))
    if r.status_code != 200:
        return None, f"{path} answered {r.status_code}"
    try:
        return r.json(), ""
    except ValueError:
        return None, f"{path} answered something that is not JSON"


def probe_endpoint(client: httpx.Client, url: str) -> EndpointCapacity:
    base = url.rstrip("/")
    name = display_url(base)
    try:
        ready = client.get(base + "/readiness")
        router = is_router_readiness(ready.status_code, ready.headers.get("content-type", ""))
    except httpx.HTTPError as e:
        return EndpointCapacity(name, None, why=describe_error(e, "/readiness", float(client.timeout.read or 0)))
    if not router:
        info, why = _get_json(client, base, "/server_info")
        slots = max_running_of(info) if isinstance(info, dict) else None
        said = isinstance(info, dict)
        why = why or ("" if slots else "/server_info has no max_running_requests")
        return EndpointCapacity(name, slots, why=why, drafter=drafter_of(info) if said else None, drafter_known=said)
    workers: list[dict[str, Any]] = []
    for path in ROUTER_WORKER_LISTS:
        workers = workers or workers_listed(_get_json(client, base, path)[0])
    per_worker: dict[str, int | None] = {}
    drafters: dict[str, DrafterIdentity | None] = {}
    for w in workers:
        wurl = worker_url(w)
        info = _get_json(client, wurl, "/server_info")[0] if wurl else None
        winfo: dict[str, Any] | None = info if isinstance(info, dict) else None
        per_worker[display_url(wurl) or "?"] = max_running_of(winfo) if winfo is not None else None
        drafters[display_url(wurl) or "?"] = drafter_of(winfo)
    return router_capacity(name, per_worker, drafters)


def probe_fleet(
    urls: Sequence[str], *, timeout_s: float = 3.0, headers: Mapping[str, str] | None = None
) -> list[EndpointCapacity]:
    """The capacity behind each endpoint, in order (the API key goes to routers and workers alike, as the
    generate client sends it)."""
    with httpx.Client(timeout=timeout_s, headers=dict(headers or {}), trust_env=False) as client:
        return [probe_endpoint(client, u) for u in urls]


def _no_answer(c: EndpointCapacity) -> bool:
    """The endpoint did not answer as SGLang (a plain server without slots for a reason other than a missing field)."""
    return c.workers is None and c.slots is None and "has no max_running_requests" not in c.why


def endpoint_problems(fleet: Sequence[EndpointCapacity]) -> list[str]:
    """A line per configured endpoint that does not answer as SGLang, naming what answered and what to do."""
    out = []
    for c in fleet:
        if not _no_answer(c):
            continue
        if " 401" in c.why or " 403" in c.why:
            out.append(f"EAGLE3_SGLANG_URL {c.endpoint}: {c.why} (`eagle3 check --offline` skips this probe)")
            continue  # the line names the credential sent (the URL's user info, the key, none) and what to do
        if "answered" in c.why:
            fix = "not an SGLang server: point EAGLE3_SGLANG_URL at SGLang's own HTTP port (or its router)"
        else:
            fix = "no server there: start it, or fix EAGLE3_SGLANG_URL (unset, `eagle3 demo` starts its own simulator)"
        out.append(f"EAGLE3_SGLANG_URL {c.endpoint}: {c.why}; {fix} (`eagle3 check --offline` skips this probe)")
    return out
