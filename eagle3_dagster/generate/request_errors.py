"""How one /generate attempt fails, as the client's retry loop tells them apart."""

from __future__ import annotations


class RetryableFailure(Exception):
    """Sent again with a new rid. `breaker`: the failure counts against the endpoint's circuit;
    `url`: the endpoint to abort the abandoned request on (a timeout or a stall)."""

    def __init__(self, kind: str, status: int | None, detail: str, *, breaker: bool, url: str = "") -> None:
        super().__init__(detail)
        self.url = url
        self.kind = kind
        self.status = status
        self.detail = detail
        self.breaker = breaker


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
