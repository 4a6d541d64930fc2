"""generate_shard against the real simulator process: exact ids, counts, resume by cache key, 400s, integrity."""

from __future__ import annotations

from pathlib import Path

import httpx
import polars as pl
import pyarrow.parquet as pq
import pytest
from gen_helpers import KIMI_EOS, Sim, make_config, make_prompts

from eagle3_dagster import schemas
from eagle3_dagster.config import Settings
from eagle3_dagster.generate import (
    GenerationConfig,
    generate_shard,
    read_generation_errors,
    read_generations,
    sample_key,
    sampling_hash,
    sampling_params,
)
from eagle3_dagster.generate.report import progress_line

pytestmark = pytest.mark.integration


def test_sampling_params_are_explicit(kimi_profile):
    cfg = GenerationConfig.from_profile(kimi_profile, "http://a:1, http://b:2/")
    sp = sampling_params(cfg)
    assert cfg.endpoints == ("http://a:1", "http://b:2")
    assert sp["max_new_tokens"] == kimi_profile.sampling.max_new_tokens != 128
    assert sp["stop_token_ids"] == [163586]
    assert sp["skip_special_tokens"] is False and sp["spaces_between_special_tokens"] is False
    assert (sp["temperature"], sp["top_p"], sp["top_k"], sp["min_p"]) == (1.0, 0.95, -1, 0.0)
    # Anything that changes generation changes the hash, hence every sample id.
    assert sampling_hash(cfg) != sampling_hash(cfg.with_(temperature=0.7))
    assert sampling_hash(cfg) == sampling_hash(cfg.with_(max_in_flight=3, read_timeout_s=5))
    k = sample_key("p1", "rev", "t", sampling_hash(cfg), None)
    assert k != sample_key("p1", "rev", "t", sampling_hash(cfg), 1)
    assert k != sample_key("p1", "rev2", "t", sampling_hash(cfg), None)
    assert k != sample_key("p1", "rev", "t2", sampling_hash(cfg), None)
    with pytest.raises(TypeError):
        GenerationConfig.from_profile(kimi_profile, "http://a:1", max_new_token=5)


def test_clean_run_stores_exact_ids_and_rerun_sends_nothing(clean_sim, tmp_path: Path):
    sim = clean_sim
    start = sim.stats()["requests"]
    prompts = make_prompts(30)
    out = tmp_path / "generations" / "shard=0000"
    cfg = make_config(sim.url)
    seen: list = []
    rep = generate_shard(prompts, out, cfg, progress=seen.append, progress_every_s=0.05)

    assert (rep.requested, rep.succeeded, rep.failed, rep.skipped_cached) == (30, 30, 0, 0)
    assert rep.reconciles and rep.integrity_violations == 0
    assert rep.model_revision == "moonshotai/Kimi-K2.5@default"
    assert sim.stats()["requests"] - start == 30

    df = read_generations(out)
    assert df.height == 30 and df.get_column("sample_id").n_unique() == 30
    assert set(df.get_column("prompt_id")) == set(prompts.get_column("prompt_id"))
    # The stored files follow the table contract.
    for f in out.glob("part-*.parquet"):
        assert pq.read_schema(f).equals(schemas.GENERATIONS, check_metadata=False)
    assert read_generation_errors(out).height == 0
    assert pq.read_schema(out / "errors.parquet").equals(schemas.GENERATION_ERRORS, check_metadata=False)

    # Token ids are stored exactly as the server returns them for the same request.
    row = df.filter(pl.col("prompt_id") == "p7-000003").row(0, named=True)
    ids = prompts.filter(pl.col("prompt_id") == "p7-000003").get_column("input_ids").to_list()[0]
    direct = httpx.post(sim.url + "/generate", json={"input_ids": ids, "sampling_params": sampling_params(cfg)}).json()
    assert row["output_ids"] == direct["output_ids"]
    assert row["sample_id"] == sample_key("p7-000003", rep.model_revision, "tmpl-a", sampling_hash(cfg), None)
    # max_new_tokens is what we asked for (not the server default of 128), stops end with the stop id.
    for r in df.iter_rows(named=True):
        assert r["completion_tokens"] == len(r["output_ids"]) <= 24
        if r["finish_reason"] == "length":
            assert len(r["output_ids"]) == 24
        else:
            assert r["finish_reason"] == "stop" and r["output_ids"][-1] == KIMI_EOS
    assert sum(rep.finish_reasons.values()) == 30

    # Progress was reported, and the final report says done == total.
    assert seen and seen[-1].done == seen[-1].total == 30 and seen[-1].eta_s == 0.0

    # Nothing changed: the rerun sends zero /generate requests and stores nothing new.
    before = sim.stats()["requests"]
    seen2: list = []
    rep2 = generate_shard(prompts, out, cfg, progress=seen2.append)
    assert sim.stats()["requests"] == before
    assert progress_line(out.name, seen2[-1]) == "generations shard 0000: all 30 cached, nothing to generate"
    assert (rep2.requested, rep2.skipped_cached, rep2.succeeded, rep2.failed) == (30, 30, 0, 0)
    assert read_generations(out).height == 30
    assert len(list(out.glob("part-*.parquet"))) == rep.chunks_written


