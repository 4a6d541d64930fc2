"""200 answers that look like results but are not this sample's: another request's answer (a proxy or
cache that mixes answers up) and output ids outside the model's vocabulary (a server sampling a padded
or another vocab). Stored, either would reach the training table as a good sample.
Real simulator over HTTP (fleet faults stale_answer / out_of_vocab), real Parquet, the real gate.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from gen_helpers import Sim, as_map, make_config, make_prompts

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import generate_shard, read_generation_errors, read_generations
from eagle3_dagster.quality import generation_features, run_gate
from eagle3_dagster.quality.gate import quarantined_ids

pytestmark = pytest.mark.integration

N = 10


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(N, seed=171)


@pytest.fixture(scope="module")
def reference(shared_sim: Sim, prompts, tmp_path_factory) -> dict[str, list[int]]:
    shared_sim.faults(clear=True)
    out = tmp_path_factory.mktemp("ref") / "s"
    rep = generate_shard(prompts, out, make_config(shared_sim.url))
    assert rep.succeeded == N
    return as_map(read_generations(out))


@pytest.mark.parametrize("stream", [False, True])
def test_another_requests_answer_is_a_failure_never_this_samples_tokens(
    clean_sim: Sim, prompts, reference, tmp_path: Path, caplog, stream: bool
):
    caplog.set_level(logging.ERROR, logger="eagle3_dagster.generate")
    out = tmp_path / f"s-{stream}"
    # one at a time, so each stale answer is the previous sample's (a different prompt's tokens)
    cfg = make_config(clean_sim.url, max_in_flight=1, stream=stream)
    generate_shard(make_prompts(1, seed=172), tmp_path / "warm", cfg)  # an answer to go stale
    injected = clean_sim.stats()["faults_injected"].get("stale_answer", 0)
    clean_sim.faults(stale_answer=3)
    rep = generate_shard(prompts, out, cfg)
    assert clean_sim.stats()["faults_injected"].get("stale_answer", 0) - injected == 3
    stored = as_map(read_generations(out))
    # every stored sample holds its own prompt's tokens: never another sample's
    assert {sid: ids for sid, ids in stored.items() if reference[sid] != ids} == {}
    assert (rep.succeeded, rep.failed) == (N - 3, 3) and rep.reconciles, rep
    assert rep.errors_by_kind == {"answer_rid_mismatch": 3}
    errs = read_generation_errors(out)
    assert errs.height == 3 and set(errs["reason"]) == {"answer_rid_mismatch"}
    for sid, detail in zip(errs["sample_id"], errs["detail"]):
        assert sid in detail and "meta_info.id" in detail  # names the rid sent and the one answered
    assert any("answer_rid_mismatch" in r.getMessage() for r in caplog.records)
    # not permanent: the rerun sends exactly those 3 again and the table is the clean run's
    rep2 = generate_shard(prompts, out, cfg)
    assert (rep2.skipped_cached, rep2.succeeded, rep2.failed) == (N - 3, 3, 0)
    assert as_map(read_generations(out)) == reference


def test_output_ids_outside_the_vocabulary_are_quarantined_by_the_gate(
    clean_sim: Sim, prompts, reference, tmp_path: Path, kimi_profile
):
    out = tmp_path / "s"
    clean_sim.faults(out_of_vocab=2)
    rep = generate_shard(prompts, out, make_config(clean_sim.url))
    gens = read_generations(out)
    assert rep.succeeded == N and rep.integrity_violations == 2  # stored as received, flagged
    bad = {
        r["sample_id"]
        for r in gens.iter_rows(named=True)
        if max(r["output_ids"]) >= kimi_profile.vocab_size  # the ids exactly as the server sent them
    }
    assert len(bad) == 2
    res = run_gate(
        "generations",
        generation_features(gens, prompts, kimi_profile),
        profile=kimi_profile,
        expectations_dir=PROJECT_ROOT / "expectations",
        context_dir=tmp_path / "gx",
    )
    name_to_key = {o.name: o.key for o in res.outcomes}
    reasons = {r["row_id"]: {name_to_key[n] for n in r["reasons"]} for r in res.row_failures.iter_rows(named=True)}
    vocab_failures = {sid for sid, keys in reasons.items() if "output_ids_in_vocabulary" in keys}
    assert vocab_failures == bad  # exactly those rows, for that reason
    assert bad <= quarantined_ids(res)  # never built into training samples
    outcome = next(o for o in res.outcomes if o.key == "output_ids_in_vocabulary")
    assert (outcome.severity, outcome.unexpected_count, outcome.evaluated) == ("critical", 2, N)


@pytest.mark.parametrize("stream", [False, True])
def test_an_unfinished_answer_is_retried_never_stored_as_a_trace(
    clean_sim: Sim, prompts, reference, tmp_path: Path, stream: bool
):
    """finish_reason null (a proxy's snapshot of a running request: half the ids; a stream whose final chunk
    was dropped) is a partial trace: stored, it would pass a gate that allows 5% non-stop finishes. It is retried; with no retries left it fails `unfinished_answer`."""
    # stream_interval 2: a stream's partial chunks arrive, only its final chunk is missing
    cfg = make_config(clean_sim.url, stream=stream, stream_interval=2 if stream else None)
    injected = clean_sim.stats()["faults_injected"].get("unfinished", 0)
    clean_sim.faults(unfinished=3)
    rep = generate_shard(prompts, tmp_path / "retried", cfg)
    assert clean_sim.stats()["faults_injected"].get("unfinished", 0) - injected == 3
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.retried_by_kind == {"unfinished": 3}, rep
    assert as_map(read_generations(tmp_path / "retried")) == reference  # every trace whole, none half

    clean_sim.faults(unfinished=3)
    out = tmp_path / "failed"
    rep = generate_shard(prompts, out, replace(cfg, max_retries=0))
    assert (rep.succeeded, rep.failed) == (N - 3, 3) and rep.reconciles, rep
    assert rep.errors_by_kind == {"unfinished_answer": 3}
    stored = read_generations(out)
    assert stored.height == N - 3 and stored["finish_reason"].null_count() == 0
    assert as_map(stored) == {sid: ids for sid, ids in reference.items() if sid in set(stored["sample_id"])}
    errs = read_generation_errors(out)
    assert set(errs["reason"]) == {"unfinished_answer"}
    assert all("without a finish_reason" in d for d in errs["detail"])
    rep2 = generate_shard(prompts, out, cfg)  # not permanent: the rerun sends those 3 again
    assert (rep2.skipped_cached, rep2.succeeded, rep2.failed) == (N - 3, 3, 0)
    assert as_map(read_generations(out)) == reference
