"""training_inputs: what one shard's training build reads, refused plainly (no Dagster) for a shard the
gates did not pass or whose generations never recorded their current samples."""

from __future__ import annotations

import pytest

from eagle3_dagster.generate.active import ActiveSamplesMissingError
from eagle3_dagster.quality import GateFailedError, GateResult, write_gate_result
from eagle3_dagster.train.inputs import training_inputs


def _inputs(data):
    return training_inputs(
        data, 2, profile_name="kimi-k2.5", tokenizer_fingerprint="f", probe_sources=(), acceptance=False
    )


def test_a_shard_whose_gates_did_not_pass_is_refused_naming_the_shard_and_gate(tmp_path):
    with pytest.raises(GateFailedError, match=r"shard 0002: no stored 'prompts' gate result"):
        _inputs(tmp_path)
    write_gate_result(tmp_path, "prompts", 2, GateResult(gate="prompts", success=True, outcomes=[]))
    write_gate_result(tmp_path, "generations", 2, GateResult(gate="generations", success=False, outcomes=[]))
    with pytest.raises(GateFailedError, match=r"shard 0002: the 'generations' gate failed"):
        _inputs(tmp_path)


def test_a_shard_without_its_current_samples_is_refused(tmp_path):
    for gate in ("prompts", "generations"):
        write_gate_result(tmp_path, gate, 2, GateResult(gate=gate, success=True, outcomes=[]))
    with pytest.raises(ActiveSamplesMissingError):
        _inputs(tmp_path)
