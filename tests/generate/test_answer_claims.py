"""Answers are claims: a server that lies about what it answered (a gateway that truncated the prompt,
ids written as floats, strings or booleans, ids no int32 holds, a negative id) through the real
generate step, in every answer shape (JSON, a cumulative stream, a delta stream). A lie is never
published (412.5 stored as 412) nor crashes the step (a string id: a TypeError would make Dagster retry
the whole step and send every request again): a refused answer is one failed request with its reason in errors.parquet, the shard's other samples are stored, the
counts reconcile, and a negative id is stored exactly as received and quarantined by the gate.
Real simulator over HTTP (fleet faults truncate_prompt, float_ids, ...), real Parquet, the real gate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from gen_helpers import Sim, as_map, make_config, make_prompts

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import generate_shard, read_generation_errors, read_generations
from eagle3_dagster.quality import generation_features, run_gate
from eagle3_dagster.quality.gate import quarantined_ids

pytestmark = pytest.mark.integration

N = 10
SHAPES = ("json", "stream", "delta")


@pytest.fixture(scope="module")
def delta_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    s = Sim(extra_args=("--incremental-streaming-output",), log_path=tmp_path_factory.mktemp("dsim") / "sim.log")
    yield s
    s.kill()


@pytest.fixture
def sim_for(clean_sim: Sim, delta_sim: Sim):
    delta_sim.faults(clear=True)
    return lambda shape: delta_sim if shape == "delta" else clean_sim


@pytest.fixture(scope="module")
def prompts() -> pl.DataFrame:
    return make_prompts(N, seed=181)


@pytest.fixture(scope="module")
def reference(shared_sim: Sim, prompts, tmp_path_factory) -> dict[str, list[int]]:
    shared_sim.faults(clear=True)
    out = tmp_path_factory.mktemp("ref") / "s"
    rep = generate_shard(prompts, out, make_config(shared_sim.url))
    assert rep.succeeded == N
    return as_map(read_generations(out))


def _run(sim: Sim, shape: str, prompts: pl.DataFrame, out: Path, **fault: int):
    """One generate step with `fault` armed; asserts it was injected and every request was sent once."""
    name = next(iter(fault))
    before = sim.stats()["faults_injected"].get(name, 0)
    sent = sim.requests()
    sim.faults(**fault)
    rep = generate_shard(prompts, out, make_config(sim.url, stream=shape != "json"))
    assert sim.stats()["faults_injected"].get(name, 0) - before == fault[name]
    assert sim.requests() - sent == N  # one request a sample: no crashed step sent again
    return rep


def _assert_refused(out: Path, rep, reference, reason: str, n: int) -> pl.DataFrame:
    """`n` samples failed `reason`, never stored; every other sample stored as the clean run's; counts reconcile."""
    assert (rep.succeeded, rep.failed) == (N - n, n) and rep.reconciles, rep
    assert rep.errors_by_kind == {reason: n}
    stored = as_map(read_generations(out))
    assert len(stored) == N - n and stored == {sid: reference[sid] for sid in stored}
    errs = read_generation_errors(out)
    assert errs.height == n and set(errs["reason"]) == {reason} and not set(errs["sample_id"]) & set(stored)
    return errs


@pytest.mark.parametrize("shape", SHAPES)
def test_an_answer_for_a_truncated_prompt_is_refused_never_published(sim_for, prompts, reference, tmp_path, shape):
    sim = sim_for(shape)
    out = tmp_path / "s"
    rep = _run(sim, shape, prompts, out, truncate_prompt=3)
    errs = _assert_refused(out, rep, reference, "prompt_tokens_mismatch", 3)
    lens = dict(zip(prompts["prompt_id"], prompts["input_ids"].list.len()))
    for pid, detail in zip(errs["prompt_id"], errs["detail"]):
        # the field and both values: what was sent, what the answer says (the fault cut 2 ids)
        assert f"sent {lens[pid]} input ids, meta_info.prompt_tokens is {lens[pid] - 2}" in detail
    gens = read_generations(out).join(prompts.select("prompt_id", "input_ids"), on="prompt_id")
    assert (gens["prompt_tokens"] == gens["input_ids"].list.len()).all()
    # not permanent: the rerun sends exactly those 3 again and the table is the clean run's
    rep2 = generate_shard(prompts, out, make_config(sim.url, stream=shape != "json"))
    assert (rep2.skipped_cached, rep2.succeeded, rep2.failed) == (N - 3, 3, 0)
    assert as_map(read_generations(out)) == reference


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("fault", "reason", "shown"),
    [
        ("float_ids", "output_id_not_integer", ".5 (float), output_ids[1] is "),  # 412.5 and 412.0, never cut
        ("string_ids", "output_id_not_integer", "(str)"),
        ("bool_ids", "output_id_not_integer", "output_ids[0] is True (bool)"),
        ("huge_id", "output_id_exceeds_int32", "output_ids[0] is 2147"),
        # counts a re-encoding proxy wrote as strings: an int32 column refused them (ArrowTypeError: a crashed step)
        ("string_counts", "answer_field_invalid", "meta_info.completion_tokens is '"),
        # a finish_reason that is not SGLang's object: judged by the check, not retried as an unfinished answer
        ("string_finish", "answer_field_invalid", "meta_info.finish_reason is '"),
    ],
)
def test_output_ids_that_are_no_int32_integers_fail_their_request_not_the_step(
    sim_for, prompts, reference, tmp_path, shape, fault, reason, shown
):
    out = tmp_path / "s"
    rep = _run(sim_for(shape), shape, prompts, out, **{fault: 2})
    errs = _assert_refused(out, rep, reference, reason, 2)
    for detail in errs["detail"]:
        assert shown in detail and (reason == "answer_field_invalid" or "output_ids[0] is " in detail), detail


