"""fit_to_context: what the requests to send may produce once measured against the server's context."""

from __future__ import annotations

import polars as pl

from eagle3_dagster.plan.build import fit_to_context
from eagle3_dagster.plan.estimate import OutputExpectation

EXPECT = OutputExpectation(per_request_mean={"a": 100.0}, overall_mean=100.0, basis="max_new_tokens")
# prompt lengths against a 1,000-token context with max_new_tokens 200: fits, overflows by 50, fills it
SEND = pl.DataFrame({"source": ["a", "a", "a"], "prompt_len": [500, 850, 1000]})


def test_fit_mode_lowers_the_budget_of_an_overflowing_request_and_drops_a_prompt_that_fills_the_context() -> None:
    fit = fit_to_context(SEND, EXPECT, server_ctx=1000, fit_mode=True, max_new=200)
    assert (fit.fitted, fit.skipped, fit.too_long) == (1, 0, 1)
    assert fit.new_output_tokens == 100 + 100 + 0  # the fitted one keeps 150 of room: its mean of 100 fits
    assert len(fit.assumptions) == 1 and "1 request(s) sent with max_new_tokens lowered" in fit.assumptions[0]


def test_without_fit_an_overflowing_request_is_not_sent() -> None:
    fit = fit_to_context(SEND, EXPECT, server_ctx=1000, fit_mode=False, max_new=200)
    assert (fit.fitted, fit.skipped, fit.too_long) == (0, 1, 1)
    assert fit.new_output_tokens == 100


def test_a_fitted_request_produces_at_most_what_the_context_leaves_it() -> None:
    tight = pl.DataFrame({"source": ["a"], "prompt_len": [960]})
    assert fit_to_context(tight, EXPECT, server_ctx=1000, fit_mode=True, max_new=200).new_output_tokens == 40


def test_unknown_context_counts_every_request_and_says_so() -> None:
    fit = fit_to_context(SEND, EXPECT, server_ctx=None, fit_mode=True, max_new=200)
    assert (fit.new_output_tokens, fit.fitted, fit.skipped, fit.too_long) == (300, 0, 0, 0)
    assert "not known" in fit.assumptions[0]


def test_a_fleet_whose_context_holds_every_request_adds_no_assumption() -> None:
    fit = fit_to_context(SEND.head(1), EXPECT, server_ctx=100_000, fit_mode=True, max_new=200)
    assert (fit.new_output_tokens, fit.assumptions) == (100, [])
