"""The plan keys a probe prompt as the generate step does: with the fleet's drafter and the probe seed.

In process, on real parts: real source YAMLs (a training source and a `role: probe` source), the shared
Kimi tokenizer, a generations store in real Parquet whose probe samples were generated with drafter A,
and a fleet answering `/server_info` through httpx's MockTransport (the plan reads the drafter there, as the
generate step does). A drafter change regenerates exactly the probe prompts; the plan must count them.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import httpx
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_dagster import schemas
from eagle3_dagster.generate import fleet_capacity, read_generations
from eagle3_dagster.generate.config import GenerationConfig, sample_key, sampling_hash
from eagle3_dagster.generate.drafter import drafter_of
from eagle3_dagster.generate.probe_results import update_shard_results
from eagle3_dagster.generate.probes import fleet_drafter_key
from eagle3_dagster.ingest import load_source_specs
from eagle3_dagster.plan.build import Fleet, Plan, PlanDirs, PlanModel, build_plan
from eagle3_dagster.plan.counts import count_prompts, tokenize_for_plan
from eagle3_dagster.storage import data_root, shard_dir
from eagle3_dagster.tokenize import PromptRenderer

REV = "moonshotai/Kimi-K2.5@default"
N_SHARDS = 2
TRAIN = [f"Explain topic number {i} of the training set in two sentences." for i in range(6)]
PROBE = [f"Probe question {i}: what is {i} + {i * 7}? Show your reasoning." for i in range(3)]
SPEC_INFO = {
    "max_running_requests": 8,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}


REAL_CLIENT = httpx.Client


def _sources(root: Path) -> Path:
    root.mkdir(parents=True)
    for name, texts, extra in (("train", TRAIN, ""), ("probe_set", PROBE, "role: probe\n")):
        lines = [json.dumps({"messages": [{"role": "user", "content": t}]}) for t in texts]
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        (root / f"{name}.yaml").write_text(f"path: {name}.jsonl\nformat: openai\n{extra}")
    return root


def _server_info(draft_path: str) -> dict:
    return {**SPEC_INFO, "speculative_draft_model_path": draft_path}


def _fleet_serving(monkeypatch, info: dict | None) -> None:
    """The fleet's endpoint answers /server_info with `info` and /model_info as a Kimi-K2.5 server does (None:
    nothing answers)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if info is None:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/server_info":
            return httpx.Response(200, json=info)
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"model_path": "moonshotai/Kimi-K2.5", "model_type": "kimi_k25"})
        return httpx.Response(404)  # /readiness: a plain server, not a router

    monkeypatch.setattr(
        fleet_capacity.httpx, "Client", lambda **kw: REAL_CLIENT(transport=httpx.MockTransport(handler), **kw)
    )


def _config(kimi_profile, **over) -> GenerationConfig:
    return GenerationConfig.from_profile(
        kimi_profile, "http://fleet.test:30000", max_new_tokens=2048, model_revision=REV, **over
    )


def _store_night(data, rows: pl.DataFrame, config: GenerationConfig, drafter_key: str) -> None:
    """What a night on `drafter_key` stored: every prompt's sample, a probe prompt's keyed with the drafter."""
    now = dt.datetime.now(dt.UTC)
    s_hash = sampling_hash(config)
    for (shard,), part in rows.partition_by("shard", as_dict=True).items():
        out = Path(str(shard_dir(data, "generations", int(shard))))
        out.mkdir(parents=True, exist_ok=True)
        full = [
            {f.name: None for f in schemas.GENERATIONS}
            | {"output_ids": [1, 2, 3], "completion_tokens": 3, "generated_at": now, "e2e_latency": 0.5}
            | {
                "sample_id": sample_key(
                    r["prompt_id"],
                    REV,
                    r["template_hash"],
                    s_hash,
                    None,
                    drafter_key if r["source"] == "probe_set" else None,
                ),
                "prompt_id": r["prompt_id"],
                "source": r["source"],
                "model_revision": REV,
            }
            for r in part.iter_rows(named=True)
        ]
        pq.write_table(
            pa.Table.from_pylist(full, schema=schemas.GENERATIONS), out / "part-00000000000000000001-a.parquet"
        )


