"""smg, the Shepherd Model Gateway (PyPI `smg`, the sglang-router's successor), in front of two simulator
workers that run different drafters and different SGLang releases (docs/smg.md).

What the client relies on, checked here against the real gateway: every answer names the worker that served
it (`x-smg-routed-worker-id`, after smg's own retries); `/server_info` and `/model_info` are 404 there while
`/get_server_info` and `/get_model_info` answer; a 503 from a worker is retried by smg on another worker; a
worker that swaps its drafter mid-run (fleet fault drafter_after) stops the run, naming it and both drafters,
and a worker the client cannot read any more is not taken for one that swapped.
One module, two workers and one gateway for all of it (round_robin: every worker serves, a retry moves); the
test that stops its gateway mid-run starts its own in front of the same workers. A test that swaps a worker's
drafter restores it (fault clear) before the next test.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gen_helpers import Sim, as_map, make_config, make_prompts
from real_router import smg_command, start_smg, stop

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import endpoints, fleet_capacity, generate_shard, read_generations
from eagle3_dagster.generate.drafter import METRIC_KEYS, DrafterIdentity, drafter_of
from eagle3_dagster.generate.endpoint_info import EndpointRefusedError, ServingChangedError
from eagle3_dagster.generate.fleet_capacity import probe_fleet, served_model_problems
from eagle3_dagster.generate.probes import fleet_drafter_key
from eagle3_dagster.generate.served_model import ExpectedModel
from eagle3_dagster.profiles import load_profile

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(smg_command() is None, reason="smg is not installed (pip install -e '.[router]')"),
]

N = 16
# worker A: an EAGLE-3 drafter on SGLang 0.5.11 (the names of that release); B: another drafter on 0.5.23
WORKERS = {
    "a": ("--speculative-draft-model-path", "test/kimi-eagle3-a", "--spec-names", "0.5.11"),
    "b": ("--speculative-draft-model-path", "test/kimi-eagle3-b", "--speculative-num-draft-tokens", "6"),
}
SWAPPED_IN = "test/kimi-eagle3-c"  # the drafter a worker switches to mid-run (fault drafter_after)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Sim]]]:
    logs = tmp_path_factory.mktemp("smg")
    sims = {k: Sim(extra_args=a, log_path=logs / f"worker-{k}.log") for k, a in WORKERS.items()}
    p, url = start_smg([s.url for s in sims.values()], logs / "smg.log", "--policy", "round_robin")
    yield url, sims
    stop(p)
    for s in sims.values():
        s.kill()


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(N, seed=470)


@pytest.fixture(scope="module")
def direct(fleet, prompts, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    """Each worker's own rows (no gateway), by worker URL then sample_id."""
    _, sims = fleet
    out: dict[str, dict[str, dict]] = {}
    for k, s in sims.items():
        d = tmp_path_factory.mktemp(f"direct-{k}")
        assert generate_shard(prompts, d, make_config(s.url, max_new_tokens=40)).succeeded == N
        out[s.url] = {r["sample_id"]: r for r in read_generations(d).to_dicts()}
    return out


def _clear(sims: dict[str, Sim]) -> None:
    for s in sims.values():
        s.faults(clear=True)


