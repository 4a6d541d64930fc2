"""The fleet fault spec_acceptance_scale (sim/fleet_faults.py): traffic the drafter knows less well, so
less is accepted while the figures still add up; bad values are refused."""

from __future__ import annotations

import pytest

from eagle3_dagster.sim.fleet_faults import FleetFaults, apply
from eagle3_dagster.sim.speculative import DraftedAnswer, SpecConfig, meta_fields

CFG = SpecConfig("EAGLE3", "test/kimi-eagle3", None, 3, 1, 4)


def test_a_scaled_acceptance_is_lower_and_consistent(kimi_profile) -> None:
    ids = [2000] * 600
    base = meta_fields(CFG, kimi_profile, DraftedAnswer(ids, [1000, 1001], ["a"] * 600, None))
    low = meta_fields(CFG, kimi_profile, DraftedAnswer(ids, [1000, 1001], ["a"] * 600, None), scale=0.5)
    assert low["spec_accept_rate"] < base["spec_accept_rate"] * 0.8
    assert low["spec_accept_length"] == 600 / low["spec_verify_ct"]
    assert low["spec_accept_rate"] == low["spec_num_correct_drafts"] / low["spec_num_proposed_drafts"]


def test_the_fault_is_set_and_checked() -> None:
    ff = apply(FleetFaults(), {"spec_acceptance_scale": 0.6})
    assert ff.spec_acceptance_scale == 0.6 and ff.as_dict()["spec_acceptance_scale"] == 0.6
    for bad in (0, 1.5, -0.2):
        with pytest.raises(ValueError, match=r"spec_acceptance_scale must be in \(0, 1\]"):
            apply(FleetFaults(), {"spec_acceptance_scale": bad})
