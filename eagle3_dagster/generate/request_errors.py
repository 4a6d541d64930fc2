"""How one /generate attempt fails, as the client's retry loop tells them apart, and which failures
count against the endpoint's circuit (one rule for the streamed and the non-streamed path)."""

from __future__ import annotations

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# Statuses that say "busy", not "broken": retried, but they do not open the circuit.
BUSY_STATUS = frozenset({408, 429, 503})
# Kinds that say the endpoint is broken, whether the answer was streamed or not: it cannot be reached
# (connect), its answer was cut (reset: a body cut mid-way, a stream that ends without [DONE]), or what
# it sent is not JSON (bad_body: a 200 body, a stream chunk).
BREAKER_KINDS = frozenset({"connect", "reset", "bad_body", "transport"})
# Kinds that do not: silence (read_timeout, stall: a slow server is working, only our patience ran out)
# and a rid of ours still in flight (duplicate_rid). An `http_<status>` kind counts by its status.
SPARED_KINDS = frozenset({"read_timeout", "stall", "duplicate_rid"})


def counts_against_circuit(kind: str, status: int | None) -> bool:
    """Whether a retried failure of this kind (and HTTP status) counts against the endpoint's circuit."""
    if kind.startswith("http_"):
        return status in RETRYABLE_STATUS and status not in BUSY_STATUS
    if kind not in BREAKER_KINDS and kind not in SPARED_KINDS:
        raise ValueError(f"retry kind {kind!r} has no circuit rule: add it to BREAKER_KINDS or SPARED_KINDS")
    return kind in BREAKER_KINDS


class RetryableFailure(Exception):
    """Sent again with a new rid. `breaker` (from `counts_against_circuit`, never chosen where it is
    raised): the failure counts against the endpoint's circuit; `url`: the endpoint to abort the
    abandoned request on (a timeout or a stall)."""

    def __init__(self, kind: str, status: int | None, detail: str, *, url: str = "") -> None:
        super().__init__(detail)
        self.url = url
        self.kind = kind
        self.status = status
        self.detail = detail
        self.breaker = counts_against_circuit(kind, status)


class UnroutableEndpoint(Exception):
    """The endpoint (a router) has no worker to send to: wait for it, do not spend a retry."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class FinalFailure(Exception):
    """The same request would fail the same way: recorded with its reason, not sent again."""

    def __init__(self, reason: str, status: int | None, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.status = status
        self.detail = detail
