"""The simulator's drafter (sim/speculative.py): figures shaped as SGLang's, seeded, and worth reading
(what is generated decides how much is accepted)."""

from __future__ import annotations

import argparse
from argparse import Namespace

import pytest

from eagle3_dagster.sim.cli import parse_args
from eagle3_dagster.sim.speculative import (
    DraftedAnswer,
    SpecConfig,
    content_class,
    meta_fields,
    parse_draft_quality,
    spec_config,
)

CFG = SpecConfig("EAGLE3", "test/kimi-eagle3", None, 3, 1, 4)
PROMPT = [1000, 1001, 1002]
WORD = 2000  # an ordinary token id


def _rate(kimi_profile, ids, strings, prompt=PROMPT, cfg=CFG) -> float:
    return meta_fields(cfg, kimi_profile, DraftedAnswer(ids, prompt, strings, None))["spec_accept_rate"]


def test_figures_are_sglangs_and_seeded(kimi_profile):
    ids = [WORD] * 300
    m = meta_fields(CFG, kimi_profile, DraftedAnswer(ids, PROMPT, ["a"] * 300, None))
    assert m == meta_fields(
        CFG, kimi_profile, DraftedAnswer(ids, PROMPT, ["a"] * 300, None)
    )  # a retry: the same figures
    assert m["spec_accept_length"] == 300 / m["spec_verify_ct"]
    assert m["spec_num_proposed_drafts"] == m["spec_verify_ct"] * 3
    assert m["spec_accept_rate"] == m["spec_num_correct_drafts"] / m["spec_num_proposed_drafts"]
    hist = m["spec_correct_drafts_histogram"]
    assert sum(hist) == m["spec_verify_ct"] and sum(k * n for k, n in enumerate(hist)) == m["spec_num_correct_drafts"]
    assert len(hist) <= 4
    # one token is the prefill's: no verify step, no figures (SGLang: spec_verify_ct > 0)
    assert meta_fields(CFG, kimi_profile, DraftedAnswer([WORD], PROMPT, ["a"], None)) == {}
    other = SpecConfig("EAGLE3", "someone/else-eagle3", None, 3, 1, 4)
    assert meta_fields(other, kimi_profile, DraftedAnswer(ids, PROMPT, ["a"] * 300, None)) != m


def test_structured_output_is_easier_to_draft_than_prose(kimi_profile):
    n = 600
    prose = _rate(kimi_profile, [WORD] * n, ["a"] * n)
    code = _rate(kimi_profile, [WORD] * n, ["```", *["x"] * (n - 1)])
    call = kimi_profile.tool_call_ids.call_begin
    tool = _rate(kimi_profile, [call, *[WORD] * (n - 1)], ["<call>", *["x"] * (n - 1)])
    assert prose < code and prose < tool


def test_long_reasoning_and_later_turns_are_harder(kimi_profile):
    te = kimi_profile.think_end_id
    short = [*[WORD] * 200, te, *[WORD] * 50]
    long = [*[WORD] * 4000, te, *[WORD] * 50]
    assert _rate(kimi_profile, long, ["a"] * len(long)) < _rate(kimi_profile, short, ["a"] * len(short))
    eot = kimi_profile.end_of_turn_id
    first = [1000, eot, 1001, eot, 163606]
    later = [1000, *([1001, eot] * 8), 163606]
    ids = [WORD] * 600
    assert _rate(kimi_profile, ids, ["a"] * 600, prompt=later) < _rate(kimi_profile, ids, ["a"] * 600, prompt=first)


def test_named_as_sglangs_server_args():
    assert not spec_config(Namespace()).on
    cfg = spec_config(Namespace(speculative_draft_model_path="me/eagle3", speculative_num_draft_tokens=6))
    assert cfg.server_info() == {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "me/eagle3",
        "speculative_draft_model_revision": None,
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 6,
    }


