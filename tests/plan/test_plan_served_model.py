"""`eagle3 plan` asks the endpoints which model they serve before it sends a timed probe request: a server of
another model than the profile's would measure that model's throughput, and the plan said OK. Judged as the
run judges it (generate/served_model.py); in process, against real simulators over HTTP (the Qwen3 one loads
the Qwen tokenizer and names Qwen/Qwen3-8B in /model_info)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import GenerationConfig
from eagle3_dagster.ingest import load_source_specs
from eagle3_dagster.plan.build import Fleet, Plan, PlanDirs, PlanModel, build_plan
from eagle3_dagster.plan.probe import ServedModelError
from eagle3_dagster.sim.process import SimProcess, start_simulator
from eagle3_dagster.storage import data_root
from eagle3_dagster.tokenize import PromptRenderer

pytestmark = pytest.mark.integration

QWEN_ARGS = ("--model", "qwen3", "--tokenizer", str(PROJECT_ROOT.parent / "shared" / "tokenizers" / "qwen3"))


@pytest.fixture(scope="module")
def qwen():
    with start_simulator(extra_args=QWEN_ARGS) as sim:
        yield sim


def _requests(sim: SimProcess) -> int:
    """/generate requests the simulator received (/_sim/stats)."""
    return int(httpx.get(sim.url + "/_sim/stats", timeout=5).json()["requests"])


def _plan(tmp_path: Path, kimi_profile, url: str, fleet: Fleet, pin: str | None = None) -> Plan:
    src = tmp_path / "sources"
    src.mkdir(exist_ok=True)
    lines = [
        json.dumps({"messages": [{"role": "user", "content": f"Question {i}: why is the sky blue?"}]}) for i in range(3)
    ]
    (src / "few.jsonl").write_text("\n".join(lines) + "\n")
    (src / "few.yaml").write_text("path: few.jsonl\nformat: openai\n")
    specs = load_source_specs(src)
    config = GenerationConfig.from_profile(kimi_profile, (url,), max_new_tokens=64, served_model_pin=pin)
    return build_plan(
        specs,
        dirs=PlanDirs(data_root(tmp_path / "data"), tmp_path / "work"),
        model=PlanModel(kimi_profile, PromptRenderer(kimi_profile), config),
        n_shards=2,
        control_text={},
        fleet=fleet,
    )


def test_a_server_of_another_model_gets_no_probe_request(tmp_path: Path, kimi_profile, qwen) -> None:
    before = _requests(qwen)
    for fleet in (Fleet(probe_requests=2, probe_max_new_tokens=8), Fleet(tokens_per_s_per_server=1000.0)):
        with pytest.raises(ServedModelError) as e:  # probed for throughput, or for its servers only
            _plan(tmp_path, kimi_profile, qwen.url, fleet)
        [line] = e.value.lines
        assert line.startswith(f"EAGLE3_SGLANG_URL {qwen.url}: the endpoint serves another model: "), line
        assert "'Qwen/Qwen3-8B'" in line and "'kimi_k25'" in line and "EAGLE3_SERVED_MODEL=Qwen/Qwen3-8B" in line
    assert _requests(qwen) == before


def test_a_pinned_model_is_planned_with_a_warning_and_a_declared_fleet_is_not_asked(
    tmp_path: Path, kimi_profile, qwen
) -> None:
    pinned = _plan(tmp_path, kimi_profile, qwen.url, Fleet(tokens_per_s_per_server=1000.0), pin="Qwen/Qwen3-8B")
    [warning] = [w for w in pinned.warnings if "EAGLE3_SGLANG_URL" in w]
    assert warning.startswith(f"EAGLE3_SGLANG_URL {qwen.url}: the endpoint serves model_path 'Qwen/Qwen3-8B'")
    assert warning.endswith("used because EAGLE3_SERVED_MODEL pins it"), warning
    # throughput and servers declared: the fleet is not asked, so nothing is said of it
    declared = _plan(tmp_path, kimi_profile, qwen.url, Fleet(tokens_per_s_per_server=1000.0, servers=1))
    assert declared.warnings == [] and declared.requests_to_send == 3