def test_smg_names_the_serving_worker_and_answers_only_the_get_info_paths(fleet):
    url, sims = fleet
    _clear(sims)
    assert httpx.get(url + "/server_info", timeout=5).status_code == 404
    assert httpx.get(url + "/model_info", timeout=5).status_code == 404
    assert httpx.get(url + "/get_server_info", timeout=5).json()["version"] in ("0.5.11", "0.5.23")
    assert "model_path" in httpx.get(url + "/get_model_info", timeout=5).json()
    body = {"input_ids": [1000, 1001, 1002], "sampling_params": {"max_new_tokens": 4}, "rid": "smg-probe"}
    answers = [httpx.post(url + "/generate", json={**body, "rid": f"p{i}"}, timeout=30) for i in range(4)]
    assert {r.headers["x-smg-routed-worker-id"] for r in answers} == {s.url for s in sims.values()}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_rows_through_smg_equal_a_direct_run_and_keep_the_gateway_the_worker_its_drafter_and_release(
    fleet, prompts, direct, tmp_path: Path, stream: bool
):
    url, sims = fleet
    _clear(sims)
    rep = generate_shard(prompts, tmp_path / "via", make_config(url, max_new_tokens=40, stream=stream))
    assert (rep.succeeded, rep.failed, rep.integrity_violations) == (N, 0, 0) and rep.reconciles, rep
    df = read_generations(tmp_path / "via")
    some_direct = next(iter(direct.values()))
    assert as_map(df) == {k: r["output_ids"] for k, r in some_direct.items()}
    rows = df.to_dicts()
    assert {r["worker"] for r in rows} == set(direct)  # both workers served
    info = {s.url: httpx.get(s.url + "/server_info", timeout=5).json() for s in sims.values()}
    for r in rows:
        assert r["endpoint"] == url and r["integrity_violations"] == []
        d = drafter_of(info[r["worker"]])
        assert d is not None and r["drafter_id"] == d.drafter_id
        assert r["sglang_version"] == info[r["worker"]]["version"]
        # the figures of the worker that served it, read from its release's names: what it gives directly
        assert {c: r[c] for c in METRIC_KEYS} == {c: direct[r["worker"]][r["sample_id"]][c] for c in METRIC_KEYS}
    assert rep.server_versions == {url: rep.server_versions[url]} | {
        f"{s.url} via {url}": info[s.url]["version"] for s in sims.values()
    }
    # a probe prompt's key holds both workers' drafters, and `eagle3 plan` (probe_fleet) makes the same key
    ids = {d.drafter_id for d in (drafter_of(i) for i in info.values()) if d is not None}
    assert set(rep.drafter_key.split("+")) == ids
    assert fleet_drafter_key(d for c in probe_fleet([url]) for d in c.drafters) == rep.drafter_key


def test_check_and_plan_judge_each_workers_model_behind_smg_and_the_gateways_when_none_is_reachable(fleet, monkeypatch):
    """`eagle3 check` / `eagle3 plan` (fleet_capacity.probe_fleet): a worker of another model is named by its
    URL; with no worker reachable from here, smg's /get_model_info is judged (its /model_info is 404)."""
    url, sims = fleet
    _clear(sims)
    kimi = ExpectedModel.of(load_profile("kimi-k2.5", PROJECT_ROOT / "assets" / "models"))
    sims["b"].faults(claimed_model={"model_path": "Qwen/Qwen3-8B", "model_type": "qwen3"})
    try:
        [line] = served_model_problems(probe_fleet([url]), kimi)
    finally:
        _clear(sims)
    assert line.startswith(f"EAGLE3_SGLANG_URL {url}: router worker {sims['b'].url} serves another model: "), line
    assert "'Qwen/Qwen3-8B'" in line and "'kimi_k25'" in line

    workers = {s.url for s in sims.values()}
    read = fleet_capacity._get_json
    monkeypatch.setattr(
        fleet_capacity,
        "_get_json",
        lambda client, u, path: (None, "unreachable") if u.rstrip("/") in workers else read(client, u, path),
    )
    [cap] = probe_fleet([url])
    assert [(a.who, a.served.model_type) for a in cap.models] == [("the router", "kimi_k25")]
    assert served_model_problems([cap], kimi) == []
    qwen = ExpectedModel.of(load_profile("qwen3", PROJECT_ROOT / "assets" / "models"))
    [own] = served_model_problems([cap], qwen)
    assert own.startswith(f"EAGLE3_SGLANG_URL {url}: the router serves another model: model_path "), own


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_request_retried_on_another_worker_is_one_row_of_the_worker_that_answered(
    fleet, prompts, direct, tmp_path: Path, stream: bool
):
    """Without streaming the busy worker's 503 is an HTTP 503, which smg retries on the other worker itself;
    in a stream SGLang sends it as a 200 stream whose abort chunk carries 503 (spec §3.5), which smg passes
    on and the client retries (a new rid). Either way: one row, of the worker that answered."""
    url, sims = fleet
    _clear(sims)
    busy, other = sims["a"], sims["b"]
    refusals_before = busy.stats()["faults_injected"].get("queue_full", 0)
    busy.faults(queue_full_burst=5)  # its next 5 /generate answers: "The request queue is full." (503)
    # one request at a time: round robin sends every first attempt of the burst to the busy worker
    cfg = make_config(url, max_new_tokens=40, max_in_flight=1, stream=stream)
    rep = generate_shard(prompts, tmp_path / "via", cfg)
    assert (rep.succeeded, rep.failed, rep.integrity_violations) == (N, 0, 0) and rep.reconciles, rep
    assert busy.stats()["faults_injected"]["queue_full"] - refusals_before == 5  # the busy worker refused 5 times
    # smg retried them itself (the client saw answers only), or the client did, on the streams' abort chunks
    assert rep.retried_by_kind == ({"http_503": 5} if stream else {}), rep.retried_by_kind
    df = read_generations(tmp_path / "via")
    assert df.height == N and df["sample_id"].n_unique() == N
    seen = {s.url: s.stats(rids=True)["rid_counts"] for s in sims.values()}
    rows = df.to_dicts()
    assert all(r["rid"] in seen[r["worker"]] for r in rows)  # the worker a row names really answered it
    refused = [r for r in rows if r["rid"].rsplit("-", 1)[0] + "-0" in seen[busy.url] and r["worker"] == other.url]
    if not stream:
        refused = [r for r in refused if r["rid"] in seen[busy.url]]  # smg resent the same request (same rid)
    assert len(refused) == 5, [(r["rid"], r["worker"]) for r in rows]
    b = drafter_of(httpx.get(other.url + "/server_info", timeout=5).json())
    for r in refused:  # attributed to the worker that answered: its drafter, its release, its figures
        assert b is not None and r["drafter_id"] == b.drafter_id and r["sglang_version"] == "0.5.23"
        assert {c: r[c] for c in METRIC_KEYS} == {c: direct[other.url][r["sample_id"]][c] for c in METRIC_KEYS}


