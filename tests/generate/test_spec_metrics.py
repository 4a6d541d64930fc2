"""The drafter's acceptance on every generated row: real simulator processes that speculate (sim/speculative.py)
or not, over HTTP, streamed and not, real Parquet (generate/drafter.py, rows.py)."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from gen_helpers import Sim, as_map, make_config, make_prompts

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.drafter import METRIC_KEYS, ROW_COLUMNS, drafter_of
from eagle3_dagster.quality import generation_features, run_gate

pytestmark = pytest.mark.integration

N = 8
SPEC_A = (
    "--speculative-draft-model-path",
    "test/kimi-eagle3-a",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
)


@pytest.fixture(scope="module")
def spec_sim(tmp_path_factory: pytest.TempPathFactory):
    s = Sim(extra_args=SPEC_A, log_path=tmp_path_factory.mktemp("spec-sim") / "sim.log")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(N, seed=404)


def _info(sim: Sim) -> dict:
    return httpx.get(sim.url + "/server_info", timeout=5).json()


def _check_rows_hold_the_answers_figures(rows: list[dict], drafter_id: str) -> None:
    for r in rows:
        meta = json.loads(r["meta_info"])
        for k in METRIC_KEYS:
            assert k in meta and r[k] == meta[k], (k, r[k], meta.get(k))  # exactly as received
        assert r["spec_accept_length"] == r["completion_tokens"] / r["spec_verify_ct"]
        assert sum(r["spec_correct_drafts_histogram"]) == r["spec_verify_ct"]
        assert r["spec_num_proposed_drafts"] == r["spec_verify_ct"] * 3
        assert r["drafter_id"] == drafter_id and r["spec_draft_model_path"] == "test/kimi-eagle3-a"
        assert (r["spec_algorithm"], r["spec_num_steps"], r["spec_eagle_topk"], r["spec_num_draft_tokens"]) == (
            "EAGLE3",
            3,
            1,
            4,
        )
        assert r["integrity_violations"] == []


@pytest.mark.parametrize("stream", [False, True])
def test_every_row_keeps_the_speculating_servers_figures_and_its_drafter(spec_sim: Sim, prompts, tmp_path, stream):
    spec_sim.faults(clear=True)
    d = drafter_of(_info(spec_sim))
    assert d is not None
    rep = generate_shard(prompts, tmp_path / "s", make_config(spec_sim.url, stream=stream, max_new_tokens=64))
    assert rep.succeeded == N
    df = read_generations(tmp_path / "s")
    assert set(ROW_COLUMNS) <= set(df.columns)
    _check_rows_hold_the_answers_figures(df.to_dicts(), d.drafter_id)


def test_streamed_and_plain_answers_store_the_same_figures(spec_sim: Sim, prompts, tmp_path):
    spec_sim.faults(clear=True)
    got = []
    for stream in (False, True):
        generate_shard(prompts, tmp_path / f"s{stream}", make_config(spec_sim.url, stream=stream, max_new_tokens=64))
        df = read_generations(tmp_path / f"s{stream}").sort("sample_id")
        got.append(df.select("sample_id", *METRIC_KEYS).to_dicts())
    assert got[0] == got[1]


def test_a_server_that_does_not_speculate_leaves_the_columns_null(clean_sim: Sim, prompts, tmp_path):
    rep = generate_shard(prompts, tmp_path / "s", make_config(clean_sim.url, max_new_tokens=32))
    assert rep.succeeded == N
    df = read_generations(tmp_path / "s")
    for c in ROW_COLUMNS:
        assert df[c].null_count() == N, c
    assert all(v == [] for v in df["integrity_violations"].to_list())


def test_a_fleet_with_two_drafters_is_named_and_each_row_carries_its_own(
    spec_sim: Sim, start_sim, prompts, tmp_path, caplog
):
    spec_sim.faults(clear=True)
    other = start_sim("--speculative-draft-model-path", "test/kimi-eagle3-b", "--speculative-num-draft-tokens", "6")
    by_url = {s.url: drafter_of(_info(s)) for s in (spec_sim, other)}
    caplog.set_level(logging.WARNING, logger="eagle3_dagster.generate")
    rep = generate_shard(
        make_prompts(24, seed=405), tmp_path / "s", make_config(spec_sim.url, other.url, max_new_tokens=48)
    )
    assert rep.succeeded == 24
    warned = [r.getMessage() for r in caplog.records if "different drafters" in r.getMessage()]
    assert len(warned) == 1
    for url, d in by_url.items():
        assert d is not None and url in warned[0] and d.drafter_id in warned[0]
    df = read_generations(tmp_path / "s")
    assert set(df["endpoint"]) == set(by_url)  # both served
    for r in df.to_dicts():
        d = by_url[r["endpoint"]]
        assert d is not None and r["drafter_id"] == d.drafter_id
        assert r["spec_num_draft_tokens"] == d.num_draft_tokens
        assert r["spec_num_proposed_drafts"] == r["spec_verify_ct"] * (d.num_draft_tokens - 1)  # type: ignore[operator]
        assert r["integrity_violations"] == []


@pytest.mark.parametrize(
    ("kind", "flag"),
    [
        ("accept_length", "accept_length"),
        ("partial", "partial"),
        ("histogram", "histogram_total"),
        ("negative", "negative"),
        ("steps_beyond_tokens", "length_below_1"),
        ("histogram_length", "histogram_length"),
        ("huge_count", "exceeds_int64_spec_verify_ct"),
    ],
)
def test_figures_that_do_not_add_up_flag_the_row_and_keep_its_ids(
    spec_sim: Sim, prompts, tmp_path, kind, flag, kimi_profile
):
    spec_sim.faults(clear=True)
    cfg = make_config(spec_sim.url, max_new_tokens=64, max_in_flight=1)
    generate_shard(prompts, tmp_path / "ref", cfg)
    reference = as_map(read_generations(tmp_path / "ref"))
    spec_sim.faults(spec_inconsistent=3, spec_inconsistent_kind=kind)
    rep = generate_shard(prompts, tmp_path / "s", cfg)  # never crashes (2**70 fits no int64 column)
    assert rep.succeeded == N and rep.integrity_violations == 3
    assert rep.requests_sent == N  # and never sends again
    df = read_generations(tmp_path / "s")
    flagged = [r for r in df.to_dicts() if r["integrity_violations"]]
    assert len(flagged) == 3
    assert all(f"spec_metrics_inconsistent:{flag}" in r["integrity_violations"] for r in flagged)
    if kind == "huge_count":
        assert all(r["spec_verify_ct"] is None for r in flagged)  # a value its column cannot hold: null
    assert as_map(df) == reference  # the ids are kept as received
    res = run_gate(
        "generations",
        generation_features(df, prompts, kimi_profile),
        profile=kimi_profile,
        expectations_dir=PROJECT_ROOT / "expectations",
        context_dir=tmp_path / "gx",
    )
    outcome = next(o for o in res.outcomes if o.key == "spec_metrics_consistent")
    assert (outcome.severity, outcome.unexpected_count, outcome.evaluated) == ("warning", 3, N)
    name_to_key = {o.name: o.key for o in res.outcomes}
    reasons = {r["row_id"]: {name_to_key[n] for n in r["reasons"]} for r in res.row_failures.iter_rows(named=True)}
    assert not any("spec_metrics_consistent" in keys for keys in reasons.values())  # counted, never quarantines


def test_every_turn_of_a_multi_turn_conversation_keeps_its_figures(spec_sim: Sim, tmp_path, datasets_dir, kimi_profile):
    from multiturn_worker import run
    from test_multiturn_resume import _inputs

    from eagle3_dagster.generate.multiturn import read_turn_rows

    spec_sim.faults(clear=True)
    d = drafter_of(_info(spec_sim))
    assert d is not None
    data = tmp_path / "mt"
    _inputs(data, datasets_dir, kimi_profile)
    run(data, spec_sim.url, 2)
    turns = read_turn_rows(data / "generations")
    assert turns.height > 0 and turns["turn_index"].max() > 1  # type: ignore[operator]
    _check_rows_hold_the_answers_figures(turns.to_dicts(), d.drafter_id)


@pytest.mark.parametrize("same", [True, False], ids=["one-drafter", "two-drafters"])
def test_behind_the_real_router_rows_carry_the_workers_drafter_only_when_they_agree(
    start_sim, prompts, tmp_path, caplog, same
):
    import importlib.util

    if importlib.util.find_spec("sglang_router") is None:
        pytest.skip("sglang_router is not installed (pip install -e '.[router]')")
    from real_router import start_real_router

    b = SPEC_A if same else ("--speculative-draft-model-path", "test/kimi-eagle3-b")
    sims = [start_sim(*SPEC_A), start_sim(*b)]
    p, url = start_real_router([s.url for s in sims], tmp_path / "router.log")
    try:
        caplog.set_level(logging.WARNING, logger="eagle3_dagster.generate")
        rep = generate_shard(prompts, tmp_path / "s", make_config(url, max_new_tokens=48))
    finally:
        p.terminate()
        p.wait(10)
    assert rep.succeeded == N
    df = read_generations(tmp_path / "s")
    assert df["spec_verify_ct"].null_count() == 0  # the figures pass through the router
    # sglang-router 0.3.2 does not say which worker served an answer: no worker; their common release
    assert df["worker"].null_count() == N and set(df["sglang_version"]) == {"0.5.23"}
    if same:
        d = drafter_of(_info(sims[0]))
        assert d is not None and set(df["drafter_id"]) == {d.drafter_id}
        assert all(v == [] for v in df["integrity_violations"].to_list())
    else:
        # an answer does not say which worker served it: no drafter on the rows, and a warning naming both
        [line] = [r.getMessage() for r in caplog.records if "workers run different drafters" in r.getMessage()]
        assert all(s.url in line for s in sims) and "test/kimi-eagle3-b" in line
        assert df["drafter_id"].null_count() == N
        assert all("spec_metrics_inconsistent:no_drafter" in v for v in df["integrity_violations"].to_list())
