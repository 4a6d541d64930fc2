"""What the simulator-only admin routes do with a running server's state: `POST /_sim/faults` and `GET /_sim/stats`."""

from __future__ import annotations

import time
from typing import Any

from . import fleet_faults as FF
from . import speculative as SP
from .faults import MODES, Faults
from .state import Sim


def apply_fault_body(sim: Sim, body: Any) -> Faults:
    """Apply one `POST /_sim/faults` JSON body to `sim` (fleet faults at once); return the new Faults.

    Raises ValueError / TypeError naming the bad field; the caller answers 400 and keeps the old faults.
    """
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    a = sim.args
    clear = body.pop("clear", False)
    f = (
        Faults(slow_tokens_ms=a.token_latency_ms, prefill_ms_per_1k=a.prefill_ms_per_1k, mode=a.mode)
        if clear
        else sim.faults
    )
    fleet = (
        FF.FleetFaults(injected=sim.fleet.injected, weight_version=sim.deployment.weight_version)
        if clear
        else sim.fleet
    )
    FF.apply(fleet, body)
    sim.fleet = fleet
    if clear:  # a drafter the fault drafter_after switched goes back to the command line's
        sim.spec = SP.spec_config(a)
    unknown = set(body) - set(Faults.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown fault(s): {sorted(unknown)}")
    for k in ("queue_full_burst", "reset_mid_body", "crash_after"):
        if k in body:
            setattr(f, k, int(body[k] or 0))
    for k in ("slow_tokens_ms", "prefill_ms_per_1k"):
        if k in body:
            setattr(f, k, float(body[k] or 0.0))
    if "mode" in body:
        if body["mode"] not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        f.mode = body["mode"]
    if "health" in body:
        if body["health"] not in ("ok", "starting", "draining"):
            raise ValueError("health must be ok, starting or draining")
        f.health = body["health"]
        if f.health == "ok":
            sim.ready_at = 0.0  # an explicit "ok" also ends --starting-seconds
    return f


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