def test_workers_the_client_cannot_reach_are_named_and_their_rows_keep_worker_and_release_only(
    fleet, prompts, tmp_path: Path, monkeypatch, caplog
):
    """Workers on a network only the gateway reaches: their /server_info cannot be read, so no drafter is
    claimed for their rows (flagged no_drafter: figures nobody can attribute); the worker smg names and the
    release its /workers label says are kept, and each such worker is named once."""
    url, sims = fleet
    _clear(sims)
    workers = {s.url for s in sims.values()}
    read = endpoints.EndpointPool._get_json

    async def only_the_gateway(self, ep, path):
        return None if ep.url in workers else await read(self, ep, path)

    monkeypatch.setattr(endpoints.EndpointPool, "_get_json", only_the_gateway)
    caplog.set_level(logging.WARNING, logger="eagle3_dagster.generate")
    rep = generate_shard(prompts, tmp_path / "via", make_config(url, max_new_tokens=40, max_in_flight=4))
    assert (rep.succeeded, rep.failed) == (N, 0), rep
    df = read_generations(tmp_path / "via")
    versions = {sims["a"].url: "0.5.11", sims["b"].url: "0.5.23"}
    assert set(df["worker"]) == workers and df["drafter_id"].null_count() == N
    assert all(r["sglang_version"] == versions[r["worker"]] for r in df.to_dicts())
    assert all("spec_metrics_inconsistent:no_drafter" in v for v in df["integrity_violations"].to_list())
    named = [r.getMessage() for r in caplog.records if "whose /server_info the client did not read" in r.getMessage()]
    assert sorted(m.split("came from worker ")[1].split(",")[0] for m in named) == sorted(workers), named


def _drafter_now(s: Sim) -> DrafterIdentity:
    d = drafter_of(httpx.get(s.url + "/server_info", timeout=5).json())
    assert d is not None
    return d


def _rids(s: Sim) -> list[str]:
    """The rids `s` received, in the order they came."""
    return list(s.stats(rids=True)["rid_counts"])