@pytest.mark.parametrize("shape", SHAPES)
def test_a_negative_id_is_stored_as_received_flagged_and_quarantined(
    sim_for, prompts, reference, tmp_path, shape, kimi_profile
):
    out = tmp_path / "s"
    rep = _run(sim_for(shape), shape, prompts, out, negative_id=2)
    assert (rep.succeeded, rep.failed) == (N, 0) and rep.reconciles and rep.integrity_violations == 2
    gens = read_generations(out)
    stored = as_map(gens)
    bad = {sid for sid, ids in stored.items() if ids != reference[sid]}
    assert len(bad) == 2
    for sid in bad:  # exactly the ids the server sent: its first one negative, nothing nulled or repaired
        assert stored[sid] == [-1 - reference[sid][0], *reference[sid][1:]]
    flags = {r["sample_id"]: r["integrity_violations"] for r in gens.iter_rows(named=True) if r["sample_id"] in bad}
    assert flags == {sid: [f"output_id_negative_{stored[sid][0]}"] for sid in bad}
    res = run_gate(
        "generations",
        generation_features(gens, prompts, kimi_profile),
        profile=kimi_profile,
        expectations_dir=PROJECT_ROOT / "expectations",
        context_dir=tmp_path / "gx",
    )
    key = {o.name: o.key for o in res.outcomes}
    vocab = {
        r["row_id"]
        for r in res.row_failures.iter_rows(named=True)
        if "output_ids_in_vocabulary" in {key[n] for n in r["reasons"]}
    }
    assert vocab == bad and bad <= quarantined_ids(res)  # exactly those rows; never built into training samples
    outcome = next(o for o in res.outcomes if o.key == "output_ids_in_vocabulary")
    assert (outcome.severity, outcome.unexpected_count) == ("critical", 2)


def test_a_refused_or_flagged_turn_ends_its_conversation_never_the_shard(
    clean_sim, tmp_path, datasets_dir, kimi_profile
):
    """The multi-turn path goes through the same check: a turn answered with a string id fails that request
    (its conversation ends `error_output_id_not_integer`), a turn with a negative id is stored as received
    and ends its conversation (`integrity_violation`, never parsed into the next prompt); the shard goes on
    and the turn counts reconcile."""
    from multiturn_worker import run
    from test_multiturn_resume import _inputs

    from eagle3_dagster.generate.multiturn import read_turn_rows

    data = tmp_path / "data"
    _inputs(data, datasets_dir, kimi_profile)
    before = clean_sim.stats()["faults_injected"]
    clean_sim.faults(string_ids=1, negative_id=1)
    turns = run(data, clean_sim.url, 2)
    after = clean_sim.stats()["faults_injected"]
    assert all(after.get(k, 0) - before.get(k, 0) == 1 for k in ("string_ids", "negative_id"))
    ended = turns["conversations_ended_early"]
    assert ended.get("error_output_id_not_integer") == 1 and ended.get("integrity_violation", 0) >= 1, turns
    assert turns["turns_failed"] == 1
    assert turns["turns_planned"] == turns["turns_regenerated"] + sum(turns["turns_not_reached"].values())
    assert turns["conversations"] == turns["conversations_completed"] + sum(ended.values())
    errs = read_generation_errors(data / "generations")
    assert errs["reason"].to_list() == ["output_id_not_integer"] and "(str)" in errs["detail"][0]
    rows = read_turn_rows(data / "generations")
    negative = rows.filter(pl.col("output_ids").list.min() < 0)
    assert negative.height == 1
    assert negative["integrity_violations"].to_list() == [[f"output_id_negative_{negative['output_ids'][0][0]}"]]
