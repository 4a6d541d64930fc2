"""The simulator's counters (`GET /_sim/stats`): requests, items, finish reasons, errors, faults, tokens, GPU time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Sim


@dataclass
class Stats:
    requests: int = 0  # HTTP /generate calls
    items: int = 0  # scheduler requests (batch items, n samples)
    finished: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # by status code
    faults_injected: dict[str, int] = field(default_factory=dict)
    rid_counts: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    slot_seconds: float = 0.0  # sum over requests of time holding a GPU slot
    busy_seconds: float = 0.0  # wall time with at least one request running
    client_disconnects: int = 0
    peak_in_flight: int = 0  # highest number of concurrent scheduler requests seen
    peak_running: int = 0  # highest number of requests holding a GPU slot at once
    chat_requests: int = 0
    first_request_at: float | None = None  # epoch seconds: the first /generate item arrived (bench/fleet.py)
    last_answer_at: float | None = None  # epoch seconds: the last item finished

    def bump(self, d: dict[str, int], key: str, by: int = 1) -> None:
        d[key] = d.get(key, 0) + by


def stats_payload(sim: Sim, *, with_rids: bool = False) -> dict[str, Any]:
    """The `GET /_sim/stats` answer; `with_rids` adds the per-rid request counts (`?rids=1`)."""
    s = sim.stats
    up = time.time() - sim.started_at
    d: dict[str, Any] = {
        "version": sim.version,
        "mode": sim.faults.mode,
        "model": sim.profile.name,
        "uptime_seconds": up,
        "health": sim.health_state(),
        "requests": s.requests,
        "items": s.items,
        "chat_requests": s.chat_requests,
        "first_request_at": s.first_request_at,
        "last_answer_at": s.last_answer_at,
        "finished": s.finished,
        "errors": s.errors,
        "faults_injected": {**s.faults_injected, **sim.fleet.injected},
        "rids_seen": len(s.rid_counts),
        "rids_repeated": sum(1 for c in s.rid_counts.values() if c > 1),
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "cached_tokens": s.cached_tokens,
        "running": sim.running,
        "waiting": sim.waiting,
        "in_flight": len(sim.in_flight),
        "peak_in_flight": s.peak_in_flight,
        "peak_running": s.peak_running,
        "max_running_requests": sim.args.max_running_requests,
        "slot_seconds": s.slot_seconds,
        "busy_seconds": sim.busy_seconds(),
        "client_disconnects": s.client_disconnects,
        "prefix_cache_nodes": sim.trie.nodes,
        "prefix_cache_evictions": sim.trie.evictions,
        "faults": sim.faults.as_dict(),
        "noncanonical": sim.model.splitter.stats() if sim.model.splitter is not None else None,
    }
    d["utilization"] = s.slot_seconds / (up * sim.args.max_running_requests) if up > 0 else 0.0
    if with_rids:
        d["rid_counts"] = s.rid_counts
    return d
