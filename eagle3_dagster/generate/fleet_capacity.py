"""How many GPU slots and servers stand behind each configured endpoint, read once (`eagle3 check`, `eagle3 plan`).

A plain SGLang server says its `max_running_requests` in `/server_info`. A router (sglang-router / SMG:
it answers `/readiness`) says nothing useful there (0.3.2 serves a stub), so its workers are listed
(`/workers`, or `/list_workers`) and each one's own `/server_info` is read, the way the generate client
sizes its in-flight window (endpoints.EndpointPool._check_router_workers): a worker that does not
answer counts with the mean of those that do (`router_window`), and the line printed says so.

The same `/server_info` answers name the drafter each endpoint speculates with (drafter.drafter_of; a
router: its workers' one, drafter.router_drafter), which a probe prompt's cache key holds (probes.py).

The same visit reads which model each server serves, as the run does before it sends anything
(endpoints.EndpointPool._check_revision): a plain server's `/model_info` (`/get_model_info` on an older
one); a router's workers' own `/model_info`, or, when no worker is reachable from here, the router's
`/get_model_info` (smg answers 404 on /model_info, spec §6.1). `served_model_problems` judges those answers
with served_model.judge_served_model against the profile's model and the user's pin, so `eagle3 check` and
`eagle3 plan` name a server of another model before a run (or a timed probe) uses it.

Nothing is raised: an endpoint that is down is unknown (slots None, and why), and the caller says so.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from ..secret import printable, redact
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
from .served_model import ExpectedModel, ModelVerdict, ServedModel, judge_served_model
from .tls import tls_context


@dataclass(frozen=True)
class ModelAnswer:
    """What one server behind an endpoint said it serves: who answered (the start of a message: "the endpoint",
    "router worker <url>", "the router") and the fields of its /model_info answer the judge reads, as received
    (its model_path may hold credentials: not in the repr; ServedModel redacts what is shown)."""

    who: str
    info: Mapping[str, Any] = field(repr=False)

    @property
    def served(self) -> ServedModel:
        return ServedModel.of(self.info)


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
    # what the servers behind it said they serve (a plain server: its own; a router: each reachable worker's,
    # else the router's /get_model_info); () when none said
    models: tuple[ModelAnswer, ...] = ()
    # who answered /server_info but said nothing of what it serves (/model_info, /get_model_info): a run waits
    # for such a server to say it, and then fails
    model_unsaid: tuple[str, ...] = ()

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


def _model_info(client: httpx.Client, url: str) -> dict[str, Any] | None:
    """What the server at `url` says it serves: /model_info, or /get_model_info (older servers, routers, smg);
    None when neither answers with an object (the caller's other probes say why)."""
    for path in ("/model_info", "/get_model_info"):
        info = _get_json(client, url, path)[0]
        if isinstance(info, dict):
            return {k: info.get(k) for k in ("model_path", "model_type")}
    return None


def probe_endpoint(client: httpx.Client, url: str) -> EndpointCapacity:
    base = url.rstrip("/")
    name = display_url(base)
    try:
        ready = client.get(base + "/readiness")
        router = is_router_readiness(ready.status_code, ready.headers.get("content-type", ""))
    except httpx.HTTPError as e:
        return EndpointCapacity(name, None, why=describe_error(e, "/readiness", float(client.timeout.read or 0)))
    if router:
        return _probe_router(client, base, name)
    info, why = _get_json(client, base, "/server_info")
    slots = max_running_of(info) if isinstance(info, dict) else None
    said = isinstance(info, dict)
    why = why or ("" if slots else "/server_info has no max_running_requests")
    model = _model_info(client, base) if said else None
    return EndpointCapacity(
        name,
        slots,
        why=why,
        drafter=drafter_of(info) if said else None,
        drafter_known=said,
        models=(ModelAnswer("the endpoint", model),) if model is not None else (),
        model_unsaid=("the endpoint",) if said and model is None else (),
    )


def _probe_router(client: httpx.Client, base: str, name: str) -> EndpointCapacity:
    """A router: its workers' capacity and drafters from their own /server_info, what they serve from their
    own /model_info (none reachable: what the router's /get_model_info says)."""
    workers: list[dict[str, Any]] = []
    for path in ROUTER_WORKER_LISTS:
        workers = workers or workers_listed(_get_json(client, base, path)[0])
    per_worker: dict[str, int | None] = {}
    drafters: dict[str, DrafterIdentity | None] = {}
    models: list[ModelAnswer] = []
    for w in workers:
        wurl = worker_url(w)
        info = _get_json(client, wurl, "/server_info")[0] if wurl else None
        winfo: dict[str, Any] | None = info if isinstance(info, dict) else None
        per_worker[display_url(wurl) or "?"] = max_running_of(winfo) if winfo is not None else None
        drafters[display_url(wurl) or "?"] = drafter_of(winfo)
        model = _model_info(client, wurl) if winfo is not None else None  # one that did not answer: no more waits
        if model is not None:
            models.append(ModelAnswer(f"router worker {display_url(wurl)}", model))
    if not models and (own := _model_info(client, base)) is not None:
        models.append(ModelAnswer("the router", own))
    unsaid = ("the router",) if not models and any(v is not None for v in per_worker.values()) else ()
    return replace(router_capacity(name, per_worker, drafters), models=tuple(models), model_unsaid=unsaid)


def probe_fleet(
    urls: Sequence[str], *, timeout_s: float = 3.0, headers: Mapping[str, str] | None = None
) -> list[EndpointCapacity]:
    """The capacity behind each endpoint, in order (the API key goes to routers and workers alike, as the
    generate client sends it)."""
    with httpx.Client(timeout=timeout_s, headers=dict(headers or {}), trust_env=False, verify=tls_context()) as client:
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


def _verdicts(
    fleet: Sequence[EndpointCapacity], expected: ExpectedModel | None
) -> Iterator[tuple[EndpointCapacity, ModelVerdict]]:
    if expected is None:
        return
    for c in fleet:
        for answer in c.models:
            yield c, judge_served_model(answer.info, expected, who=answer.who)


_UNSAID = (
    "{who} answers /server_info but does not say which model it serves (neither /model_info nor /get_model_info "
    "answered): a run waits for it to say so, then fails"
)


def _line(c: EndpointCapacity, said: str) -> str:
    # the judge's text quotes server text and the user's pin: redacted, control characters escaped
    return f"EAGLE3_SGLANG_URL {c.endpoint}: {printable(redact(said))}"


def served_model_problems(fleet: Sequence[EndpointCapacity], expected: ExpectedModel | None) -> list[str]:
    """A line per server (an endpoint, a router's worker) that serves another model than `expected` (the
    profile's, or the user's pin), naming what it serves, what is expected and how to pin it; the run would
    refuse it. A line too per server that answers /server_info but says nothing of what it serves (the run
    would wait for it, then fail); a dead one is endpoint_problems' line. `expected` None (no profile, no pin):
    nothing is judged."""
    lines = [_line(c, v.refusal) for c, v in _verdicts(fleet, expected) if v.refusal is not None]
    return lines + [_line(c, _UNSAID.format(who=who)) for c in fleet for who in c.model_unsaid if expected]


def served_model_warnings(fleet: Sequence[EndpointCapacity], expected: ExpectedModel | None) -> list[str]:
    """A line per server the run uses although its model_type is not the profile's (EAGLE3_SERVED_MODEL
    pins its model_path): worth saying, not a problem."""
    return [_line(c, v.warning) for c, v in _verdicts(fleet, expected) if v.warning is not None]
