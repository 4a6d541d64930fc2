"""A fleet of SGLang servers (or routers): health, least-outstanding balancing, circuit breaker.

States: an endpoint is routable when its last /health was 200 and its circuit is not open.
/health 503 means starting or draining (spec §4.3): not routable yet, probed again. After
`breaker_threshold` consecutive failures that say it is broken (request_errors.counts_against_circuit: connect
errors, cut answers, bodies that are not JSON, 500/502/504; streamed or not) the circuit opens for a cooldown (doubling
on every re-open, capped); after it, a /health 200 makes it half-open: one trial request at a
time; a success closes the circuit, a failure opens it again. /health alone cannot close it,
because a server can answer /health while every /generate fails.

Routers (sglang-router / SMG, spec §6): `/health` there is liveness only, so an endpoint that
answers `/readiness` (plain SGLang servers answer 404) is a router and is probed there. Its worker
list (`/workers`, or `/list_workers`) sizes the in-flight window and every worker's revision is read
where the worker is reachable.

What an endpoint serves is also watched while the shard runs: an answer does not say which drafter served
it, so before a chunk of rows is written (`confirm_serving`) and whenever an endpoint comes back, the
drafter its /server_info names (a router: each worker's, per worker; for a worker the client cannot reach,
what the router says, as at the start) is read again. A server that does not answer then, or a worker read
the other way than at the start, is not judged at that reading. When it changed, the run stops
there (ServingChangedError, naming both): the rows that endpoint answered since its drafter was last
confirmed are not stored (which drafter served them is not known), the rerun generates them.

Refused for the whole run (never routable, the step fails at once if nothing else is left): another
model (its /model_info `model_type`, or `model_path` where the profile or EAGLE3_SERVED_MODEL pins one, is
not the run's: served_model.py), checked for a router's reachable workers too; another model revision
than the run's first endpoint (both read again whenever the endpoint comes back after being unreachable;
a pinned revision is not compared, the model still is); `/server_info` version older than 0.5.9 (unless
allowed); `preferred_sampling_params` that set a sampling field the client does not send (it would
change the distribution unseen).

While nothing is routable the pool logs every endpoint and its state (`connection refused`, `not an
SGLang server: /model_info answered text/html`, `/health 503`, ...) at once and then every
`report_every_s`, and gives up after `wait_for_endpoint_s` naming every endpoint and its state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx

from ..secret import printable, redact
from .drafter import DrafterIdentity, drafter_of, router_drafter, warn_mixed_fleet, warn_unattributed
from .endpoint_info import (
    _TEXT_ONLY,
    DISTRIBUTION_KEYS,
    MIN_SERVER_VERSION,
    ROUTER_WORKER_LISTS,
    AuthError,
    Endpoint,
    EndpointRefusedError,
    ModelRevisionError,
    NoEndpointError,
    Served,
    auth_refused,
    context_length_of,
    describe_error,
    display_url,
    is_router_readiness,
    max_running_of,
    model_revision_of,
    parse_version,
    preferred_params_of,
    router_window,
    server_said,
    stream_mode_of,
    worker_url,
    workers_listed,
)
from .run_wait import EndpointWaitRecord
from .served_model import ExpectedModel, judge_served_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndpointWatch:
    """How a pool watches its endpoints: each health probe's timeout, the interval between probes of a live
    endpoint and of a down one, the failures in a row that open an endpoint's circuit and its cooldown
    (doubling from base to max), how long to wait for a first endpoint, and how often the wait is reported."""

    health_timeout_s: float
    health_interval_s: float
    probe_interval_s: float
    breaker_threshold: int
    wait_for_endpoint_s: float
    cooldown_base_s: float = 1.0
    cooldown_max_s: float = 30.0
    report_every_s: float = 25.0
    first_report_s: float = 5.0


@dataclass(frozen=True)
class ServingChecks:
    """What a pool requires of the servers it uses: a supported SGLang release (unless `allow_old_server`),
    the sampling keys it sends understood (None: not checked), the expected model (None: not judged)."""

    allow_old_server: bool = False
    sent_sampling_keys: frozenset[str] | None = None
    expected_model: ExpectedModel | None = None


class EndpointPool:
    def __init__(
        self,
        urls: tuple[str, ...],
        client: httpx.AsyncClient,
        headers: dict[str, str],
        watch: EndpointWatch,
        *,
        serving: ServingChecks = ServingChecks(),
        wait_record: EndpointWaitRecord | None = None,
    ) -> None:
        self.expected_model = serving.expected_model  # None: what is served is not judged (tests of other parts)
        self.wait_record = wait_record  # the graph run's one endpoint wait (run_wait.py); None: this pool's own
        self.report_every_s = watch.report_every_s
        self.first_report_s = watch.first_report_s
        self.allow_old_server = serving.allow_old_server
        self.sent_sampling_keys = serving.sent_sampling_keys
        self.cooldown_base_s = watch.cooldown_base_s
        self.cooldown_max_s = watch.cooldown_max_s
        self.endpoints = [Endpoint(url=u, name=display_url(u)) for u in urls]
        self.client = client
        self._headers = headers  # holds the bearer key: never logged, never in reprs
        self.health_timeout_s = watch.health_timeout_s
        self.health_interval_s = watch.health_interval_s
        self.probe_interval_s = watch.probe_interval_s
        self.breaker_threshold = watch.breaker_threshold
        self.wait_for_endpoint_s = watch.wait_for_endpoint_s
        self.model_revision: str | None = None
        self.revision_pinned = False  # a configured revision: the revisions endpoints report are not compared
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._rr = 0
        self._next_wait_report = 0.0  # one 'waiting for an endpoint' line per interval for all waiters

    def __repr__(self) -> str:
        return f"EndpointPool({[e.name for e in self.endpoints]!r})"

    # -- probing ---------------------------------------------------------------------------
    async def _get(self, ep: Endpoint, path: str, timeout: float | None = None) -> httpx.Response:
        return await self.client.get(ep.url + path, headers=self._headers, timeout=timeout or self.health_timeout_s)

    async def _get_json(self, ep: Endpoint, path: str) -> dict[str, Any] | None:
        data, _ = await self._get_json_why(ep, path)
        return data

    async def _get_json_why(self, ep: Endpoint, path: str) -> tuple[dict[str, Any] | None, str]:
        """(the JSON object, "") or (None, why not) for one GET."""
        try:
            r = await self._get(ep, path)
        except httpx.HTTPError as e:
            return None, describe_error(e, path, self.health_timeout_s)
        if r.status_code in (401, 403):
            raise auth_refused(f"{ep.name}{path}", r.status_code, ep.url, self._headers)
        ctype = r.headers.get("content-type", "").split(";")[0].strip() or "no content type"
        if r.status_code != 200:
            # The answer's own words (a router's 500 `call_upstream_request_error` names the dead worker).
            said = server_said(r, 300)
            return None, f"{path} answered {r.status_code} ({ctype})" + (f": {said}" if said else "")
        try:
            data = r.json()
        except ValueError:
            return None, f"not an SGLang server: {path} answered {ctype}"
        if not isinstance(data, dict):
            return None, f"not an SGLang server: {path} answered a JSON {type(data).__name__}"
        return data, ""

    async def _probe(self, ep: Endpoint) -> bool:
        """One liveness/readiness probe; sets ep.state. Routers are probed at /readiness (their /health is liveness)."""
        try:
            if ep.kind != "server":
                r = await self._get(ep, "/readiness")
                if is_router_readiness(r.status_code, r.headers.get("content-type", "")):
                    ep.kind = "router"
                    if r.status_code == 503:
                        ep.health_503 += 1
                        said = server_said(r, 200)  # 0.3.2: {"status":"not ready","reason":...}
                        ep.state = "router has no ready worker (/readiness 503)" + (f": {said}" if said else "")
                        return False
                    return True
                if ep.kind == "router":
                    ep.state = f"router /readiness answered {r.status_code}"
                    return False
                ep.kind = "server" if r.status_code in (404, 405) else ep.kind
            r = await self._get(ep, "/health")
        except httpx.HTTPError as e:
            ep.state = describe_error(e, "/health" if ep.kind == "server" else "/readiness", self.health_timeout_s)
            return False
        if r.status_code == 200:
            return True
        if r.status_code == 503:
            ep.health_503 += 1
            ep.state = "starting or draining (/health 503)"
        else:
            ctype = r.headers.get("content-type", "").split(";")[0].strip() or "no content type"
            ep.state = f"/health answered {r.status_code} ({ctype})"
        return False

    async def check_health(self, ep: Endpoint) -> bool:
        ok = await self._probe(ep)
        if not ok:
            self._recheck_when_back(ep)
        if ok and not ep.revision_checked:
            known, before = bool(ep.server_info), _watched(ep)
            ok = await self._check_revision(ep)
            # back from a restart with another drafter (a router: on any of its workers)
            change = _first_change(before, _watched(ep)) if known and ep.server_info else None
            if change is not None:
                self._serving_changed(ep, change)
                ok = False
        if ok:
            ep.state = "routable" if not ep.circuit_open else "circuit open (cooling down)"
        was = ep.routable
        ep.healthy = ok
        if ok and ep.circuit_open and time.monotonic() >= ep.open_until:
            log.info("endpoint %s: cooldown over and /health 200: half-open (one trial request)", ep.name)
            ep.circuit_open = False
            ep.half_open = True
        if ep.routable != was:
            log.info("endpoint %s is now %s", ep.name, "routable" if ep.routable else f"not routable: {ep.state}")
            self._changed.set()
        return ep.routable

    def _recheck_when_back(self, ep: Endpoint) -> None:
        """A server that went away may come back serving another model (answers do not name it, a fresh
        server's weight_version is "default" again): read /model_info again before it is routable."""
        ep.revision_checked = False

    def _refuse(self, ep: Endpoint, why: str) -> None:
        # it quotes what /server_info and /model_info said (versions, server-side defaults)
        why = printable(redact(why))
        ep.refused = why
        ep.state = f"refused: {why}"
        log.error("endpoint %s refused for this run: %s", ep.name, why)

    def _serving_changed(self, ep: Endpoint, change: DrafterChange) -> None:
        """Record that `ep`'s drafter (a router's: one of its workers') changed under the run (it takes no more
        requests; the next chunk write stops the run, see confirm_serving)."""
        if ep.changed:
            return
        ep.changed = drafter_change_text(ep.name, change)
        ep.refused = ep.changed
        ep.state = f"refused: {ep.changed}"
        log.error("endpoint %s: %s", ep.name, ep.changed)
        self._changed.set()

    async def _drafters_now(self, ep: Endpoint) -> dict[str, DrafterReading]:
        """What drafts for `ep` now, per server, as `_watched` holds what its rows are attributed with: its own
        /server_info; a router's, per listed worker, that worker's own, or for a worker not reachable from here
        what the router itself says (as at the start). A server that does not answer now is left out: not
        judged now (the next confirmation reads it again, and the health checks when an endpoint comes back)."""
        if ep.kind != "router" or not ep.worker_drafters:
            own = await self._server_info_now(ep)
            return {} if own is None else {ep.name: DrafterReading(True, drafter_of(own))}
        now: dict[str, DrafterReading] = {}
        router_says: dict[str, Any] | None = None
        asked_router = False
        for w in ep.workers:
            wurl = worker_url(w)
            key = display_url(wurl) or "?"
            winfo = await self._get_json(Endpoint(url=wurl, name=key), "/server_info") if wurl else None
            if winfo is not None:
                now[key] = DrafterReading(True, drafter_of(winfo))
                continue
            if not asked_router:
                router_says, asked_router = await self._server_info_now(ep), True
            if router_says is not None:
                now[key] = DrafterReading(False, drafter_of(router_says))
        return now

    async def _server_info_now(self, ep: Endpoint) -> dict[str, Any] | None:
        return await self._get_json(ep, "/server_info") or await self._get_json(ep, "/get_server_info")

    async def confirm_serving(self, names: set[str]) -> dict[str, str]:
        """Endpoint name -> what changed, for every endpoint whose drafter changed under the run (a router's:
        any of its workers'): those of `names` (the endpoints whose answers are about to be written) are read
        again now; an endpoint already known to have changed is always named."""
        for ep in self.endpoints:
            # a router is read through its workers even when its own server info was empty
            watched = ep.server_info or (ep.kind == "router" and ep.worker_drafters)
            if ep.name in names and watched and not ep.changed and not ep.refused:
                change = _first_change(_watched(ep), await self._drafters_now(ep))
                if change is not None:
                    self._serving_changed(ep, change)
        return {ep.name: ep.changed for ep in self.endpoints if ep.changed}

    async def _check_revision(self, ep: Endpoint) -> bool:
        """First time an endpoint is healthy: what it serves, its version and server-side defaults."""
        info, why = await self._get_json_why(ep, "/model_info")
        if info is None:
            info, why2 = await self._get_json_why(ep, "/get_model_info")
            if info is None and ep.kind == "router" and why2.startswith("/get_model_info answered 5"):
                info = await self._model_info_from_a_live_worker(ep, why2)
            if info is None:
                # A router has no /model_info (404): what its /get_model_info said is the news.
                use_why2 = why2.startswith("not an SGLang") or why.startswith("/model_info answered 404")
                ep.state = why2 if use_why2 and not why.startswith("not an SGLang") else why
                return False  # not ready to tell us what it serves (or not SGLang at all): not routable
        if not self._check_model(ep, info):
            return False
        rev = model_revision_of(info)
        ep.revision = rev
        ep.preferred_sampling_params = preferred_params_of(info)
        if self.model_revision is None:
            self.model_revision = rev
        elif rev != self.model_revision and not self.revision_pinned:
            log.error("endpoint %s serves %s, the run uses %s: excluded", ep.name, rev, self.model_revision)
            ep.mismatched = True
            ep.state = f"serves {rev}, the run uses {self.model_revision}"
        ep.server_info = await self._get_json(ep, "/server_info") or await self._get_json(ep, "/get_server_info") or {}
        self._note_server_info(ep)
        ep.revision_checked = True
        if ep.kind == "router" and not ep.mismatched:
            await self._check_router_workers(ep)
        self._check_preferred(ep)
        return not ep.mismatched and not ep.refused

    def _check_model(self, ep: Endpoint, info: dict[str, Any]) -> bool:
        """Is what `info` (its /model_info) names the run's model? Refused for the run when not, naming both."""
        if self.expected_model is None:
            return True
        verdict = judge_served_model(info, self.expected_model, who=f"endpoint {ep.name}")
        first = ep.served_model is None
        ep.served_model = verdict.served
        if verdict.refusal is not None:
            self._refuse(ep, verdict.refusal)
            return False
        if verdict.warning is not None and first:
            log.warning("%s", verdict.warning)
        return True

    async def _model_info_from_a_live_worker(self, ep: Endpoint, why: str) -> dict[str, Any] | None:
        """A router whose /get_model_info fails (0.3.2 sends it to its first worker, dead or not, until its
        health check marks that one unhealthy): the model info of the first worker in /workers that answers
        /model_info itself. None when no listed worker is reachable from here (then the router's words stand)."""
        for w in workers_listed(await self._get_json(ep, ROUTER_WORKER_LISTS[0])):
            wurl = worker_url(w)
            if not wurl or w.get("is_healthy") is False:
                continue
            info = await self._get_json(Endpoint(url=wurl, name=display_url(wurl)), "/model_info")
            if info is not None:
                log.warning(
                    "router %s: %s; read what it serves from its worker %s directly (the router's health check "
                    "has not taken the failing worker out yet: --health-check-interval-secs, "
                    "--health-failure-threshold)",
                    ep.name,
                    why,
                    display_url(wurl),
                )
                return info
        return None

    def served(self, name: str, worker: str) -> Served:
        """Who generated an answer of endpoint `name` (display name): the endpoint itself, or behind a router
        the worker its answer named (`worker`, client.ROUTED_WORKER_HEADER). A router that names none: no
        worker, the workers' release if they agree, their drafter only if they all run one (warn_unattributed
        otherwise, once per router)."""
        ep = next((e for e in self.endpoints if e.name == name), None)
        if ep is None:
            return Served(None, None, None)
        if ep.kind != "router":
            return Served(ep.name, ep.server_version or None, ep.drafter)
        if worker:
            facts = ep.worker_facts.get(worker)
            if facts is None and worker not in ep.unknown_workers:
                ep.unknown_workers.add(worker)
                log.warning(
                    "router %s: an answer came from worker %s, whose /server_info the client did not read (%s): "
                    "its rows carry no drafter%s",
                    ep.name,
                    worker,
                    "not reachable from here"
                    if worker in ep.unread_workers
                    else "not in the router's /workers at the start",
                    "" if ep.unread_workers.get(worker) else " and no SGLang version",
                )
            return facts or Served(worker, ep.unread_workers.get(worker), None)
        if len(set(ep.worker_drafters.values())) > 1 and not ep.unattributed_warned:
            ep.unattributed_warned = True
            warn_unattributed(ep.name, ep.worker_drafters)
        versions = {f.version for f in ep.worker_facts.values()}
        version = versions.pop() if len(versions) == 1 and len(ep.worker_facts) == len(ep.workers) else None
        return Served(None, version, ep.drafter)

    def _note_server_info(self, ep: Endpoint) -> None:
        info = ep.server_info
        ep.server_version = str(info.get("version") or "")
        ep.incremental_stream = stream_mode_of(info)
        ep.drafter = drafter_of(info)
        v = parse_version(ep.server_version)
        if v is not None and v < MIN_SERVER_VERSION and not self.allow_old_server:
            self._refuse(
                ep,
                f"SGLang {ep.server_version} is older than 0.5.9: releases before the fix of "
                "sglang #10896 can put prompt-tail ids at the front of output_ids; upgrade the server, "
                "or set EAGLE3_ALLOW_OLD_SGLANG=1 to run anyway",
            )

    def _check_preferred(self, ep: Endpoint) -> None:
        psp = ep.preferred_sampling_params
        if not psp or self.sent_sampling_keys is None:
            return
        hidden = sorted(
            k for k in psp if (k in DISTRIBUTION_KEYS or k not in _TEXT_ONLY) and k not in self.sent_sampling_keys
        )
        if hidden:
            self._refuse(
                ep,
                f"the server's --preferred-sampling-params set {', '.join(f'{k}={psp[k]!r}' for k in hidden)}, "
                "which this client does not send: they would change the samples unseen; restart the "
                "server without them or add them to the model profile's sampling",
            )

    async def _check_router_workers(self, ep: Endpoint) -> None:
        """A router: list its workers, size the window from them, check each reachable worker's revision."""
        workers: list[dict[str, Any]] = []
        for path in ROUTER_WORKER_LISTS:
            workers = workers or workers_listed(await self._get_json(ep, path))
        ep.workers = workers
        if not workers:
            log.warning(
                "router %s does not list its workers (/workers, /list_workers): the in-flight window "
                "needs max_in_flight in the config",
                ep.name,
            )
            ep.worker_window = None
            return
        capacities: list[int | None] = []  # per worker: its max_running_requests (None: not reachable / said)
        modes: dict[str, bool | None] = {}  # worker -> streams deltas (None: not reachable / not said)
        # worker -> its drafter (not reachable from here: what the router itself says)
        drafters: dict[str, DrafterIdentity | None] = {}
        ep.worker_facts, ep.unread_workers = {}, {}
        for w in workers:
            wurl = worker_url(w)
            winfo = None
            wmodel = None
            if wurl:
                probe = Endpoint(url=wurl, name=display_url(wurl))
                wmodel = await self._get_json(probe, "/model_info")
                winfo = await self._get_json(probe, "/server_info")
            if wmodel is not None:
                why = self._worker_refusal(ep, display_url(wurl), wmodel, winfo)
                if why is not None:
                    self._refuse(ep, why)
                    return
            else:
                log.info(
                    "router %s: worker %s is not reachable from here; its revision is not checked (the router "
                    "reports %s)",
                    ep.name,
                    display_url(wurl) or "?",
                    printable(str(w.get("model_id") or "no model id")),
                )
            capacities.append(max_running_of(winfo) if winfo is not None else None)
            modes[display_url(wurl) or "?"] = stream_mode_of(winfo) if winfo is not None else None
            drafters[display_url(wurl) or "?"] = drafter_of(winfo) if winfo is not None else ep.drafter
            if winfo is not None and wurl:
                ep.worker_facts[display_url(wurl)] = Served(display_url(wurl), _version(winfo), drafter_of(winfo))
            elif wurl:  # smg labels each worker with its release
                ep.unread_workers[display_url(wurl)] = _version(w.get("labels") or {})
        # a worker not reachable from here counts with the mean of the reachable ones; none reachable: the
        # router's own /get_server_info, if it says (0.3.2's stub does not), for every worker
        ep.worker_window = router_window(capacities) or router_window([max_running_of(ep.server_info)] * len(workers))
        self._note_router_stream_mode(ep, modes)
        ep.drafter = router_drafter(drafters)
        if len(set(drafters.values())) > 1:
            log.info(
                "router %s: its workers run different drafters: a row carries the drafter of the worker the "
                "router names in its answer (%s), none where it names none",
                ep.name,
                "; ".join(f"{w}: {d.describe() if d else 'no speculative decoding'}" for w, d in drafters.items()),
            )
        ep.worker_drafters = drafters
        guessed = sum(1 for c in capacities if not c)
        log.info(
            "router %s: %d worker(s), max_running_requests %s in total%s",
            ep.name,
            len(workers),
            ep.worker_window or "unknown",
            f" ({guessed} not reachable from here, counted with the mean of the others)"
            if guessed and ep.worker_window and guessed < len(workers)
            else "",
        )

    def _worker_refusal(
        self, ep: Endpoint, worker: str, model_info: dict[str, Any], server_info: dict[str, Any] | None
    ) -> str | None:
        """Why a router is refused for one of its workers (another model or revision, an old SGLang), or None."""
        if self.expected_model is not None:
            verdict = judge_served_model(model_info, self.expected_model, who=f"router worker {worker}")
            if verdict.refusal is not None:
                return f"{verdict.refusal} (behind router {ep.name})"
        wrev = model_revision_of(model_info)
        if wrev != ep.revision and not self.revision_pinned:
            return (
                f"router worker {worker} serves {wrev}, the router's first worker "
                f"serves {ep.revision}: one router would mix two model revisions"
            )
        version = (server_info or {}).get("version")
        wv = parse_version(version)
        if wv is not None and wv < MIN_SERVER_VERSION and not self.allow_old_server:
            return (
                f"router worker {worker} runs SGLang {version}, older than 0.5.9 "
                "(set EAGLE3_ALLOW_OLD_SGLANG=1 to run anyway)"
            )
        return None

    def _note_router_stream_mode(self, ep: Endpoint, modes: dict[str, bool | None]) -> None:
        """A router's stream mode is its workers' (its own /get_server_info does not say): known only if all agree."""
        known = set(modes.values())
        if modes and None not in known and len(known) == 1:
            ep.incremental_stream = known.pop()
            return
        ep.incremental_stream = None
        log.warning(
            "router %s: stream mode of its workers not known from their /server_info (%s): each stream's "
            "output_ids are read as cumulative or delta by what the chunks show, or the sample fails "
            "(stream_mode_unknown)",
            ep.name,
            ", ".join(
                f"{k}: {'delta' if v else 'cumulative' if v is False else 'not reachable/said'}"
                for k, v in modes.items()
            )
            or "no workers listed",
        )

    async def start(self, *, configured_revision: str | None) -> None:
        """Probe every endpoint, wait (bounded) until one is routable, then keep probing in the background.

        When another shard of the same graph run already waited in vain (`wait_record`), fail at once."""
        self._raise_if_wait_failed_in_run()
        if configured_revision is not None:
            # The caller pinned the revision: the revisions endpoints report are not compared (what model they
            # serve, their versions and server-side defaults still are).
            self.model_revision = configured_revision
            self.revision_pinned = True
        t0 = time.monotonic()
        probes = asyncio.ensure_future(asyncio.gather(*(self.check_health(ep) for ep in self.endpoints)))
        done, _ = await asyncio.wait({probes}, timeout=self.first_report_s)
        if not done and not any(ep.routable for ep in self.endpoints):
            log.warning("SGLang endpoints not answering yet after %.0fs: %s", time.monotonic() - t0, self.describe())
        await probes
        warn_mixed_fleet({ep.name: ep.drafter for ep in self.endpoints if ep.server_info and not ep.refused})
        revs = {ep.name: ep.revision for ep in self.endpoints if ep.revision}
        if len(set(revs.values())) > 1 and not self.revision_pinned:
            # Which one is "right" is not ours to guess: pin GenerationConfig.model_revision or fix the fleet.
            raise ModelRevisionError(f"the endpoints serve different model revisions: {revs}")
        self._raise_if_all_refused()
        self._task = asyncio.create_task(self._monitor(), name="endpoint-monitor")
        await self.wait_routable(started=t0)

    def _raise_if_wait_failed_in_run(self) -> None:
        record = self.wait_record
        said = record.failed_wait() if record is not None else None
        if record is not None and said is not None:
            raise NoEndpointError(
                f"{said} [this run's endpoint wait already ran out in another shard: not waited again; {record.path}]"
            )

    def _raise_if_all_refused(self) -> None:
        if all(ep.refused or ep.mismatched for ep in self.endpoints):
            raise EndpointRefusedError("no usable SGLang endpoint: " + self.describe())

    def describe(self) -> str:
        """Every endpoint and its state, one line."""
        return "; ".join(f"{ep.name}: {ep.state}" for ep in self.endpoints)

    async def _monitor(self) -> None:
        last_full = time.monotonic()
        while True:
            await asyncio.sleep(self.probe_interval_s)
            full = time.monotonic() - last_full >= self.health_interval_s
            if full:
                last_full = time.monotonic()
            todo = [ep for ep in self.endpoints if not ep.mismatched and not ep.refused and (full or not ep.routable)]
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
    async def wait_routable(self, started: float | None = None) -> None:
        """Wait until an endpoint is routable; say which endpoint is in which state at once and every
        `report_every_s`; give up after `wait_for_endpoint_s` (from `started`) naming them all."""
        if any(ep.routable for ep in self.endpoints):
            return
        t0 = started if started is not None else time.monotonic()
        deadline = t0 + self.wait_for_endpoint_s
        next_report = time.monotonic()
        while not any(ep.routable for ep in self.endpoints):
            now = time.monotonic()
            self._raise_if_all_refused()
            self._raise_if_wait_failed_in_run()  # a shard waiting beside this one ran out: no second wait
            if now >= deadline:
                line = (
                    f"no routable SGLang endpoint after {self.wait_for_endpoint_s:.0f}s "
                    f"(EAGLE3_ENDPOINT_WAIT_S): {self.describe()}"
                )
                if self.wait_record is not None:
                    self.wait_record.record(line)
                raise NoEndpointError(line)
            if now >= next_report:
                if now >= self._next_wait_report:  # many samples wait at once: one line for all of them
                    log.warning(
                        "waiting for an SGLang endpoint (%.0fs of at most %.0fs): %s",
                        now - t0,
                        self.wait_for_endpoint_s,
                        self.describe(),
                    )
                    self._next_wait_report = now + self.report_every_s
                next_report = now + self.report_every_s
            self._changed.clear()
            try:
                await asyncio.wait_for(
                    self._changed.wait(),
                    timeout=max(0.01, min(deadline - now, next_report - now, self.probe_interval_s)),
                )
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
        log.warning(
            "endpoint %s failed %d times in a row: out of rotation for %.1fs",
            ep.name,
            ep.consecutive_failures,
            ep.cooldown_s,
        )

    def mark_unhealthy(self, ep: Endpoint, error: BaseException | None = None) -> None:
        """A connect error: the server is not there (restarting?); stop routing until a probe passes."""
        if error is not None:
            ep.state = describe_error(error, "/generate", self.health_timeout_s)
        self._recheck_when_back(ep)
        if ep.healthy:
            ep.healthy = False
            log.info("endpoint %s is now not routable: %s", ep.name, ep.state)  # as check_health says it
            self._changed.set()

    def mark_unroutable(self, ep: Endpoint, why: str) -> None:
        """A router answered 503 "No available workers": no work goes there until /readiness says so."""
        ep.state = why
        if ep.healthy:
            ep.healthy = False
            log.warning("endpoint %s: %s; waiting for it (samples keep their retries)", ep.name, why)
            self._changed.set()

    def max_in_flight(self, headroom: int, fallback: int = 64) -> int:
        """Sum over endpoints of max_running_requests + headroom; a router counts each of its workers."""
        total = 0
        for ep in self.endpoints:
            if ep.mismatched or ep.refused or ep.kind != "router":
                continue
            if ep.worker_window is None:
                raise EndpointRefusedError(
                    f"{ep.name} is an sglang-router that does not list its workers' capacity: set the in-flight "
                    "window yourself (SGLangFleet.max_in_flight / GenerationConfig.max_in_flight)"
                )
            total += ep.worker_window + headroom * max(1, len(ep.workers))
        vals = [
            max_running_of(ep.server_info)
            for ep in self.endpoints
            if not ep.mismatched and not ep.refused and ep.kind != "router"
        ]
        known = [v for v in vals if v]
        if not known and not total:
            return fallback
        return total + sum(known) + headroom * len(known)

    def context_length(self) -> int | None:
        """The largest context length the usable endpoints report (/server_info), if every one reports it.

        A prompt at least this long fits no endpoint: SGLang would answer 400 "The input (N tokens) is
        longer than the model's context length". None (nothing is skipped) when an endpoint does not say.
        """
        usable = [ep for ep in self.endpoints if not ep.mismatched and not ep.refused]
        known = [context_length_of(ep.server_info) for ep in usable]
        if not usable or any(c is None for c in known):
            return None
        return max(c for c in known if c is not None)

    def drafters(self) -> list[DrafterIdentity | None]:
        """The drafters the usable endpoints run (a router's: each of its workers')."""
        usable = [ep for ep in self.endpoints if ep.server_info and not ep.refused]
        return [d for ep in usable for d in (ep.worker_drafters.values() if ep.worker_drafters else [ep.drafter])]

    def versions(self) -> dict[str, str]:
        """Endpoint -> its SGLang release (/server_info `version`); a router's workers as `<worker> via <router>`."""
        out = {ep.name: printable(ep.server_version) for ep in self.endpoints if ep.server_version}
        for ep in self.endpoints:
            out.update({f"{w} via {ep.name}": printable(f.version) for w, f in ep.worker_facts.items() if f.version})
        return out

    def per_endpoint(self) -> dict[str, dict[str, int]]:
        return {ep.name: ep.stats() for ep in self.endpoints}


class DrafterReading(NamedTuple):
    """What drafts for one server of an endpoint, and how that is known: `direct`, from that server's own
    /server_info; else what the router in front of it says (a worker the client cannot reach)."""

    direct: bool
    drafter: DrafterIdentity | None


DrafterChange = tuple[str, DrafterReading, DrafterReading]  # (the server, what it ran, what it runs now)


def _watched(ep: Endpoint) -> dict[str, DrafterReading]:
    """What `ep`'s rows are attributed with, per server: a router's per listed worker (display URL, the key of
    Endpoint.worker_drafters and of what answers name), else the endpoint's own drafter under its name."""
    if ep.kind == "router" and ep.worker_drafters:
        return {w: DrafterReading(w in ep.worker_facts, d) for w, d in ep.worker_drafters.items()}
    return {ep.name: DrafterReading(True, ep.drafter)}


def _first_change(before: dict[str, DrafterReading], now: dict[str, DrafterReading]) -> DrafterChange | None:
    """The first server whose drafter differs between two readings that were learnt the same way. A worker read
    directly once and through the router the other time (it went out of the client's reach, or came into it)
    is not compared: the router's word is the /server_info of whichever worker it asks, and calling that the
    worker's new drafter stops a healthy run naming the wrong change. A server read only once (it joined, or
    does not answer now) is not compared either; it is when a later reading is of the same kind."""
    for server, was in before.items():
        is_now = now.get(server)
        if is_now is not None and is_now.direct == was.direct and is_now.drafter != was.drafter:
            return server, was, is_now
    return None


def drafter_change_text(endpoint: str, change: DrafterChange) -> str:
    """What changed under the run, for the error and the endpoint's state: the server (a router's worker by its
    URL) and both drafters; the servers' own words (drafter paths, a worker's URL) redacted, on one inert line."""
    server, was, now = change
    whose = "its drafter" if server == endpoint else f"its worker {server}'s drafter"
    if server != endpoint and not now.direct:
        whose += " (as the router reports it: the worker is not reachable from here)"
    said = f"{whose} changed under the running shard: {_described(was.drafter)} -> {_described(now.drafter)}"
    return printable(redact(said))


def _described(drafter: DrafterIdentity | None) -> str:
    return drafter.describe() if drafter is not None else "no speculative decoding"


def _version(info: dict[str, Any]) -> str | None:
    """A /server_info's `version` (the SGLang release), None when it does not say."""
    v = info.get("version")
    return str(v) if v not in (None, "") else None