def test_changed_sampling_or_seed_regenerates_only_new_keys(clean_sim, tmp_path: Path):
    sim = clean_sim
    prompts = make_prompts(6)
    out = tmp_path / "shard=0001"
    cfg = make_config(sim.url)
    generate_shard(prompts, out, cfg)
    rep = generate_shard(prompts, out, cfg.with_(regen_seed=1))
    assert (rep.skipped_cached, rep.succeeded) == (0, 6)
    # New prompts are added incrementally; the old ones stay cached.
    more = pl.concat([prompts, make_prompts(3, seed=8)])
    before = sim.stats()["requests"]
    rep = generate_shard(more, out, cfg)
    assert (rep.requested, rep.skipped_cached, rep.succeeded) == (9, 6, 3)
    assert sim.stats()["requests"] - before == 3
    assert read_generations(out).height == 15


def test_duplicate_input_rows_are_generated_once(clean_sim, tmp_path: Path):
    start = clean_sim.stats()["requests"]
    prompts = make_prompts(5)
    rep = generate_shard(pl.concat([prompts, prompts.head(2)]), tmp_path / "s", make_config(clean_sim.url))
    assert (rep.requested, rep.succeeded, rep.duplicates_in_input) == (5, 5, 2)
    assert clean_sim.stats()["requests"] - start == 5


@pytest.fixture(scope="module")
def short_ctx_sim(tmp_path_factory):
    s = Sim(extra_args=("--context-length", "64"), log_path=tmp_path_factory.mktemp("sim64") / "sim.log")
    yield s
    s.kill()


def test_http_400_is_recorded_with_the_server_message_and_not_retried(short_ctx_sim, tmp_path: Path):
    sim = short_ctx_sim
    start = sim.stats()["requests"]
    prompts = make_prompts(6)
    # 60 prompt ids < the context 64 but >= the scheduler's max_req_input_len 58 (min(63, KV - 1) - 5): the server
    # says 400 (prompt + max_new_tokens over the context alone is fitted before sending: test_context_fit.py)
    long_ids = list(range(1000, 1060))
    prompts = pl.concat(
        [prompts, make_prompts(1, seed=9).with_columns(pl.Series("input_ids", [long_ids], dtype=pl.List(pl.Int32)))]
    )
    rep = generate_shard(prompts, tmp_path / "s", make_config(sim.url, stream=False))  # streamed: abort_400
    assert (rep.requested, rep.succeeded, rep.failed) == (7, 6, 1)
    assert rep.errors_by_kind == {"http_400": 1} and rep.retried_by_kind == {}
    assert sim.stats()["requests"] - start == 7  # the 400 was sent exactly once
    err = read_generation_errors(tmp_path / "s").row(0, named=True)
    assert err["reason"] == "http_400" and err["status"] == 400 and err["prompt_id"] == "p9-000000"
    assert "exceeds the maximum allowed length (58 tokens)" in err["detail"]


def test_bad_prompts_are_rejected_before_sending(clean_sim, tmp_path: Path):
    start = clean_sim.stats()["requests"]
    prompts = make_prompts(3)
    bad = make_prompts(2, seed=11).with_columns(pl.Series("input_ids", [[], [5, 999_999]], dtype=pl.List(pl.Int32)))
    rep = generate_shard(pl.concat([prompts, bad]), tmp_path / "s", make_config(clean_sim.url))
    assert rep.errors_by_kind == {"empty_input_ids": 1, "input_id_out_of_vocab": 1}
    assert (rep.succeeded, rep.failed) == (3, 2) and rep.reconciles
    assert clean_sim.stats()["requests"] - start == 3