@pytest.mark.parametrize("gateway_info", ["its own", "empty"])
def test_a_drafter_swapped_on_one_worker_behind_smg_stops_the_run_naming_that_worker_and_both_drafters(
    fleet, tmp_path: Path, monkeypatch, gateway_info: str
):
    """The workers run different drafters, so the gateway as a whole runs none: only a per-worker reading sees
    worker a swap its drafter mid-run (before: unseen, the run said SUCCESS and a's later rows named its old
    drafter). The run stops at the next chunk write, naming a and both drafters; every stored row names the
    drafter that served it, and the rerun generates the rest under a's new drafter. The same when the
    gateway's own server info is an empty object (its workers are still read one by one; before, such a
    gateway was never read again)."""
    url, sims = fleet
    _clear(sims)
    if gateway_info == "empty":
        read = endpoints.EndpointPool._get_json

        async def gateway_says_nothing(self, ep, path):
            if ep.url == url and path in ("/server_info", "/get_server_info"):
                return {}
            return await read(self, ep, path)

        monkeypatch.setattr(endpoints.EndpointPool, "_get_json", gateway_says_nothing)
    a, b = sims["a"], sims["b"]
    old, b_drafter = _drafter_now(a), _drafter_now(b)
    earlier = set(_rids(a))
    prompts = make_prompts(N, seed=471)
    # one request at a time, a chunk every 2 rows; a's first 2 requests run under its drafter, from its 3rd on
    # under SWAPPED_IN
    cfg = make_config(url, max_new_tokens=40, max_in_flight=1, flush_every_n=2)
    try:
        a.faults(drafter_after=2, next_draft_model_path=SWAPPED_IN)
        with pytest.raises(ServingChangedError) as ei:
            generate_shard(prompts, tmp_path / "via", cfg)
        new = _drafter_now(a)
        under_old = [r for r in _rids(a) if r not in earlier][:2]
        rows = read_generations(tmp_path / "via").to_dicts()
        rerun = generate_shard(prompts, tmp_path / "via", cfg)  # a runs SWAPPED_IN from now on
        after = read_generations(tmp_path / "via").to_dicts()
    finally:
        _clear(sims)  # a runs its command line's drafter again
    assert new.draft_model_path == SWAPPED_IN and new != old
    said = f"endpoint {url}: its worker {a.url}'s drafter changed under the running shard"
    assert f"{said}: {old.describe()} -> {new.describe()}" in str(ei.value), ei.value
    assert rows and {r["worker"] for r in rows} <= {a.url, b.url}
    for r in rows:  # a's rows only from the requests it answered under its old drafter; none names NEW
        assert r["drafter_id"] == (old if r["worker"] == a.url else b_drafter).drafter_id
        assert r["worker"] == b.url or r["rid"] in under_old
    assert rerun.skipped_cached == len(rows) and (rerun.succeeded, rerun.failed) == (N - len(rows), 0)
    stored_first = {r["rid"] for r in rows}
    served_by = {a.url: new, b.url: b_drafter}
    assert {r["drafter_id"] for r in after if r["rid"] not in stored_first and r["worker"] == a.url} == {new.drafter_id}
    assert all(r["drafter_id"] == served_by[r["worker"]].drafter_id for r in after if r["rid"] not in stored_first)


def test_a_worker_gone_out_of_the_clients_reach_is_not_called_changed(fleet, prompts, tmp_path: Path, monkeypatch):
    """smg still routes to a worker the client can no longer read (its network to the client cut; a worker that
    died and smg routes around is read the same way): what the gateway's own /get_server_info says (another
    worker's drafter) is not that worker's, so it is not judged from it (before: the run stopped, calling the
    other worker's drafter that worker's new one). The run goes on; each row names its worker's drafter."""
    url, sims = fleet
    _clear(sims)
    gateway_says = drafter_of(httpx.get(url + "/get_server_info", timeout=5).json())
    drafters = {s.url: _drafter_now(s) for s in sims.values()}
    cut = next(w for w, d in drafters.items() if d != gateway_says)  # the worker smg does not ask
    read, confirm = endpoints.EndpointPool._get_json, endpoints.EndpointPool.confirm_serving
    out_of_reach = {"from now": False}

    async def partitioned(self, ep, path):
        return None if out_of_reach["from now"] and ep.url == cut else await read(self, ep, path)

    async def cut_off_then_confirm(self, names):  # the worker goes out of reach after the start, mid-run
        out_of_reach["from now"] = True
        return await confirm(self, names)

    monkeypatch.setattr(endpoints.EndpointPool, "_get_json", partitioned)
    monkeypatch.setattr(endpoints.EndpointPool, "confirm_serving", cut_off_then_confirm)
    rep = generate_shard(prompts, tmp_path / "via", make_config(url, max_new_tokens=40, flush_every_n=4))
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.reconciles, rep
    rows = read_generations(tmp_path / "via").to_dicts()
    assert {r["worker"] for r in rows} == set(drafters)
    assert all(r["drafter_id"] == drafters[r["worker"]].drafter_id for r in rows)


