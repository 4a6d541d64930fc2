"""Weights updated in place and rolled back DURING the samples: SGLang 0.5.23's `weight_versions` spans
say so even though `weight_version` is back to the shard's (docs/sglang-schema.md). No sample mixing two
sets of weights is stored; each one fails `weight_version_changed`, and the counts reconcile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generation_errors, read_generations

pytestmark = pytest.mark.integration


def test_a_sample_generated_under_two_weight_versions_is_never_stored(start_sim, tmp_path: Path) -> None:
    sim = start_sim("--token-latency-ms", "25")
    prompts = make_prompts(4)
    out = tmp_path / "generations" / "shard=0000"
    cfg = make_config(sim.url, max_new_tokens=60, ignore_eos=True, max_in_flight=4, stream=False)
    spans: dict[str, int] = {}

    def update_then_roll_back() -> None:
        deadline = time.monotonic() + 30
        while sim.stats()["in_flight"] < 4:  # every sample running under "default"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        sim.faults(weight_version="v2")
        time.sleep(0.3)
        sim.faults(weight_version="default")  # back before any sample finishes (60 x 25 ms = 1.5 s)
        spans["done"] = 1

    t = threading.Thread(target=update_then_roll_back)
    t.start()
    rep = generate_shard(prompts, out, cfg)
    t.join()
    assert spans == {"done": 1}
    errs = read_generation_errors(out)
    # each answer says weight_version "default" (the shard's), its spans default -> v2 -> default
    assert (rep.requested, rep.succeeded, rep.failed) == (4, 0, 4) and rep.reconciles
    assert errs.height == 4 and set(errs["reason"]) == {"weight_version_changed"}, errs
    assert all("'v2'" in d for d in errs["detail"]), errs["detail"].to_list()
    assert read_generations(out).height == 0