def test_integrity_violations_are_recorded_not_hidden(start_sim, tmp_path: Path):
    sim = start_sim("--mode", "echo-prompt-tail")
    rep = generate_shard(make_prompts(5), tmp_path / "s", make_config(sim.url))
    df = read_generations(tmp_path / "s")
    assert df.height == 5 and rep.succeeded == 5  # rows are kept
    assert rep.integrity_violations == 5
    for v in df.get_column("integrity_violations").to_list():
        assert any(x.startswith("len_output_ids_") for x in v)


def test_rerun_does_not_resend_permanent_failures_unless_asked(short_ctx_sim, tmp_path: Path):
    sim = short_ctx_sim
    long_ids = list(range(1000, 1060))  # >= max_req_input_len 58: a 400 on every send
    prompts = pl.concat(
        [
            make_prompts(4),
            make_prompts(1, seed=9).with_columns(pl.Series("input_ids", [long_ids], dtype=pl.List(pl.Int32))),
        ]
    )
    out = tmp_path / "s"
    cfg = make_config(sim.url, stream=False)  # the scheduler's refusal as an HTTP 400 (streamed: abort_400)
    generate_shard(prompts, out, cfg)
    before = sim.stats()["requests"]
    rep = generate_shard(prompts, out, cfg)
    assert sim.stats()["requests"] == before  # nothing changed: nothing sent, not even the 400
    assert (rep.requested, rep.skipped_cached, rep.failed, rep.carried_failed) == (5, 4, 1, 1) and rep.reconciles
    assert rep.errors_by_kind == {"http_400": 1}
    assert read_generation_errors(out).get_column("reason").to_list() == ["http_400"]
    rep = generate_shard(prompts, out, cfg.with_(retry_permanent_errors=True))
    assert sim.stats()["requests"] == before + 1 and rep.failed == 1 and rep.carried_failed == 0
    assert read_generation_errors(out).height == 1


def test_integrity_checks_on_crafted_responses():
    from eagle3_dagster.generate import integrity_violations

    ok = {
        "output_ids": [5, 6, KIMI_EOS],
        "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "stop", "matched": KIMI_EOS}},
    }
    assert integrity_violations(ok) == []
    assert integrity_violations(
        {
            "output_ids": [5, 6, 7],
            "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "stop", "matched": KIMI_EOS}},
        }
    ) == [f"stop_matched_{KIMI_EOS}_ne_last_output_id_7"]
    # A stop string match (str) has no id to compare; a length finish must have exactly `length` ids.
    assert (
        integrity_violations(
            {
                "output_ids": [5, 6],
                "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "stop", "matched": "###"}},
            }
        )
        == []
    )
    assert integrity_violations(
        {"output_ids": [5, 6], "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "length", "length": 4}}}
    ) == ["length_finish_4_ne_len_output_ids_2"]
    assert integrity_violations({"meta_info": {}}) == ["output_ids_missing"]


def test_endpoints_come_from_the_settings(kimi_profile):
    # the caller hands the settings' endpoints over; GenerationConfig has no global fallback
    s = Settings.from_env({"EAGLE3_SGLANG_URL": "http://w1:30000/, http://w2:30000"})
    cfg = GenerationConfig.from_profile(kimi_profile, s.fleet.urls)
    assert cfg.endpoints == ("http://w1:30000", "http://w2:30000")
    assert cfg.max_new_tokens == kimi_profile.sampling.max_new_tokens and cfg.vocab_size == 163840


def test_empty_shard(clean_sim, tmp_path: Path):
    empty = pl.from_arrow(schemas.TOKENIZED_PROMPTS.empty_table())
    rep = generate_shard(empty, tmp_path / "s", make_config(clean_sim.url))
    assert (rep.requested, rep.succeeded, rep.failed, rep.skipped_cached) == (0, 0, 0, 0)
    assert read_generations(tmp_path / "s").height == 0 and read_generation_errors(tmp_path / "s").height == 0


def test_a_second_writer_on_the_same_shard_is_refused(clean_sim, tmp_path: Path):
    import fcntl
    import os

    from eagle3_dagster.generate import ShardBusyError

    out = tmp_path / "s"
    out.mkdir()
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as another process generating this shard would hold it
    try:
        start = clean_sim.stats()["requests"]
        with pytest.raises(ShardBusyError):
            generate_shard(make_prompts(3), out, make_config(clean_sim.url))
        assert clean_sim.stats()["requests"] == start and not list(out.glob("part-*"))
    finally:
        os.close(fd)
    assert generate_shard(make_prompts(3), out, make_config(clean_sim.url)).succeeded == 3
