"""A speculating simulator's answers against SGLang 0.5.23's own speculative-decoding shapes.

The shapes come from the installed sglang source (sglang_shapes.derive_spec parses
tokenizer_manager._calculate_spec_decoding_metrics, where _handle_batch_output calls it, and the spec
namespace of ServerArgs): which meta_info keys come together, that they come only on the finished output,
and which /server_info keys name the drafter. The figures must also obey SGLang's formulas
(generate/drafter.py checks them on every row).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import sglang_shapes
import sglang_source

from eagle3_dagster.generate import GenerationConfig, sampling_params
from eagle3_dagster.generate.client import generate_body, stream_body
from eagle3_dagster.generate.drafter import IDENTITY_COLUMNS, drafter_of, spec_row_fields

_SKIP = sglang_source.unavailable_reason()
pytestmark = [pytest.mark.skipif(_SKIP is not None, reason=f"SGLang lane not installed: {_SKIP}")]

PROMPTS = [[1000 + i for i in range(12)], [5000 + i for i in range(20)]]
SPEC = ("--speculative-draft-model-path", "test/kimi-eagle3", "--speculative-num-draft-tokens", "4")


@pytest.fixture(scope="module")
def src() -> sglang_source.SGLangSource:
    return sglang_source.load()


@pytest.fixture(scope="module")
def spec(src) -> sglang_shapes.SpecShapes:
    sh = sglang_shapes.derive_spec(src.read)
    assert sh.only_when_finished
    assert {"spec_accept_rate", "spec_accept_length", "spec_verify_ct"} <= sh.with_drafts
    return sh


def _sse(text: str) -> list[dict[str, Any]]:
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    assert events and events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _check_final(sh: sglang_shapes.SpecShapes, meta: dict[str, Any], info: dict[str, Any]) -> None:
    keys = {k for k in meta if k.startswith("spec_")}
    assert keys == sh.with_drafts | {sh.histogram_key}, sorted(keys)
    assert keys <= sh.all_keys
    viol: list[str] = []
    spec_row_fields(meta, drafter_of(info), viol)
    assert viol == [], viol  # SGLang's own relations hold


@pytest.mark.integration
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_speculating_answers_have_sglangs_spec_shapes(src, spec, start_sim, kimi_profile, incremental) -> None:
    sim = start_sim(*SPEC, *(["--incremental-streaming-output"] if incremental else []))
    info = httpx.get(sim.url + "/server_info", timeout=5).json()
    named = {k for k in info if k.startswith("speculative_")}
    assert named == set(IDENTITY_COLUMNS.values()) and named <= spec.server_args
    sp = sampling_params(GenerationConfig.from_profile(kimi_profile, sim.url, max_new_tokens=48))

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            single = generate_body(PROMPTS[0], sp, "s-0")
            ans = (await c.post(sim.url + "/generate", json=single)).json()
            src.api_types.GenerateResponse.from_json_value(ans)
            _check_final(spec, ans["meta_info"], info)
            r = await c.post(sim.url + "/generate", json={**stream_body(single, 4), "rid": "s-1"})
            chunks = _sse(r.text)
            assert len(chunks) > 2
            for ch in chunks[:-1]:
                src.api_types.GenerateResponse.from_json_value(ch)
                assert not {k for k in ch["meta_info"] if k.startswith("spec_")}, "spec figures before the finish"
            _check_final(spec, chunks[-1]["meta_info"], info)
            figures = {k: v for k, v in ans["meta_info"].items() if k.startswith("spec_")}
            assert {k: v for k, v in chunks[-1]["meta_info"].items() if k.startswith("spec_")} == figures
            batch = {**generate_body(PROMPTS[0], sp, "b"), "input_ids": PROMPTS, "rid": ["b-0", "b-1"]}
            for a in (await c.post(sim.url + "/generate", json=batch)).json():
                src.api_types.GenerateResponse.from_json_value(a)
                _check_final(spec, a["meta_info"], info)

    asyncio.run(run())


@pytest.mark.integration
def test_a_server_that_does_not_speculate_sends_no_spec_figures(spec, start_sim, kimi_profile) -> None:
    sim = start_sim()
    info = httpx.get(sim.url + "/server_info", timeout=5).json()
    assert {k: info[k] for k in IDENTITY_COLUMNS.values()} == dict.fromkeys(IDENTITY_COLUMNS.values())
    sp = sampling_params(GenerationConfig.from_profile(kimi_profile, sim.url, max_new_tokens=32))
    ans = httpx.post(sim.url + "/generate", json=generate_body(PROMPTS[1], sp, "n-0"), timeout=60).json()
    assert not {k for k in ans["meta_info"] if k.startswith("spec_")} & spec.all_keys
