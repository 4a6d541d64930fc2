"""Fault injection of the simulator: the per-server fault state set by flags and `POST /_sim/faults`.

The fleet-level faults (error bodies, stalls, NaN finishes, weight-version switches, HTML answers)
live in fleet_faults.py; this module holds the server-level ones (queue-full bursts, connection
resets mid-body, crashes, latency, health state, output bug modes) and the two ways a fault cuts a
response: a TCP reset and a hard exit. admin.py applies a `POST /_sim/faults` body to both.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

from aiohttp import web

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
