"""A speculating simulator's answers against SGLang's own speculative-decoding shapes, release by release.

The shapes come from the installed sglang 0.5.23 source (sglang_shapes.derive_spec parses
tokenizer_manager._calculate_spec_decoding_metrics, where _handle_batch_output calls it, and the spec
namespace of ServerArgs): which meta_info keys come together, that they come only on the finished output,
and which /server_info keys name the drafter. The figures must also obey SGLang's formulas
(generate/drafter.py checks them on every row).

The names: for every release the simulator speaks (`--spec-names`, sim/speculative.py SPEC_NAMES), the keys
that release's own _calculate_spec_decoding_metrics sets, in its order (sglang_shapes.derive_release_spec;
0.5.23 installed, the older ones' tokenizer_manager.py kept by scripts/sglang_releases.py), are exactly the
keys the simulator sends, and the client reads every one of them into the row.
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
from eagle3_dagster.generate.drafter import (
    EXTRA_KEYS,
    IDENTITY_COLUMNS,
    KNOWN_KEYS,
    METRIC_KEYS,
    drafter_of,
    spec_row_fields,
)
from eagle3_dagster.sim import speculative as SP

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


def test_the_lane_fetches_every_release_the_simulator_speaks() -> None:
    import importlib.util

    from eagle3_dagster.config import PROJECT_ROOT

    spec = importlib.util.spec_from_file_location("sglang_releases", PROJECT_ROOT / "scripts" / "sglang_releases.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert {*script.RELEASES, sglang_source.SGLANG_VERSION} == set(SP.SPEC_NAMES)


@pytest.mark.integration
@pytest.mark.parametrize("release", list(SP.SPEC_NAMES))
def test_the_simulator_speaks_each_releases_own_names_and_the_client_reads_them(
    release, start_sim, kimi_profile
) -> None:
    why = sglang_source.release_unavailable(release)
    if why is not None:
        pytest.skip(why)
    own = sglang_shapes.derive_release_spec(sglang_source.release_reader(release))
    assert set(own.keys) <= KNOWN_KEYS, f"SGLang {release} sends {set(own.keys) - KNOWN_KEYS}: the client misses them"
    sp = sampling_params(GenerationConfig.from_profile(kimi_profile, "http://sim", max_new_tokens=48))
    modes = ["static", "cap-accept", "compact"] if own.cap else ["static"]
    for mode in modes:
        sim = start_sim(*SPEC, "--spec-names", release, "--ragged-verify-mode", mode)
        info = httpx.get(sim.url + "/server_info", timeout=5).json()
        assert info["version"] == release
        meta = httpx.post(sim.url + "/generate", json=generate_body(PROMPTS[1], sp, "r-0"), timeout=60).json()[
            "meta_info"
        ]
        dropped = {"static": own.cap, "cap-accept": frozenset(), "compact": own.cap_accept_only}[mode]
        sent = [k for k in meta if k.startswith("spec_")]
        assert sent == [k for k in own.keys if k not in dropped], (release, mode)  # the names, in SGLang's order
        viol: list[str] = []
        row = spec_row_fields(meta, drafter_of(info), viol)
        assert viol == [], viol
        assert all(row[k] is not None for k in METRIC_KEYS), row
        assert {k for k in EXTRA_KEYS if row[k] is not None} == own.cap - dropped
