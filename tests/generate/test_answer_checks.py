"""check_answer: every 200 answer judged against what was sent, in plain Python (no server).

The answers are SGLang 0.5.23's shape (meta_info as tokenizer_manager builds it: prompt_tokens is
len(origin_input_ids), the ids sent); each lie is one field changed. A refusal names the field and
the values; nothing is cast; the answer is never changed; no input makes the check raise.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from gen_helpers import KIMI_EOS

from eagle3_dagster.generate.answer_checks import Accepted, Refused, Sent, check_answer, fits_float64, fits_int

SENT = Sent(input_ids=[1000, 1001, 1002, 1003, 1004], rid="s1-abc-0", max_new_tokens=8, vocab_size=163840)


def faithful() -> dict[str, Any]:
    return {
        "text": "hi",
        "output_ids": [412, 5000, KIMI_EOS],
        "meta_info": {
            "id": "s1-abc-0",
            "finish_reason": {"type": "stop", "matched": KIMI_EOS},
            "prompt_tokens": 5,
            "weight_version": "default",
            "num_retractions": 0,
            "completion_tokens": 3,
            "cached_tokens": 4,
            "reasoning_tokens": 0,
            "e2e_latency": 0.12,
        },
    }


def with_meta(**meta: Any) -> dict[str, Any]:
    a = faithful()
    a["meta_info"].update(meta)
    return a


def with_ids(ids: list[Any]) -> dict[str, Any]:
    a = faithful()
    a["output_ids"] = ids
    return a


def refused(answer: Any, sent: Sent = SENT) -> Refused:
    v = check_answer(sent, answer)
    assert isinstance(v, Refused), v
    return v


def test_a_faithful_answer_is_accepted_unchanged_without_flags():
    a = faithful()
    v = check_answer(SENT, a)
    assert isinstance(v, Accepted) and v.answer is a and v.flags == [] and v.weight_versions == ["default"]
    assert a == faithful()


@pytest.mark.parametrize("pt", [4, 6, 0])
def test_prompt_tokens_other_than_the_ids_sent_is_refused(pt):
    r = refused(with_meta(prompt_tokens=pt, cached_tokens=0))
    assert r.reason == "prompt_tokens_mismatch"
    assert "sent 5 input ids" in r.detail and f"prompt_tokens is {pt}" in r.detail


def test_cached_tokens_above_the_prompt_is_refused():
    r = refused(with_meta(cached_tokens=6))
    assert r.reason == "cached_tokens_exceed_prompt" and "cached_tokens is 6" in r.detail
    assert isinstance(check_answer(SENT, with_meta(cached_tokens=5)), Accepted)  # every prompt token cached


def test_a_missing_prompt_tokens_is_kept_and_flagged_and_cached_tokens_judged_against_the_ids_sent():
    a = faithful()
    del a["meta_info"]["prompt_tokens"]
    v = check_answer(SENT, a)
    assert isinstance(v, Accepted) and v.flags == ["prompt_tokens_missing"]
    a["meta_info"]["cached_tokens"] = 6
    assert refused(a).reason == "cached_tokens_exceed_prompt"


@pytest.mark.parametrize(
    ("wire", "shown"),
    [
        ("412.5", "output_ids[0] is 412.5 (float)"),
        ("412.0", "output_ids[0] is 412.0 (float)"),  # json.loads gives a float: a float is not an id
        ('"412"', "output_ids[0] is '412' (str)"),
        ("true", "output_ids[0] is True (bool)"),  # bool is an int in Python: refused all the same
        ("null", "output_ids[0] is None (NoneType)"),
        ("[412]", "output_ids[0] is [412] (list)"),
        ("4.12e2", "output_ids[0] is 412.0 (float)"),
    ],
)
def test_an_output_id_that_is_not_a_json_integer_is_refused_never_cast(wire, shown):
    a = json.loads(json.dumps(faithful()).replace('"output_ids": [412,', f'"output_ids": [{wire},'))
    r = refused(a)
    assert r.reason == "output_id_not_integer" and shown in r.detail and "1 of 3" in r.detail


def test_an_id_the_int32_column_cannot_hold_is_refused_and_a_negative_id_kept_as_received_and_flagged():
    r = refused(with_ids([2**31, 5, KIMI_EOS]))
    assert r.reason == "output_id_exceeds_int32" and f"output_ids[0] is {2**31}" in r.detail
    assert isinstance(check_answer(SENT, with_ids([2**31 - 1, 5, KIMI_EOS])), Accepted)  # fits: flagged out of vocab
    a = with_ids([-413, 5, KIMI_EOS])
    v = check_answer(SENT, a)
    assert isinstance(v, Accepted) and v.answer["output_ids"] == [-413, 5, KIMI_EOS]
    assert v.flags == ["output_id_negative_-413"]


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        (with_meta(completion_tokens="3"), "meta_info.completion_tokens is '3' (str)"),
        (with_meta(prompt_tokens=5.0), "meta_info.prompt_tokens is 5.0 (float)"),
        (with_meta(prompt_tokens=True), "meta_info.prompt_tokens is True (bool)"),
        (with_meta(cached_tokens=-1), "meta_info.cached_tokens is -1 (int)"),
        (with_meta(completion_tokens=2**31), f"meta_info.completion_tokens is {2**31} (int)"),
        (with_meta(finish_reason="stop"), "meta_info.finish_reason is 'stop' (str)"),
        (with_meta(finish_reason={"type": 1}), "meta_info.finish_reason is {'type': 1} (dict)"),
        (with_meta(e2e_latency="fast"), "meta_info.e2e_latency is 'fast' (str)"),
        ({**faithful(), "text": ["hi"]}, "text is ['hi'] (list)"),
        (with_ids("412 5000"), "output_ids is str"),  # type: ignore[arg-type]
        ({**faithful(), "meta_info": [1]}, "meta_info is list"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_it(answer, field):
    r = refused(answer)
    assert r.reason == "answer_field_invalid" and field in r.detail


def test_the_rid_and_the_weight_version_are_judged_in_the_same_place():
    assert refused(with_meta(id="s2-abc-0")).reason == "answer_rid_mismatch"
    no_id = faithful()
    del no_id["meta_info"]["id"]
    assert isinstance(check_answer(SENT, no_id), Accepted)  # an older server: not judged on it
    shard_v2 = Sent(SENT.input_ids, SENT.rid, weight_version="v2")
    r = refused(faithful(), shard_v2)
    assert r.reason == "weight_version_changed" and "'v2'" in r.detail and "'default'" in r.detail
    spans = with_meta(weight_versions=[{"version": "default", "start": 0, "end": 1}, {"version": "v2", "start": 1}])
    assert refused(spans).reason == "weight_version_changed"  # two sets of weights in one answer


def test_no_answer_makes_the_check_raise():
    """Garbage in every field a server can send: a verdict, never an exception (one bad answer must not
    crash the shard's step)."""
    rng = random.Random(5)
    junk: list[Any] = [None, True, -1, 2**40, 1.5, "x", "", [], [1, "a"], {}, {"type": None}, [[1]]]
    fields = ["text", "output_ids", "meta_info"]
    meta = list(faithful()["meta_info"])
    for _ in range(3000):
        a = copy.deepcopy(faithful())
        for _ in range(rng.randrange(1, 4)):
            if rng.random() < 0.5:
                a[rng.choice(fields)] = rng.choice(junk)
            elif isinstance(a.get("meta_info"), dict):
                a["meta_info"][rng.choice(meta)] = rng.choice(junk)
        assert isinstance(check_answer(SENT, a), Accepted | Refused)
    assert isinstance(check_answer(SENT, ["not", "an", "object"]), Refused)


def test_numbers_fit_their_column_or_are_named():
    assert fits_int(2**31 - 1) and not fits_int(2**31) and fits_int(-(2**31)) and not fits_int(-(2**31) - 1)
    assert fits_int(2**63 - 1, 64) and not fits_int(2**63, 64) and not fits_int(2**70, 64)
    assert not fits_int(-1, minimum=0) and fits_int(0, minimum=0)
    assert not fits_int(True) and not fits_int(3.0) and not fits_int("3") and not fits_int(None)
    assert fits_float64(0.5) and fits_float64(float("nan")) and fits_float64(10**308) and fits_float64(-3)
    assert not fits_float64(10**400) and not fits_float64(True) and not fits_float64("1.0")


@pytest.mark.parametrize(
    ("latency", "what"),
    [
        (float("nan"), "nan"),
        (-0.5, "negative"),
        (float("inf"), "infinite"),
        (10**400, "not_a_float64"),  # no float64 holds it: the chunk write crashed (ArrowInvalid), the step failed
        (86400.0, "longer_than_the_request"),  # a day for an answer the client waited 2 s for
    ],
)
def test_an_e2e_latency_no_request_can_have_taken_is_flagged(latency, what):
    v = check_answer(Sent(SENT.input_ids, SENT.rid, max_new_tokens=8, waited_s=2.0), with_meta(e2e_latency=latency))
    assert isinstance(v, Accepted) and v.flags == [f"e2e_latency_invalid:{what}"]
    ok = check_answer(Sent(SENT.input_ids, SENT.rid, max_new_tokens=8, waited_s=2.0), with_meta(e2e_latency=1.9))
    assert isinstance(ok, Accepted) and ok.flags == []


def test_a_length_cut_reported_as_a_stop_is_refused():
    eight = [412, 5000, 6000, 7000, 8000, 9000, 10000, 11000]  # max_new_tokens 8, no stop id at the end
    disguised = {**with_ids(eight), "meta_info": {**faithful()["meta_info"], "completion_tokens": 8}}
    for matched in (None, KIMI_EOS):  # nothing matched, or a stop id that is not there
        disguised["meta_info"]["finish_reason"] = {"type": "stop", "matched": matched}
        r = refused(copy.deepcopy(disguised))
        assert r.reason == "stop_at_max_new_tokens" and "max_new_tokens 8" in r.detail and "11000" in r.detail
    # SGLang 0.5.23 reports stop when the stop id is the token at max_new_tokens: its id ends the answer
    real = copy.deepcopy(disguised)
    real["output_ids"][-1] = KIMI_EOS
    real["meta_info"]["finish_reason"] = {"type": "stop", "matched": KIMI_EOS}
    assert isinstance(check_answer(SENT, real), Accepted)
    unmatched = copy.deepcopy(real)  # the last id is one of the stop ids sent, whatever matched says
    unmatched["meta_info"]["finish_reason"] = {"type": "stop", "matched": None}
    sent_stops = Sent(SENT.input_ids, SENT.rid, max_new_tokens=8, stop_ids=frozenset({KIMI_EOS}))
    assert isinstance(check_answer(sent_stops, unmatched), Accepted)
    stop_string = copy.deepcopy(disguised)
    stop_string["meta_info"]["finish_reason"] = {"type": "stop", "matched": "</answer>"}
    assert isinstance(check_answer(SENT, stop_string), Accepted)
    assert isinstance(check_answer(SENT, faithful()), Accepted)  # a stop before the budget is a stop
