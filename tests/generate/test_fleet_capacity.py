"""The pure parts of counting a fleet's capacity (generate/fleet_capacity.py, endpoint_info.py, plan/probe.py):
how a router is recognised and its worker list read, how its workers' slots add up, what the line says; and
which model each endpoint (each router worker) serves, judged as the run judges it, on real simulators."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator

import httpx
import pytest
from gen_helpers import start_mini_router

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate.endpoint_info import is_router_readiness, workers_listed
from eagle3_dagster.generate.fleet_capacity import (
    EndpointCapacity,
    endpoint_problems,
    probe_fleet,
    router_capacity,
    served_model_problems,
    served_model_warnings,
)
from eagle3_dagster.generate.served_model import ExpectedModel
from eagle3_dagster.plan.probe import EndpointProbe, tokens_per_s_per_server
from eagle3_dagster.profiles import load_profile


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


# --- which model each endpoint serves: `eagle3 check` and `eagle3 plan` judge it as the run does ---------------

QWEN_ARGS = ("--model", "qwen3", "--tokenizer", str(PROJECT_ROOT.parent / "shared" / "tokenizers" / "qwen3"))


def _expected(name: str, pin: str | None = None) -> ExpectedModel:
    return ExpectedModel.of(load_profile(name, PROJECT_ROOT / "assets" / "models"), pin)


def test_a_server_of_another_model_is_named_with_both_models_and_the_pin(start_sim) -> None:
    """A real Kimi-K2.5 simulator and a real Qwen3 one (`--model qwen3`: the Qwen tokenizer, its /model_info
    names Qwen/Qwen3-8B, model_type qwen3), and a port nobody listens on."""
    kimi, qwen = start_sim(), start_sim(*QWEN_ARGS)
    fleet = probe_fleet([kimi.url, qwen.url, "http://127.0.0.1:9"], timeout_s=3.0)
    assert [a.served.model_type for c in fleet for a in c.models] == ["kimi_k25", "qwen3"]

    [line] = served_model_problems(fleet, _expected("kimi-k2.5"))  # the dead one is endpoint_problems' line
    assert line.startswith(f"EAGLE3_SGLANG_URL {qwen.url}: the endpoint serves another model: "), line
    for text in ("model_path 'Qwen/Qwen3-8B' (model_type 'qwen3')", "model profile kimi-k2.5", "'kimi_k25'"):
        assert text in line, (text, line)
    assert line.endswith("pin it: EAGLE3_SERVED_MODEL=Qwen/Qwen3-8B"), line
    assert served_model_warnings(fleet, _expected("kimi-k2.5")) == []
    assert [ln.split(": ")[0] for ln in endpoint_problems(fleet)] == ["EAGLE3_SGLANG_URL http://127.0.0.1:9"]

    # the Qwen profile: the other way round; no profile and no pin: nothing to judge
    [kimi_line] = served_model_problems(fleet, _expected("qwen3"))
    assert kimi_line.startswith(f"EAGLE3_SGLANG_URL {kimi.url}: the endpoint serves another model: ")
    assert "'qwen3' or 'qwen3_moe'" in kimi_line
    assert served_model_problems(fleet, None) == served_model_warnings(fleet, None) == []

    # the user's pin: the Qwen server is used (a warning: not the profile's model_type), the Kimi one refused
    pinned = _expected("kimi-k2.5", "Qwen/Qwen3-8B")
    [refused] = served_model_problems(fleet, pinned)
    assert refused == (
        f"EAGLE3_SGLANG_URL {kimi.url}: the endpoint serves model_path 'moonshotai/Kimi-K2.5' (model_type "
        "'kimi_k25'), but EAGLE3_SERVED_MODEL pins model_path 'Qwen/Qwen3-8B'"
    )
    [warning] = served_model_warnings(fleet, pinned)
    assert warning.startswith(f"EAGLE3_SGLANG_URL {qwen.url}: the endpoint serves model_path 'Qwen/Qwen3-8B'")
    assert warning.endswith("used because EAGLE3_SERVED_MODEL pins it"), warning


def test_credentials_in_a_served_model_path_or_the_pin_never_appear(start_sim) -> None:
    secret = "s3cr3t-Passw0rd"
    sim = start_sim()
    sim.faults(claimed_model={"model_path": f"s3://user:{secret}@bucket/model", "model_type": "qwen3"})
    fleet = probe_fleet([sim.url])
    [line] = served_model_problems(fleet, _expected("kimi-k2.5"))
    assert "s3://user:[redacted]@bucket/model" in line and "'qwen3'" in line, line
    # pinned: used, with a warning; a pin of another path with credentials is refused, quoting the pin
    pinned = _expected("kimi-k2.5", f"s3://user:{secret}@bucket/model")
    other = _expected("kimi-k2.5", f"s3://admin:{secret}@bucket/other")
    lines = [
        line,
        *served_model_warnings(fleet, pinned),
        *served_model_problems(fleet, other),
        repr(fleet),
    ]
    assert served_model_problems(fleet, pinned) == [] and len(lines) == 4, lines
    assert "s3://admin:[redacted]@bucket/other" in lines[2], lines[2]
    assert not [ln for ln in lines if secret in ln], lines


@pytest.mark.integration
def test_a_routers_workers_are_judged_each_by_its_own_model_info(start_sim) -> None:
    """A router (tests/generate/mini_router.py: it answers /readiness and lists /workers) in front of a Kimi
    and a Qwen worker: the line names the worker. A router that lists no worker reachable from here is judged
    by its own /get_model_info."""
    kimi, qwen = start_sim(), start_sim(*QWEN_ARGS)
    router, url = start_mini_router(kimi.url)
    try:
        httpx.post(url + "/_router/workers", json={"urls": [kimi.url, qwen.url]}, timeout=5).raise_for_status()
        [line] = served_model_problems(probe_fleet([url]), _expected("kimi-k2.5"))
        assert line.startswith(f"EAGLE3_SGLANG_URL {url}: router worker {qwen.url} serves another model: "), line
        assert "'qwen3'" in line and "'kimi_k25'" in line
        assert served_model_problems(probe_fleet([url]), _expected("qwen3"))[0].startswith(
            f"EAGLE3_SGLANG_URL {url}: router worker {kimi.url} serves another model: "
        )
        # no worker listed: the router's own answer (it sends /get_model_info to its first worker)
        httpx.post(url + "/_router/workers", json={"urls": []}, timeout=5).raise_for_status()
        router_only = probe_fleet([url])
        assert served_model_problems(router_only, _expected("kimi-k2.5")) == []
        [own] = served_model_problems(router_only, _expected("qwen3"))
        assert own.startswith(f"EAGLE3_SGLANG_URL {url}: the router serves another model: "), own
    finally:
        router.kill()
        router.wait()
    assert kimi.requests() == qwen.requests() == 0


class _Silent(http.server.BaseHTTPRequestHandler):
    """A server that tells its capacity (/server_info) and nothing of the model it serves (404 on /model_info and
    /get_model_info); with `router` set, a router (/readiness JSON) listing one such worker."""

    router: str | None = None

    def do_GET(self) -> None:
        if self.path == "/readiness" and self.router is None:
            self._send(404, {"detail": "Not Found"})
        elif self.path == "/readiness":
            self._send(200, {"status": "ready"})
        elif self.path == "/server_info" and self.router is None:
            self._send(200, {"max_running_requests": 4})
        elif self.path == "/workers" and self.router is not None:
            self._send(200, {"workers": [{"url": self.router}]})
        else:
            self._send(404, {"detail": "Not Found"})

    def _send(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_server_that_does_not_say_what_it_serves_is_named_not_passed() -> None:
    # the run waits for such a server to say what it serves, then fails: check and plan say so before a run
    with _serving(_Silent) as worker:
        router_handler = type("_SilentRouter", (_Silent,), {"router": worker})
        with _serving(router_handler) as router:
            fleet = probe_fleet([worker, router], timeout_s=3.0)
    assert [(c.slots, c.models) for c in fleet] == [(4, ()), (4, ())]
    assert endpoint_problems(fleet) == []  # both answer as servers: only the model is unknown
    lines = served_model_problems(fleet, _expected("kimi-k2.5"))
    assert [ln.split(": ", 1)[0] for ln in lines] == [f"EAGLE3_SGLANG_URL {worker}", f"EAGLE3_SGLANG_URL {router}"]
    assert lines[0].split(": ", 1)[1].startswith("the endpoint answers /server_info but does not say which model")
    assert lines[1].split(": ", 1)[1].startswith("the router answers /server_info but does not say which model")
    assert all(ln.endswith("a run waits for it to say so, then fails") for ln in lines), lines
    assert served_model_problems(fleet, None) == []  # nothing expected: nothing judged
