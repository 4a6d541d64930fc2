"""`eagle3-sim --output-tokens-mean T`: outputs of about T tokens (reasoning models write long outputs)."""

from __future__ import annotations

import statistics

from eagle3_dagster.sim.model import OutputModel


def _mean_len(model: OutputModel, n: int = 200) -> float:
    return statistics.mean(len(model.script([1000 + i, 2000 + 7 * i, 163606]).ids) for i in range(n))


def test_output_tokens_mean_gives_long_outputs_of_that_mean(kimi_profile, kimi_tokenizer):
    default = OutputModel(kimi_tokenizer, kimi_profile, tool_call_rate=0.0)
    long = OutputModel(kimi_tokenizer, kimi_profile, tool_call_rate=0.0)
    long.output_tokens_mean = 1600
    assert _mean_len(default) < 800  # the default stays short
    mean = _mean_len(long)
    assert 1440 <= mean <= 1760, mean  # within 10% of the asked mean, counted with the real tokenizer
    s = long.script([5, 6, 163606])
    assert s.ids[-1] == kimi_profile.end_of_turn_id and kimi_profile.think_end_id in s.ids  # still a whole turn
    assert long.script([5, 6, 163606]) == s  # deterministic per prompt
