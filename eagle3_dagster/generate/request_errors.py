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


def http_status(v: object) -> int | None:
    """A status a server names in its body (an abort's status_code, a stream error chunk's code) as an HTTP
    status, or None when it is none (not an integer in 100..599: it would name a reason code and overflow
    the error row's int32 `status` column)."""
    return v if type(v) is int and 100 <= v <= 599 else None


def is_permanent_reason(reason: str) -> bool:
    """Failures that the same request would hit again (a 4xx other than 408/429, a bad prompt): recorded in
    errors.parquet and not sent again by later runs. Every other reason is retryable: the next run sends it
    again (a refused answer, a stall, retries exhausted, a server error body)."""
    if reason in ("empty_input_ids", "input_id_out_of_vocab"):
        return True
    return (reason.startswith(("http_4", "abort_4"))) and reason[-3:] not in ("408", "429")


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


REQUEST_DEADLINE = "request_deadline"  # the reason of a sample that ran out of its overall deadline


class DeadlineExceeded(Exception):
    """An attempt cut at the request's overall deadline; `endpoint` (display name) and `url`: where it ran
    ("" when it never reached one)."""

    def __init__(self, endpoint: str, url: str) -> None:
        super().__init__(f"request deadline exceeded on {endpoint or 'no endpoint'}")
        self.endpoint = endpoint
        self.url = url


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
