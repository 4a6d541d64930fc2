"""What an SGLang endpoint reports and how it is described: errors, versions, revisions, limits.

Plain functions over /model_info, /server_info and transport errors, and the per-endpoint state
(`Endpoint`) that endpoints.EndpointPool keeps; no I/O here.
"""

from __future__ import annotations

import errno
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from ..secret import printable, redact
from .drafter import DrafterIdentity
from .served_model import ServedModel


class NoEndpointError(RuntimeError):
    """No endpoint became routable within the configured wait."""


class AuthError(RuntimeError):
    """The server refused the API key (401/403). The key itself is never part of the message."""


def url_credentials(url: str) -> str | None:
    """The user name of a URL's `user:password@` part ("" when only a password), or None when it has none."""
    try:
        p = urlsplit(url)
    except ValueError:
        return None
    return (p.username or "") if (p.username or p.password) else None


def auth_refused(where: str, status: int, url: str, headers: Mapping[str, str]) -> AuthError:
    """The 401/403 error, naming the credential that was actually sent (never its value).

    httpx turns a URL's `user:password@` into Basic auth and that replaces any Authorization header,
    so with user info in the URL the Bearer key (SGLANG_API_KEY) never reaches the server.
    """
    user = url_credentials(url)
    if user is not None:
        sent = (
            f"the Basic credentials of the endpoint URL's user info (user {user!r}, password not shown) were sent "
            "and refused"
            + (
                ", in place of the SGLANG_API_KEY Bearer key"
                if any(k.lower() == "authorization" for k in headers)
                else ""
            )
            + ": check that user and password, or drop them from the URL and set SGLANG_API_KEY"
        )
    elif any(k.lower() == "authorization" for k in headers):
        sent = "the Bearer key from SGLANG_API_KEY was sent and refused: it is wrong for this server"
    else:
        sent = (
            "no credential was sent (SGLANG_API_KEY is not set, the URL has no user info): the server wants one; "
            "set SGLANG_API_KEY to its --api-key"
        )
    return AuthError(f"{where} answered {status}: {sent}")


class ModelRevisionError(RuntimeError):
    """The endpoints serve different model revisions; mixing them would poison a dataset."""


class ServingChangedError(RuntimeError):
    """An endpoint's drafter changed under a running shard: answers do not say which drafter served them, so
    the run stops at the change, and the answers since the drafter was last confirmed are not stored."""


class EndpointRefusedError(RuntimeError):
    """Every endpoint was refused for this run (old server version, server-side sampling defaults, ...)."""


MIN_SERVER_VERSION = (0, 5, 9)
# Sampling fields that change what is generated (spec §2.2); a server default for one the client
# does not send would change the data invisibly. Text-only flags are harmless.
DISTRIBUTION_KEYS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "stop",
        "stop_regex",
        "stop_token_ids",
        "ignore_eos",
        "n",
        "sampling_seed",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "logit_bias",
        "custom_params",
    }
)


def parse_version(v: Any) -> tuple[int, ...] | None:
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(v or ""))
    if not m:
        return None
    return tuple(int(x) for x in m.groups() if x is not None)


def preferred_params_of(info: dict[str, Any]) -> dict[str, Any]:
    """`preferred_sampling_params` from /model_info: SGLang reports the CLI's JSON string (or null)."""
    raw = info.get("preferred_sampling_params")
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {"<unparsed>": raw}
    return dict(raw) if isinstance(raw, dict) else {"<unparsed>": raw}


def error_message(body: bytes) -> str:
    """The server's message from any of the §4.1 error shapes, else the raw text, redacted, its control
    characters escaped (secret.printable), then cut to 1000 characters (cut after: a key cut in two would no
    longer be recognised): gateways and validation errors quote the request back, Authorization header included."""
    return printable(redact(_error_text(body[:MAX_ERROR_BODY])))[:1000]


MAX_ERROR_BODY = 20_000  # bytes of an error body read for its message (only the first 1000 chars are kept)


