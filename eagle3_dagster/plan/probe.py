"""A short throughput probe of the configured SGLang endpoints: a few real POST /generate requests.

Each endpoint gets `requests` concurrent requests per server behind it (a router: per listed worker,
generate/fleet_capacity.py) built from the plan's own prompts (their exact input_ids), with the run's
sampling parameters but `max_new_tokens` capped at `max_new_tokens`; its output tokens per second is
the sum of the answers' `meta_info.completion_tokens` over the wall time of that burst, and per server
that divided by its servers. A burst this small fills fewer slots than a full run, so the figure is a lower
bound of what a busy server sustains (the plan says so). /model_info gives the revision the cache
keys use (generate.endpoint_info.model_revision_of, as the generate step reads it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ..generate.endpoint_info import context_length_of, display_url, model_revision_of, server_said
from ..generate.tls import tls_context
from ..secret import redact


class ProbeError(RuntimeError):
    """An endpoint could not be probed (unreachable, refused, an answer without tokens)."""


class ServedModelError(RuntimeError):
    """An endpoint (or a router's worker) serves another model than the run's: nothing is sent to it, and
    the plan is not made (the run would refuse it). `lines`: one per server, as
    fleet_capacity.served_model_problems words them."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


@dataclass
class EndpointProbe:
    endpoint: str  # display form (no credentials)
    requests: int
    output_tokens: int
    wall_s: float
    model_revision: str
    servers: int = 1  # servers behind the endpoint (a router: its workers); the burst was `requests` x this
    context_length: int | None = None  # /server_info context_length (None: not reported)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def tokens_per_s_per_server(probes: Sequence[EndpointProbe]) -> float:
    """The fleet's measured output tokens/s over the servers behind the probed endpoints."""
    servers = sum(p.servers for p in probes)
    return sum(p.tokens_per_s for p in probes) / servers if servers else 0.0


async def _revision(client: httpx.AsyncClient, url: str, name: str, headers: dict[str, str]) -> str:
    """What the endpoint serves: /model_info, or /get_model_info (an sglang-router has only that one)."""
    answered = ""
    for path in ("/model_info", "/get_model_info"):
        try:
            info = await client.get(url + path, headers=headers)
        except httpx.HTTPError as e:
            raise ProbeError(redact(f"probe of {name}: {path}: {type(e).__name__}: {e}")) from None
        if info.status_code == 200:
            try:
                return model_revision_of(info.json())
            except ValueError:
                raise ProbeError(f"probe of {name}: {path} answered something that is not JSON") from None
        answered += f"{', ' if answered else ''}{path} answered {info.status_code}"
    raise ProbeError(f"probe of {name}: {answered}")


async def _context_length(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> int | None:
    """/server_info context_length, as the generate step reads it; None when the endpoint does not say."""
    try:
        r = await client.get(url + "/server_info", headers=headers)
        return context_length_of(r.json()) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def _probe_one(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    prompts: Sequence[list[int]],
    sampling: dict[str, Any],
    n: int,
    servers: int,
) -> EndpointProbe:
    name = display_url(url)
    revision = await _revision(client, url, name, headers)
    context = await _context_length(client, url, headers)

    async def one(i: int) -> int:
        body = {"input_ids": list(prompts[i % len(prompts)]), "sampling_params": sampling, "stream": False}
        try:
            r = await client.post(url + "/generate", json=body, headers=headers)
        except httpx.HTTPError as e:
            raise ProbeError(redact(f"probe of {name}: /generate: {type(e).__name__}: {e}")) from None
        if r.status_code != 200:
            raise ProbeError(f"probe of {name}: /generate answered {r.status_code}: {server_said(r, 200)}")
        try:
            data = r.json()
        except ValueError:
            raise ProbeError(f"probe of {name}: /generate answered something that is not JSON") from None
        data = data[0] if isinstance(data, list) and data else data
        if not isinstance(data, dict):
            raise ProbeError(f"probe of {name}: /generate answered {type(data).__name__}, not an object")
        meta = data.get("meta_info") or {}
        tokens = meta.get("completion_tokens")
        if not isinstance(tokens, int):
            ids = data.get("output_ids")
            tokens = len(ids) if isinstance(ids, list) else None
        if tokens is None:
            raise ProbeError(f"probe of {name}: a /generate answer has neither completion_tokens nor output_ids")
        return tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - start
    return EndpointProbe(name, n, sum(counts), wall, revision, servers, context)


@dataclass(frozen=True)
class ProbeSize:
    """How much a probe asks: `requests` per server, each of at most `max_new_tokens`, within `timeout_s`."""

    requests: int = 8
    max_new_tokens: int = 128
    timeout_s: float = 600.0


def probe_endpoints(
    endpoints: Sequence[str],
    prompts: Sequence[list[int]],
    sampling: dict[str, Any],
    *,
    size: ProbeSize = ProbeSize(),
    api_key: str | None = None,
    servers: Sequence[int] | None = None,
) -> list[EndpointProbe]:
    """Probe every endpoint (one after the other, so they do not share the client's wall time) with
    `size.requests` per server behind it (`servers`, one per endpoint; default 1 each)."""
    requests, max_new_tokens = size.requests, size.max_new_tokens
    if not prompts:
        raise ProbeError("nothing to probe with: no prompt tokenized")
    per_endpoint = list(servers) if servers is not None else [1] * len(endpoints)
    if len(per_endpoint) != len(endpoints) or any(n < 1 for n in per_endpoint):
        raise ProbeError(f"servers per endpoint must be >= 1, one per endpoint, got {per_endpoint}")
    if requests < 1 or max_new_tokens < 1:
        raise ProbeError("the probe needs at least one request of at least one token")
    cap = min(int(sampling.get("max_new_tokens", max_new_tokens)), max_new_tokens)
    capped = {**sampling, "max_new_tokens": cap}
    if "min_new_tokens" in capped:
        capped["min_new_tokens"] = min(int(capped["min_new_tokens"]), cap)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    async def run() -> list[EndpointProbe]:
        limits = httpx.Limits(max_connections=requests * max(per_endpoint, default=1) + 2)
        async with httpx.AsyncClient(
            timeout=size.timeout_s, limits=limits, trust_env=False, verify=tls_context()
        ) as client:
            return [
                await _probe_one(client, url.rstrip("/"), headers, prompts, capped, requests * k, k)
                for url, k in zip(endpoints, per_endpoint, strict=True)
            ]

    return asyncio.run(run())
