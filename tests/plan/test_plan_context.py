"""`eagle3 plan` against a server with a short context length: the prompts the generate step fits (or skips,
EAGLE3_CONTEXT_OVERFLOW) are counted and their output tokens planned at the budget they are sent with."""

from __future__ import annotations

import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import GenerationConfig
from eagle3_dagster.ingest import load_source_specs
from eagle3_dagster.plan.build import Fleet, PlanDirs, PlanModel, build_plan, plan_table
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.storage import data_root
from eagle3_dagster.tokenize import PromptRenderer

pytestmark = pytest.mark.integration

MAX_NEW = 2048


def test_plan_counts_the_prompts_over_the_servers_context(tmp_path, kimi_profile):
    specs = load_source_specs(PROJECT_ROOT / "assets" / "sources")
    renderer = PromptRenderer(kimi_profile)

    def plan(url: str, mode: str):
        config = GenerationConfig.from_profile(kimi_profile, (url,), max_new_tokens=MAX_NEW, context_overflow=mode)
        return build_plan(
            specs,
            dirs=PlanDirs(data_root(tmp_path / "data"), tmp_path / "work"),
            model=PlanModel(kimi_profile, renderer, config),
            n_shards=4,
            control_text={s.name: s.control_text for s in specs},
            fleet=Fleet(probe_requests=2, probe_max_new_tokens=8),
        )

    ctx = 2048 + 120  # prompts of more than 120 tokens overflow with max_new_tokens 2048
    with start_simulator(extra_args=("--context-length", str(ctx))) as sim:
        fit, skip = plan(sim.url, "fit"), plan(sim.url, "skip")

    # the same prompts, counted independently: their lengths as the plan's tokenize step gives them
    from eagle3_dagster.plan.counts import count_prompts, tokenize_for_plan

    _, prompts_path = count_prompts(specs, n_shards=4, scratch=tmp_path / "scratch")
    lens = tokenize_for_plan(prompts_path, renderer, max_new_tokens=MAX_NEW, control_text={}).frame["prompt_len"]
    over = [n for n in lens.to_list() if n < ctx and n + MAX_NEW > ctx]
    too_long = [n for n in lens.to_list() if n >= ctx]
    assert over, "the demo prompts must include some over the context for this test"
    assert fit.requests_to_send == lens.len() and fit.server_context_length == ctx

    assert (fit.requests_context_fitted, fit.requests_context_skipped) == (len(over), 0)
    assert fit.requests_too_long_for_server == len(too_long)
    # no snapshot: every answer runs to its budget, the fitted ones to context - prompt tokens
    fitted_budget = sum(ctx - n for n in over)
    fits = lens.len() - len(over) - len(too_long)
    assert fit.expected_output_tokens == MAX_NEW * fits + fitted_budget < MAX_NEW * lens.len()
    assert f"{len(over):,} fitted + 0 skipped (prompt + max_new_tokens > {ctx:,})" in plan_table(fit)

    assert (skip.requests_context_fitted, skip.requests_context_skipped) == (0, len(over))
    assert skip.expected_output_tokens == MAX_NEW * fits  # the skipped ones are not sent
    assert any(f"{len(over):,} not sent (context_overflow)" in a for a in skip.assumptions)
