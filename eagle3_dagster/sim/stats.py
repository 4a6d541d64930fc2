"""The simulator's counters: requests, items, finish reasons, errors, faults, tokens, GPU time (admin.py reports them)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
