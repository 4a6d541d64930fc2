"""Fault injection of the simulator: the per-server fault state set by flags and `POST /_sim/faults`.

The fleet-level faults (error bodies, stalls, NaN finishes, weight-version switches, HTML answers)
live in fleet_faults.py; this module holds the server-level ones (queue-full bursts, connection
resets mid-body, crashes, latency, health state, output bug modes) and the two ways a fault cuts a
response: a TCP reset and a hard exit.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from . import fleet_faults as FF

if TYPE_CHECKING:
    from .engine import Sim

log = logging.getLogger("eagle3_dagster.sim")

MODES = ("normal", "drop-think-end", "echo-prompt-tail")


@dataclass
class Faults:
    queue_full_burst: int = 0
    reset_mid_body: int = 0
    crash_after: int = 0
    slow_tokens_ms: float = 0.0
    prefill_ms_per_1k: float = 0.0
    health: str = "ok"  # ok | starting | draining
    mode: str = "normal"  # normal | drop-think-end | echo-prompt-tail

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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


def reset_connection(request: web.Request) -> None:
    """Abort the TCP connection with a reset (SO_LINGER 0), like a crashed peer."""
    tr = request.transport
    if tr is None:
        return
    sock = tr.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    tr.abort()


def hard_exit() -> None:
    log.error("crash_after fault: exiting hard mid-response")
    logging.shutdown()
    os._exit(70)