def _error_text(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    try:
        d = json.loads(text)
    except ValueError:
        return text
    if isinstance(d, dict):
        err = d.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in d:
            return str(d["message"])
    return text


def safe_message(msg: str, *, secrets: tuple[str, ...] = (), limit: int = 300) -> str:
    """A server's message fit for logs and error rows: secrets redacted (secret.redact), one line with its
    control characters escaped (secret.printable), truncated."""
    msg = printable(" ".join(redact(msg, secrets=secrets).split()))
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"


def server_said(r: httpx.Response, limit: int = 300) -> str:
    """A response body's text as one line, for a message: redacted (servers quote requests back), its control
    characters escaped, then cut."""
    return printable(redact(" ".join(r.text.split())))[:limit]


def describe_error(e: BaseException, path: str, timeout: float) -> str:
    """A transport error as a person reads it (redacted: an exception's text may carry a URL with credentials;
    printable: it may quote what the server sent)."""
    return printable(redact(_describe_error(e, path, timeout)))


def _describe_error(e: BaseException, path: str, timeout: float) -> str:
    if isinstance(e, httpx.ConnectError):
        cause: BaseException | None = e
        while cause is not None:
            if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
                return "connection refused"
            cause = cause.__cause__ or cause.__context__
        text = str(e).lower()
        if "refused" in text:
            return "connection refused"
        if "name or service not known" in text or "nodename nor servname" in text or "name resolution" in text:
            return f"host name does not resolve ({e})"
        return f"cannot connect ({e or type(e).__name__})"
    if isinstance(e, httpx.ConnectTimeout):
        return "connect timeout"
    if isinstance(e, httpx.TimeoutException):
        return f"no answer to {path} within {timeout:g}s"
    return f"{path}: {type(e).__name__}: {e}"[:200]


def display_url(url: str) -> str:
    """The URL without any user:password part (and credential-like query values redacted), printable (a router
    lists its workers' URLs: server text), for logs and metadata."""
    try:
        p = urlsplit(url)
        has_userinfo = bool(p.username or p.password)
    except ValueError:
        return printable(redact(url))
    if has_userinfo:
        host = p.hostname or ""
        if p.port:
            host = f"{host}:{p.port}"
        url = urlunsplit((p.scheme, host, p.path, p.query, p.fragment))
    return printable(redact(url))


@dataclass(frozen=True)
class Served:
    """Who generated an answer, as a row keeps it: the SGLang server (the endpoint itself; behind a gateway
    the worker it named, None when it names none), its release (/server_info `version`) and its drafter."""

    worker: str | None
    version: str | None
    drafter: DrafterIdentity | None


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
    kind: str = ""  # "server" | "router" once known
    state: str = "not probed yet"  # why it is (not) routable, for people
    refused: str = ""  # refused for the whole run: the reason
    server_version: str = ""
    # --incremental-streaming-output: stream chunks carry deltas (True), cumulative ids (False), or not
    # known (None: a router whose workers' /server_info is out of reach): then each stream tells (client.py)
    incremental_stream: bool | None = None
    preferred_sampling_params: dict[str, Any] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)  # a router's workers, as it lists them
    worker_window: int | None = None  # a router's in-flight window from its workers
    drafter: DrafterIdentity | None = None  # the speculative drafter it runs (a router: its workers', if one)
    served_model: ServedModel | None = None  # what its /model_info says it serves (model_path, model_type)
    # a router's workers the client could read /server_info of: display URL -> what they run; the others ->
    # the release the router's /workers label says (smg), if any
    worker_facts: dict[str, Served] = field(default_factory=dict)
    unread_workers: dict[str, str | None] = field(default_factory=dict)
    worker_drafters: dict[str, DrafterIdentity | None] = field(default_factory=dict)  # every listed worker's
    # a router's answers that named no worker (mixed drafters: warned once), workers named but never listed
    unattributed_warned: bool = False
    unknown_workers: set[str] = field(default_factory=set)
    changed: str = ""  # what it serves changed under the run (its drafter): why its unconfirmed rows are not stored

    @property
    def routable(self) -> bool:
        if not self.healthy or self.circuit_open or self.mismatched or self.refused:
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
    """`<model_path>@<weight_version>`, redacted and printable: a model path may be a URI with credentials
    or hold control characters, and the revision is stored in every row (it is a key, not the server's
    words) and named in logs, metadata and the data card."""
    path = str(info.get("model_path") or info.get("served_model_name") or "unknown-model")
    wv = info.get("weight_version")
    return printable(redact(f"{path}@{wv if wv is not None else 'default'}"))


def stream_mode_of(info: dict[str, Any]) -> bool | None:
    """From an SGLang /server_info: True if stream chunks carry deltas, False if cumulative, None if not said.

    0.5.23 names the flag `incremental_streaming_output`, 0.5.9 `stream_output`; a router's own
    /get_server_info stub ({"router_manager":true,...}) has neither.
    """
    for key in ("incremental_streaming_output", "stream_output"):
        if key in info:
            return bool(info[key])
    return None


def context_length_of(info: dict[str, Any]) -> int | None:
    """The server's context length from /server_info (`context_length`; `max_model_len` as /v1/models names it)."""
    for k in ("context_length", "max_model_len"):
        v = info.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


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


def router_window(per_worker: list[int | None]) -> int | None:
    """The in-flight window of a router's workers: each reachable worker's max_running_requests, and a worker
    the client cannot ask (dead, or on another network) counted with the mean of the reachable ones, rounded
    up (one unreachable worker of two must not halve the window). None when no worker told its capacity."""
    known = [v for v in per_worker if v]
    if not known:
        return None
    unknown = len(per_worker) - len(known)
    return sum(known) + -(-sum(known) * unknown // len(known))


def is_router_readiness(status_code: int, content_type: str) -> bool:
    """A `/readiness` answer that marks a router (sglang-router / SMG): 200 or 503 and not an HTML page.
    Plain SGLang servers answer 404 (or 405) there."""
    return status_code in (200, 503) and "html" not in content_type


ROUTER_WORKER_LISTS = ("/workers", "/list_workers")  # the router's worker list: 0.3.x, then older routers


def workers_listed(data: Any) -> list[dict[str, Any]]:
    """The workers a router lists: `/workers` ({"workers": [{"url", "is_healthy", ...}, ...]}) or the older
    `/list_workers` ({"urls": [...]}); each as a dict with at least "url". Empty when the answer lists none."""
    if not isinstance(data, dict):
        return []
    if isinstance(data.get("workers"), list):
        return [w if isinstance(w, dict) else {"url": str(w)} for w in data["workers"]]
    if isinstance(data.get("urls"), list):
        return [{"url": str(u)} for u in data["urls"]]
    return []


def worker_url(worker: dict[str, Any]) -> str:
    return str(worker.get("url") or "").rstrip("/")


_TEXT_ONLY = frozenset({"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval"})


def jittered_backoff(attempt: int, base: float, cap: float) -> float:
    """Full jitter (AWS style): spreads a thundering herd after a 503 burst or a restart."""
    return random.uniform(0, min(cap, base * (2**attempt)))
