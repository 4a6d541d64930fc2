"""The pure parts of counting a fleet's capacity (generate/fleet_capacity.py, endpoint_info.py, plan/probe.py):
how a router is recognised and its worker list read, how its workers' slots add up, what the line says."""

from __future__ import annotations

import pytest

from eagle3_dagster.generate.endpoint_info import is_router_readiness, workers_listed
from eagle3_dagster.generate.fleet_capacity import EndpointCapacity, probe_fleet, router_capacity
from eagle3_dagster.plan.probe import EndpointProbe, tokens_per_s_per_server


@pytest.mark.parametrize(
    "status, ctype, router",
    [
        (200, "application/json", True),  # sglang-router 0.3.2: {"status":"ready",...}
        (503, "application/json", True),  # a router with no healthy worker is still a router
        (404, "", False),  # a plain SGLang server
        (405, "text/plain", False),
        (200, "text/html; charset=utf-8", False),  # some web page, not a router
    ],
)
def test_a_router_is_what_answers_readiness(status: int, ctype: str, router: bool) -> None:
    assert is_router_readiness(status, ctype) is router


def test_both_worker_list_shapes_are_read() -> None:
    new = {"workers": [{"url": "http://a:1", "is_healthy": True}, "http://b:2"]}
    assert workers_listed(new) == [{"url": "http://a:1", "is_healthy": True}, {"url": "http://b:2"}]
    assert workers_listed({"urls": ["http://a:1"]}) == [{"url": "http://a:1"}]  # older routers' /list_workers
    assert workers_listed(None) == workers_listed({"status": "ok"}) == workers_listed([1]) == []


def test_a_router_sums_its_workers_and_counts_an_unreachable_one_as_the_mean() -> None:
    live = router_capacity("http://r:8000", {"http://w1": 8, "http://w2": 8})
    assert (live.slots, live.servers, live.unreachable) == (16, 2, ())
    assert live.describe() == "router http://r:8000: 2 workers, 16 slots"
    one_dead = router_capacity("http://r:8000", {"http://w1": 4, "http://w2": None, "http://w3": 9})
    assert (one_dead.slots, one_dead.servers) == (13 + 7, 3)  # 4 + 9 + ceil(13 / 2)
    assert one_dead.describe() == (
        "router http://r:8000: 3 workers, 20 slots (1 worker unreachable, counted as the mean: http://w2)"
    )


def test_a_router_with_no_worker_answering_or_listed_is_unknown_and_says_why() -> None:
    dead = router_capacity("http://r:8000", {"http://w1": None, "http://w2": None})
    assert (dead.slots, dead.servers) == (None, 2)
    assert dead.describe() == (
        "router http://r:8000: 2 workers, capacity unknown (no worker told its max_running_requests: "
        "http://w1, http://w2)"
    )
    empty = router_capacity("http://r:8000", {})
    assert (empty.slots, empty.servers) == (None, 1)
    assert "lists no worker" in empty.describe()


def test_a_plain_server_is_one_server() -> None:
    s = EndpointCapacity("http://s:30000", 64)
    assert (s.servers, s.describe()) == (1, "http://s:30000: 64 slots")
    down = EndpointCapacity("http://s:30000", None, why="connection refused")
    assert (down.servers, down.describe()) == (1, "http://s:30000: capacity unknown (connection refused)")


def test_throughput_per_server_divides_a_routers_burst_by_its_workers() -> None:
    router = EndpointProbe("http://r", requests=24, output_tokens=3000, wall_s=10.0, model_revision="m", servers=3)
    server = EndpointProbe("http://s", requests=8, output_tokens=1000, wall_s=10.0, model_revision="m")
    assert tokens_per_s_per_server([router]) == pytest.approx(100.0)
    assert tokens_per_s_per_server([router, server]) == pytest.approx((300.0 + 100.0) / 4)


def test_a_plain_server_is_read_from_its_own_server_info_and_a_dead_one_is_named(start_sim) -> None:
    """A real simulator (it answers /readiness 404: not a router) and a port nobody listens on."""
    sim = start_sim("--max-running-requests", "7")
    up, down = probe_fleet([sim.url, "http://127.0.0.1:9"], timeout_s=3.0)
    assert (up.slots, up.workers, up.servers) == (7, None, 1)
    assert (down.slots, down.describe()) == (None, "http://127.0.0.1:9: capacity unknown (connection refused)")
