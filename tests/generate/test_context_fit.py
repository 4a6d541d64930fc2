"""A prompt whose prompt + max_new_tokens exceeds the server's context length is fitted or skipped before it is
sent, never answered 400 (generate/context_fit.py; SGLang 0.5.23 TokenizerManager._validate_one_request).

Real simulator with a context length of 200 (its scheduler's max_req_input_len is min(199, KV - 1) - 5 = 194),
max_new_tokens 24: a 176-id prompt is exactly the context (176 + 24 == 200, accepted as SGLang does), a 190-id
prompt is over it (214 > 200: fitted to max_new_tokens 10, or skipped).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import polars as pl
import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster import schemas
from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.config import params_hash, sample_key, sampling_hash, sampling_params
from eagle3_dagster.generate.context_fit import CONTEXT_OVERFLOW, ContextBudget, overflows
from eagle3_dagster.generate.report import result_line
from eagle3_dagster.generate.store import read_generation_errors
from eagle3_dagster.quality.request_failures import context_fit_outcome
from eagle3_dagster.sim.record import read_recorded

CTX = 200
AT_LIMIT = CTX - 24  # 176 + 24 == 200: accepted
OVER = 190  # 190 + 24 > 200: fitted to 10


def prompts_with(lengths: list[int], n_short: int = 4) -> pl.DataFrame:
    """n_short short prompts, then one prompt of each length (distinct ids)."""
    df = make_prompts(n_short + len(lengths), seed=41)
    ids = df.get_column("input_ids").to_list()
    for j, n in enumerate(lengths):
        ids[n_short + j] = [2000 + 97 * j + i for i in range(n)]
    df = df.with_columns(
        pl.Series("input_ids", ids, dtype=pl.List(pl.Int32)), pl.Series("prompt_len", [len(x) for x in ids])
    )
    return pl.from_arrow(df.to_arrow().cast(schemas.TOKENIZED_PROMPTS))  # type: ignore[return-value]


def sent_budgets(log: Path) -> dict[int, int]:
    """prompt length -> the max_new_tokens the simulator ran it with."""
    return {len(r["input_ids"]): r["max_new_tokens"] for r in read_recorded(log)}


def test_sglangs_boundary_and_the_fitted_budget() -> None:
    # SGLang: input >= context is refused on its own; input + max_new_tokens > context (not >=) overflows
    assert not overflows(AT_LIMIT, 24, CTX) and overflows(AT_LIMIT + 1, 24, CTX)
    assert not overflows(CTX, 24, CTX) and not overflows(OVER, 24, None)
    cfg = make_config("http://127.0.0.1:1", min_new_tokens=16)
    b = ContextBudget.of(cfg, CTX)
    assert b.params_for(AT_LIMIT) == sampling_params(cfg) and b.hash_for(AT_LIMIT) == sampling_hash(cfg)
    fitted = b.params_for(OVER)
    assert fitted == {**sampling_params(cfg), "max_new_tokens": 10, "min_new_tokens": 10}  # min <= max (SGLang)
    assert b.hash_for(OVER) == params_hash(fitted) != sampling_hash(cfg)
    assert b.hash_for(OVER) != b.hash_for(OVER - 1)  # another budget, another cache key
    assert ContextBudget.of(cfg.with_(context_overflow="skip"), CTX).params_for(OVER) == sampling_params(cfg)
    with pytest.raises(ValueError, match="context_overflow must be 'fit' or 'skip'"):
        cfg.with_(context_overflow="truncate")


@pytest.mark.integration
def test_fit_sends_the_overlong_prompt_with_the_budget_that_fits_and_never_gets_a_400(start_sim, tmp_path: Path):
    log = tmp_path / "requests.jsonl"
    sim = start_sim("--context-length", str(CTX), "--record-requests", str(log))
    prompts = prompts_with([AT_LIMIT, OVER])
    out = tmp_path / "generations" / "shard=0000"
    rep = generate_shard(prompts, out, make_config(sim.url, ignore_eos=True))

    assert (rep.requested, rep.succeeded, rep.failed, rep.errors_by_kind) == (6, 6, 0, {}) and rep.reconciles
    assert (rep.context_overflow, rep.context_fitted, rep.context_overflow_skipped) == ("fit", 1, 0)
    budgets = sent_budgets(log)
    assert budgets[AT_LIMIT] == 24  # exactly the context: sent unchanged, and accepted
    assert budgets[OVER] == CTX - OVER == 10  # lowered to what fits
    assert "prompt + max_new_tokens > context 200: 1 sent with max_new_tokens lowered to fit" in result_line(
        "0000", rep
    )
    assert rep.as_metadata()["context_fitted"] == 1

    stored = read_generations(out)
    over_pid = prompts["prompt_id"][-1]
    row = stored.filter(pl.col("prompt_id") == over_pid).row(0, named=True)
    fitted_hash = ContextBudget.of(make_config(sim.url, ignore_eos=True), CTX).hash_for(OVER)
    assert row["sampling_hash"] == fitted_hash != rep.sampling_hash  # the row records the budget it was made with
    assert row["sample_id"] == sample_key(over_pid, rep.model_revision, "tmpl-a", fitted_hash, None)
    # the server's scheduler clamps a length finish to max_req_len - prompt - 1 = 199 - 190 - 1: recorded
    assert row["finish_reason"] == "length" and len(row["output_ids"]) == 8
    assert row["integrity_violations"] == ["length_capped_by_server_8_lt_max_new_tokens_10"]
    others = stored.filter(pl.col("prompt_id") != over_pid)
    assert set(others["sampling_hash"]) == {rep.sampling_hash}

    outcome = context_fit_outcome(
        requested=rep.requested,
        fitted=rep.context_fitted,
        skipped=rep.context_overflow_skipped,
        context_length=rep.server_context_length,
        max_new_tokens=24,
        mode=rep.context_overflow,
    )
    assert not outcome.success and outcome.severity == "warning" and outcome.unexpected_count == 1
    assert "1 of 6 prompts exceed it (fit mode): 1 sent with max_new_tokens lowered" in outcome.description


@pytest.mark.integration
def test_skip_records_context_overflow_and_sends_nothing_over_the_limit(start_sim, tmp_path: Path):
    log = tmp_path / "requests.jsonl"
    sim = start_sim("--context-length", str(CTX), "--record-requests", str(log))
    prompts = prompts_with([AT_LIMIT, OVER])
    out = tmp_path / "generations" / "shard=0000"
    rep = generate_shard(prompts, out, make_config(sim.url, context_overflow="skip"))

    assert (rep.succeeded, rep.failed, rep.errors_by_kind) == (5, 1, {CONTEXT_OVERFLOW: 1}) and rep.reconciles
    assert (rep.context_overflow, rep.context_fitted, rep.context_overflow_skipped) == ("skip", 0, 1)
    budgets = sent_budgets(log)
    assert OVER not in budgets and budgets[AT_LIMIT] == 24  # the boundary is sent, the overflow is not
    err = read_generation_errors(out).row(0, named=True)
    assert (err["prompt_id"], err["reason"], err["status"]) == (prompts["prompt_id"][-1], CONTEXT_OVERFLOW, None)
    assert err["detail"].startswith(
        "prompt of 190 tokens + max_new_tokens 24 = 214 > the server's context length 200 (/server_info "
        "context_length): not sent"
    )
    line = result_line("0000", rep)
    assert "context_overflow=1 (last: prompt of 190 tokens" in line and "1 not sent (context_overflow)" in line

    # not permanent: a run in fit mode sends it (fitted), nothing else
    before = len(read_recorded(log))
    rep2 = generate_shard(prompts, out, make_config(sim.url))
    assert (rep2.skipped_cached, rep2.succeeded, rep2.failed, rep2.context_fitted) == (5, 1, 0, 1)
    assert [r["max_new_tokens"] for r in read_recorded(log)[before:]] == [10]


@pytest.mark.integration
def test_a_row_fitted_at_one_budget_is_not_reused_for_another(start_sim, tmp_path: Path):
    log200, log205 = tmp_path / "r200.jsonl", tmp_path / "r205.jsonl"
    sim200 = start_sim("--context-length", str(CTX), "--record-requests", str(log200))
    sim205 = start_sim("--context-length", str(CTX + 5), "--record-requests", str(log205))
    prompts = prompts_with([OVER])
    out = tmp_path / "generations" / "shard=0000"

    first = generate_shard(prompts, out, make_config(sim200.url))
    assert (first.succeeded, first.context_fitted) == (5, 1)
    again = generate_shard(prompts, out, make_config(sim200.url))  # same context, same budget: all cached
    assert (again.skipped_cached, again.succeeded) == (5, 0) and len(read_recorded(log200)) == 5

    wider = generate_shard(prompts, out, make_config(sim205.url))  # budget 15 now: a new sample
    assert first.model_revision == wider.model_revision
    assert (wider.skipped_cached, wider.succeeded, wider.context_fitted) == (4, 1, 1) and wider.reconciles
    assert sent_budgets(log205) == {OVER: 15}
    hashes = read_generations(out).filter(pl.col("prompt_id") == prompts["prompt_id"][-1])["sampling_hash"]
    assert hashes.n_unique() == 2  # both budgets stored, each under its own key


@pytest.mark.integration
def test_simulator_refuses_the_overflow_like_sglang_unless_started_with_allow_auto_truncate(start_sim, tmp_path):
    log = tmp_path / "requests.jsonl"
    strict = start_sim("--context-length", str(CTX))
    lenient = start_sim("--context-length", str(CTX), "--allow-auto-truncate", "--record-requests", str(log))
    body = {"input_ids": list(range(1000, 1000 + OVER)), "sampling_params": {"max_new_tokens": 24}}
    r = httpx.post(strict.url + "/generate", json=body, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "Requested token count exceeds the model's maximum context length of 200 tokens. You requested a total "
        "of 214 tokens: 190 tokens from the input messages and 24 tokens for the completion. Please reduce the "
        "number of tokens in the input messages or the completion to fit within the limit."
    )
    assert httpx.get(strict.url + "/server_info", timeout=30).json()["allow_auto_truncate"] is False
    ok = httpx.post(lenient.url + "/generate", json=body, timeout=30)
    assert ok.status_code == 200 and sent_budgets(log) == {OVER: 10}  # lowered to context - input, by the server
    assert httpx.get(lenient.url + "/server_info", timeout=30).json()["allow_auto_truncate"] is True


def test_the_setting_is_read_once_and_handed_to_the_generation_config(tmp_path: Path) -> None:
    from eagle3_dagster.config import Settings, SettingsError
    from eagle3_dagster.generate.config import fleet_run_fields

    env = {"EAGLE3_WORK_DIR": str(tmp_path)}
    assert fleet_run_fields(Settings.from_env(env))["context_overflow"] == "fit"  # unset: the declared default
    assert make_config("http://127.0.0.1:1").context_overflow == "fit"  # GenerationConfig's, read from it
    skip = Settings.from_env({**env, "EAGLE3_CONTEXT_OVERFLOW": " Skip "})
    assert fleet_run_fields(skip)["context_overflow"] == "skip"
    with pytest.raises(SettingsError, match="EAGLE3_CONTEXT_OVERFLOW must be one of fit, skip, got 'trim'"):
        Settings.from_env({**env, "EAGLE3_CONTEXT_OVERFLOW": "trim"})
