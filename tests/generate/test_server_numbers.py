"""Numbers a server sends that no column can hold, or that no request can have: an e2e_latency that is NaN,
negative, longer than the request or no float64 at all, an abort's status_code or a stream error's code that is
no HTTP status (2**40: no int32 holds it), and a secret a gateway echoes into meta_info. None crashes the step
(a crashed chunk or errors.parquet write fails the step, and Dagster's step retry sends every request again):
each sample is sent once, its row flagged or its failure recorded with the value named, and a secret never
reaches the stored meta_info. Real simulator over HTTP (fleet faults bad_latency, abort_status,
error_body_code, meta_secret), real Parquet.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest
from gen_helpers import Sim, make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generation_errors, read_generations
from eagle3_dagster.sim.fleet_faults import LEAKED_TOKEN

pytestmark = pytest.mark.integration

N = 6


@pytest.fixture(scope="module")
def prompts() -> pl.DataFrame:
    return make_prompts(N, seed=733)


def _run(sim: Sim, prompts: pl.DataFrame, out: Path, *, stream: bool, **cfg):
    sent = sim.requests()
    rep = generate_shard(prompts, out, make_config(sim.url, stream=stream, **cfg))
    assert rep.reconciles and rep.requested == N
    return rep, sim.requests() - sent


@pytest.mark.parametrize(
    ("kind", "stream"), [("nan", False), ("negative", False), ("huge", False), ("huge", True), ("long", True)]
)
def test_an_impossible_e2e_latency_is_flagged_and_never_stored_as_a_latency(clean_sim, prompts, tmp_path, kind, stream):
    before = clean_sim.stats()["faults_injected"].get("bad_latency", 0)
    clean_sim.faults(bad_latency=2, bad_latency_kind=kind)
    out = tmp_path / "s"
    rep, sent = _run(clean_sim, prompts, out, stream=stream)
    assert clean_sim.stats()["faults_injected"]["bad_latency"] - before == 2
    assert sent == N and (rep.succeeded, rep.failed) == (N, 0)  # stored once each: no crashed step sent again
    rows = read_generations(out)
    flag = {"huge": "not_a_float64", "long": "longer_than_the_request"}.get(kind, kind)
    flagged = rows.filter(pl.col("integrity_violations").list.contains(f"e2e_latency_invalid:{flag}"))
    assert flagged.height == 2 == rep.integrity_violations
    assert flagged["e2e_latency"].null_count() == 2  # a lie is no latency (a NaN broke plan's actual times)
    others = rows.filter(~pl.col("sample_id").is_in(flagged["sample_id"].implode()))
    assert others["e2e_latency"].null_count() == 0 and (others["e2e_latency"] >= 0).all()
    for meta in flagged["meta_info"]:
        said = json.loads(meta)["e2e_latency"]  # meta_info keeps what the server sent
        assert math.isnan(said) if kind == "nan" else said == {"negative": -2.5, "huge": 10**400, "long": 1e6}[kind]


@pytest.mark.parametrize("stream", [False, True])
def test_an_abort_status_that_is_no_http_status_fails_its_request_not_the_step(clean_sim, prompts, tmp_path, stream):
    clean_sim.faults(abort_status=2, abort_status_code=2**40)
    out = tmp_path / "s"
    rep, sent = _run(clean_sim, prompts, out, stream=stream, max_retries=0)
    assert sent == N and (rep.succeeded, rep.failed) == (N - 2, 2)
    assert rep.errors_by_kind == {"aborted": 2}
    errors = read_generation_errors(out)
    assert errors["status"].null_count() == 2  # not 2**40 in an int32 column (the errors.parquet write crashed)
    for detail in errors["detail"]:
        assert "status_code 1099511627776 is no HTTP status" in detail
    rep2, _ = _run(clean_sim, prompts, out, stream=stream)  # not permanent: the next run sends them again
    assert (rep2.skipped_cached, rep2.succeeded, rep2.failed) == (N - 2, 2, 0)


def test_a_stream_error_code_that_is_no_http_status_is_a_server_error_body(clean_sim, prompts, tmp_path):
    clean_sim.faults(error_body=1, error_body_code=2**40)
    out = tmp_path / "s"
    rep, sent = _run(clean_sim, prompts, out, stream=True)
    assert sent == N and rep.errors_by_kind == {"server_error_body": 1}  # never "http_1099511627776"
    [row] = read_generation_errors(out).iter_rows(named=True)
    assert row["status"] == 200 and "its code 1099511627776 is no HTTP status" in row["detail"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_bearer_token_a_gateway_echoes_into_meta_info_is_redacted_when_stored(clean_sim, prompts, tmp_path, stream):
    clean_sim.faults(meta_secret=2)
    out = tmp_path / "s"
    rep, _ = _run(clean_sim, prompts, out, stream=stream)
    assert rep.succeeded == N
    rows = read_generations(out)
    metas = [json.loads(m) for m in rows["meta_info"]]
    echoed = [m for m in metas if "x_gateway_authorization" in m]
    assert len(echoed) == 2 and {m["x_gateway_authorization"] for m in echoed} == {"[redacted]"}
    assert all(m["prompt_tokens"] > 0 and m["completion_tokens"] > 0 for m in metas)  # the rest as received
    token = LEAKED_TOKEN.split()[1]
    stored = "".join(p.read_bytes().decode("latin-1") for p in out.glob("*.parquet"))
    assert token not in stored and token not in json.dumps(rep.as_metadata(), default=str)