def test_smg_back_with_a_worker_on_another_drafter_stops_the_run(fleet, tmp_path: Path, caplog):
    """The gateway goes away mid-run and, while it is away, worker a swaps its drafter. When the gateway answers
    again the client reads its workers again before routing to it (check_health): the run stops naming a and
    both drafters (before: the combined drafter, none for these workers, did not change: the run went on), and
    not one request reaches either worker once the gateway is back."""
    _, sims = fleet
    _clear(sims)
    a, b = sims["a"], sims["b"]
    old = _drafter_now(a)
    for s in sims.values():
        s.faults(slow_tokens_ms=5)  # about 0.2 s an answer: the run is still going when the gateway goes
    p, url = start_smg([a.url, b.url], tmp_path / "smg.log", "--policy", "round_robin")
    port = int(url.rsplit(":", 1)[1])
    earlier = set(_rids(a))
    # a chunk every 2 rows, none on a timer: no chunk is written (and confirmed) while the gateway is away
    cfg = make_config(
        url, max_new_tokens=40, max_in_flight=1, flush_every_n=2, flush_every_s=60.0, wait_for_endpoint_s=20.0
    )
    caplog.set_level(logging.INFO, logger="eagle3_dagster.generate.endpoints")
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["report"] = generate_shard(make_prompts(N, seed=472), tmp_path / "via", cfg)
        except Exception as e:  # the test asserts which one
            box["error"] = e

    t = threading.Thread(target=run)
    try:
        t.start()
        _wait_for(lambda: len(set(_rids(a)) - earlier) >= 2, "worker a answered twice")
        stop(p)  # the gateway goes away mid-run
        _wait_for(lambda: any(f"{url} is now not routable" in r.getMessage() for r in caplog.records), "noticed")
        a.faults(drafter_after=0, next_draft_model_path=SWAPPED_IN)  # a's next request runs under the new one
        httpx.post(
            a.url + "/generate",
            json={"input_ids": [1000, 1001], "sampling_params": {"max_new_tokens": 1}, "rid": "swap"},
            timeout=30,
        ).raise_for_status()
        new = _drafter_now(a)
        before_back = {s.url: s.requests() for s in sims.values()}
        p, _ = start_smg([a.url, b.url], tmp_path / "smg.log", "--policy", "round_robin", port=port)
        t.join(60)
        assert not t.is_alive()
        after = {s.url: s.requests() for s in sims.values()}
    finally:
        stop(p)
        t.join(60)
        _clear(sims)
    assert new.draft_model_path == SWAPPED_IN
    err = box.get("error")  # the gateway is refused for the run (the only endpoint: the step fails)
    assert isinstance(err, ServingChangedError | EndpointRefusedError), box
    said = f"its worker {a.url}'s drafter changed under the running shard: {old.describe()} -> {new.describe()}"
    assert said in str(err), err
    assert after == before_back  # the change was seen before the gateway took work again: nothing was sent
    rows = read_generations(tmp_path / "via").to_dicts()  # the chunks written before the gateway went away
    served_by = {a.url: old, b.url: _drafter_now(b)}
    assert rows and all(r["drafter_id"] == served_by[r["worker"]].drafter_id for r in rows)


def _wait_for(ready: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.02)