def test_each_release_gets_its_names_and_the_cap_figures_add_up(kimi_profile):
    import pytest

    from eagle3_dagster.sim.speculative import named_as, unknown_names

    ids = [WORD] * 200
    m = meta_fields(CFG, kimi_profile, DraftedAnswer(ids, PROMPT, ["a"] * 200, None))
    old = named_as(m, "0.5.10")
    assert old["spec_accept_token_num"] == m["spec_num_correct_drafts"] and "spec_num_correct_drafts" not in old
    assert old["spec_accept_histogram"] == m["spec_correct_drafts_histogram"]
    aliased = named_as(m, "0.5.12")
    assert aliased["spec_accepted_drafts"] == aliased["spec_num_correct_drafts"] == m["spec_num_correct_drafts"]
    assert named_as(m, "0.5.23") == m
    assert not {k for k in unknown_names(m) if k in m}  # every figure under another name
    capped = SpecConfig("EAGLE3", "test/kimi-eagle3", None, 3, 1, 4, "0.5.23", "cap-accept")
    c = meta_fields(capped, kimi_profile, DraftedAnswer(ids, PROMPT, ["a"] * 200, None))
    assert {k: c[k] for k in m} == m  # the same drafts: the cap figures come on top
    hist = c["spec_cap_lens_histogram"]
    assert sum(hist) == c["spec_verify_ct"] and c["spec_cap_length"] == sum(k * n for k, n in enumerate(hist)) / sum(
        hist
    )
    assert c["spec_block_accept_length"] == (c["spec_num_correct_drafts"] + c["spec_verify_ct"]) / c["spec_verify_ct"]
    with pytest.raises(ValueError, match="0.5.11 sends no cap figures"):
        spec_config(Namespace(spec_names="0.5.11", ragged_verify_mode="compact", speculative_draft_model_path="x"))
    assert spec_config(Namespace(version="0.5.9", speculative_draft_model_path="x")).names == "0.5.9"


def _length(kimi_profile, cfg: SpecConfig, content: str | None, seeds: int = 30) -> float:
    ids = [WORD] * 400
    tokens = verify = 0
    for seed in range(seeds):
        m = meta_fields(cfg, kimi_profile, DraftedAnswer(ids, PROMPT, ["a"] * 400, seed, content=content))
        tokens += 400
        verify += m["spec_verify_ct"]
    return tokens / verify


def test_a_drafter_can_be_planted_per_content_class(kimi_profile):
    """`--draft-quality code=1.0,prose=0.7`: better on code prompts, worse on prose ones than production's 0.85;
    the same quality under another name (a renamed drafter) draws other figures with the same mean."""
    prod = SpecConfig("EAGLE3", "org/v1", None, 3, 1, 4, class_quality=(("*", 0.85),))
    mixed = SpecConfig("EAGLE3", "org/v2", None, 3, 1, 4, class_quality=(("code", 1.0), ("prose", 0.7)))
    renamed = SpecConfig("EAGLE3", "org/v1-renamed", None, 3, 1, 4, class_quality=(("*", 0.85),))
    assert _length(kimi_profile, mixed, "code") > _length(kimi_profile, prod, "code") + 0.2
    assert _length(kimi_profile, mixed, "prose") < _length(kimi_profile, prod, "prose") - 0.2
    # a class the flag does not name falls back to `*`, else to the quality drawn from the name
    assert mixed.quality_for("math") == mixed.quality() and prod.quality_for("math") == 0.85
    one = meta_fields(renamed, kimi_profile, DraftedAnswer([WORD] * 400, PROMPT, ["a"] * 400, None))
    assert one != meta_fields(prod, kimi_profile, DraftedAnswer([WORD] * 400, PROMPT, ["a"] * 400, None))
    assert abs(_length(kimi_profile, renamed, None, 60) - _length(kimi_profile, prod, None, 60)) < 0.05


def test_the_content_class_is_read_from_the_prompt_text():
    assert content_class("Write a Python function that merges two lists.") == "code"
    assert content_class("What is 17 * 23? Show your reasoning.") == "math"
    assert content_class("Describe a quiet harbour at dawn.") == "prose"
    assert content_class("Fix this:\n```\nprint(1 + 2)\n```") == "code"  # code first, numbers or not


def test_draft_quality_flag_values_are_checked():
    assert parse_draft_quality("0.9") == (("*", 0.9),)
    assert parse_draft_quality("code=0.97, prose=0.82,*=0.9") == (("code", 0.97), ("prose", 0.82), ("*", 0.9))
    for bad, why in (
        ("cod=0.9", "'cod' is not a content class"),
        ("code=fast", "the quality must be a number"),
        ("code=2", r"must be in \(0, 1.5\]"),
        ("code=0.9,code=0.8", "'code' is given twice"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            parse_draft_quality(bad)
    with pytest.raises(ValueError, match="--draft-quality needs a drafter"):
        spec_config(Namespace(draft_quality=(("*", 0.9),)))
    args = parse_args(["--speculative-draft-model-path", "me/x", "--draft-quality", "prose=0.8"])
    assert spec_config(args).class_quality == (("prose", 0.8),) and spec_config(args).by_class
    assert "speculative_draft_quality" not in spec_config(args).server_info()  # what a real server says, no more
