"""The demo summary's checks column: passing checks counted, the others named, wrapped to the width."""

from __future__ import annotations

from eagle3_dagster.orchestration.checks_column import checks_column

SIX = [
    ("thinking_token_ends_prompt", "PASS"),
    ("prompts_gate", "PASS"),
    ("think_end_present", "WARN"),
    ("request_failure_budget", "FAIL"),
    ("generations_gate", "PASS"),
    ("training_samples_gate", "empty"),
]


def test_all_passing_checks_are_one_count():
    assert checks_column([(n, "PASS") for n, _ in SIX], indent=40) == ["all 6 PASS"]


def test_the_others_are_named_in_order_and_wrapped_under_the_column():
    lines = checks_column(SIX, indent=40, width=100)
    assert all(40 + len(lines[0]) <= 100 for _ in lines[:1]) and all(len(ln) <= 100 for ln in lines[1:])
    assert all(ln.startswith(" " * 40) and not ln[40].isspace() for ln in lines[1:])
    assert " ".join(" ".join(lines).split()) == (
        "3 PASS; think_end_present=WARN, request_failure_budget=FAIL, training_samples_gate=empty"
    )


def test_no_checks_is_an_empty_column():
    assert checks_column([], indent=40) == [""]