@pytest.fixture
def night_on_a(tmp_path, kimi_profile):
    """Real sources tokenized as the plan does, and a store holding a night generated on drafter A."""
    specs = load_source_specs(_sources(tmp_path / "sources"))
    _, prompts_path = count_prompts(specs, n_shards=N_SHARDS, scratch=tmp_path / "scratch")
    rows = tokenize_for_plan(prompts_path, PromptRenderer(kimi_profile), max_new_tokens=2048, control_text={})
    assert rows.frame.height == len(TRAIN) + len(PROBE)
    data = data_root(tmp_path / "data")
    key_a = fleet_drafter_key([drafter_of(_server_info("test/drafter-a"))])
    _store_night(data, rows.frame, _config(kimi_profile), key_a)
    return specs, rows.frame, data, key_a


def _plan(tmp_path, kimi_profile, specs, data, config: GenerationConfig, fleet: Fleet | None = None) -> Plan:
    return build_plan(
        specs,
        dirs=PlanDirs(data, tmp_path / "work"),
        model=PlanModel(kimi_profile, PromptRenderer(kimi_profile), config),
        n_shards=N_SHARDS,
        control_text={},
        fleet=fleet or Fleet(tokens_per_s_per_server=1000.0),  # servers counted: /server_info is read
    )


def test_a_new_drafter_plans_exactly_the_probe_prompts(tmp_path, kimi_profile, night_on_a, monkeypatch) -> None:
    specs, rows, data, key_a = night_on_a
    probe_tokens = int(rows.filter(pl.col("source") == "probe_set")["prompt_len"].sum())

    _fleet_serving(monkeypatch, _server_info("test/drafter-a"))  # the same drafter: everything is cached
    same = _plan(tmp_path, kimi_profile, specs, data, _config(kimi_profile))
    assert (same.requests, same.requests_cached, same.requests_to_send) == (9, 9, 0)

    _fleet_serving(monkeypatch, _server_info("test/drafter-b"))  # a new drafter: the probe prompts only
    new = _plan(tmp_path, kimi_profile, specs, data, _config(kimi_profile))
    assert (new.requests, new.requests_cached, new.requests_to_send) == (9, len(TRAIN), len(PROBE))
    assert new.prompt_tokens_to_send == probe_tokens
    key_b = fleet_drafter_key([drafter_of(_server_info("test/drafter-b"))])
    assert (same.drafter_key, new.drafter_key, new.probe_sources) == (key_a, key_b, ["probe_set"])
    assert new.drafter_basis == "served by the endpoints (/server_info)"

    # a bumped probe seed redraws the probe prompts on the same drafter; the training prompts stay cached
    _fleet_serving(monkeypatch, _server_info("test/drafter-a"))
    bumped = _plan(tmp_path, kimi_profile, specs, data, _config(kimi_profile, probe_seed=1))
    assert (bumped.requests_cached, bumped.requests_to_send) == (len(TRAIN), len(PROBE))


def test_without_a_drafter_the_probe_prompts_count_as_sent_and_the_plan_says_so(
    tmp_path, kimi_profile, night_on_a, monkeypatch
) -> None:
    specs, _, data, _ = night_on_a
    _fleet_serving(monkeypatch, None)  # no endpoint answers, no probe result is stored
    plan = _plan(tmp_path, kimi_profile, specs, data, _config(kimi_profile))
    assert (plan.requests_cached, plan.requests_to_send) == (len(TRAIN), len(PROBE))
    assert plan.drafter_key is None and plan.drafter_basis == "unknown"
    assert any(a.startswith("no drafter known") and "probe_set" in a for a in plan.assumptions), plan.assumptions


def test_not_asking_the_fleet_the_drafter_is_the_stored_probe_results_one(
    tmp_path, kimi_profile, night_on_a, monkeypatch
) -> None:
    specs, _, data, key_a = night_on_a
    _fleet_serving(monkeypatch, None)  # servers and throughput declared: the plan does not ask the fleet
    declared = Fleet(tokens_per_s_per_server=1000.0, servers=1)
    now = dt.datetime.now(dt.UTC)
    for shard in range(N_SHARDS):
        gens = read_generations(Path(str(shard_dir(data, "generations", shard))))
        update_shard_results(data, shard, gens.filter(pl.col("source") == "probe_set"), key_a, now)
    plan = _plan(tmp_path, kimi_profile, specs, data, _config(kimi_profile), declared)
    assert (plan.requests_cached, plan.requests_to_send) == (len(TRAIN) + len(PROBE), 0)
    assert plan.drafter_key == key_a and plan.drafter_basis.startswith("the newest stored probe results")
    assert any(a.startswith(f"the fleet's drafter is {key_a}") for a in plan.assumptions), plan.assumptions
