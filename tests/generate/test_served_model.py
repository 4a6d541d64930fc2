"""Another model behind the endpoint (generate/served_model.py): an endpoint, or a router worker, whose
/model_info names another model than the profile's is refused before anything is sent, naming both. The
token gates cannot catch a sibling that shares the tokenizer (Kimi-K2 under the Kimi-K2.5 profile), and a
server of Qwen3-8B under the Kimi profile used to run with SUCCESS. A local copy or a fine-tune the user
means to use is pinned by its model_path (EAGLE3_SERVED_MODEL).

The judge is a plain function (in-process tests); the refusals run against real simulator processes that
claim another model (fleet fault `claimed_model`, flag `--model-type`), over HTTP.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gen_helpers import free_port, make_prompts

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import GenerationConfig, generate_shard, read_generations
from eagle3_dagster.generate.endpoint_info import EndpointRefusedError
from eagle3_dagster.generate.served_model import ExpectedModel, judge_served_model
from eagle3_dagster.profiles import ProfileError, load_profile, profile_from_dict

MODELS = PROJECT_ROOT / "assets" / "models"
QWEN = {"model_path": "Qwen/Qwen3-8B", "model_type": "qwen3"}
KIMI_K2 = {"model_path": "moonshotai/Kimi-K2-Instruct", "model_type": "kimi_k2"}
KIMI_K25 = {"model_path": "moonshotai/Kimi-K2.5", "model_type": "kimi_k25"}


@pytest.fixture(scope="module")
def kimi() -> ExpectedModel:
    return ExpectedModel.of(load_profile("kimi-k2.5", MODELS))


def test_the_profiles_name_the_model_types_their_servers_report() -> None:
    # kimi_k25 is the model_type of the Kimi-K2.5 release's config.json (the copy under ../shared)
    import json

    shared = PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5" / "original" / "config.json"
    assert load_profile("kimi-k2.5", MODELS).model_types == (json.loads(shared.read_text())["model_type"],)
    assert load_profile("qwen3", MODELS).model_types == ("qwen3", "qwen3_moe")
    raw = {k: v for k, v in _kimi_raw().items() if k != "model_types"}
    with pytest.raises(ProfileError, match=r"missing field\(s\) model_types \(model_types: the model_type"):
        profile_from_dict(raw, source="p.yaml")
    with pytest.raises(ProfileError, match="model_types must be a non-empty list"):
        profile_from_dict({**raw, "model_types": []}, source="p.yaml")


def _kimi_raw() -> dict:
    import yaml

    return yaml.safe_load((MODELS / "kimi-k2.5.yaml").read_text())


@pytest.mark.parametrize(
    ("info", "named"),
    [
        (QWEN, ["'Qwen/Qwen3-8B'", "'qwen3'", "kimi-k2.5", "'kimi_k25'", "EAGLE3_SERVED_MODEL=Qwen/Qwen3-8B"]),
        (KIMI_K2, ["'moonshotai/Kimi-K2-Instruct'", "'kimi_k2'", "'kimi_k25'"]),  # a sibling: the same tokenizer
        ({"model_path": "/models/k25"}, ["does not say which model", "'/models/k25'", "'kimi_k25'"]),
        ({"model_path": "/models/k25", "model_type": ""}, ["does not say which model"]),
    ],
)
def test_another_model_is_refused_naming_both(kimi: ExpectedModel, info: dict, named: list[str]) -> None:
    v = judge_served_model(info, kimi, who="endpoint http://gpu7:30000")
    assert v.refusal is not None and v.refusal.startswith("endpoint http://gpu7:30000 ")
    for text in named:
        assert text in v.refusal, (text, v.refusal)


def _said(v) -> tuple[str | None, str | None]:
    return v.refusal, v.warning


def test_the_profiles_model_and_the_pins(kimi: ExpectedModel) -> None:
    # the profile's model_type under any path (a local copy, a fine-tune): used, nothing to say
    assert _said(judge_served_model(KIMI_K25, kimi)) == (None, None)
    assert _said(judge_served_model({**KIMI_K25, "model_path": "/m/k25/"}, kimi)) == (None, None)
    # a profile that pins model_path refuses a server of the same model_type under another path
    pinned_profile = ExpectedModel.of(profile_from_dict({**_kimi_raw(), "model_path": "moonshotai/Kimi-K2.5"}))
    assert _said(judge_served_model({**KIMI_K25, "model_path": " moonshotai/Kimi-K2.5/"}, pinned_profile)) == (
        None,
        None,
    )
    other = judge_served_model({**KIMI_K25, "model_path": "moonshotai/Kimi-K2.6"}, pinned_profile).refusal
    assert other is not None and "pins model_path 'moonshotai/Kimi-K2.5'" in other and "Kimi-K2.6" in other
    # the user's pin: that path only, whatever the profile pins; another model_type is used with a warning
    for expected in (kimi.with_pin("/models/k25-ft/"), pinned_profile.with_pin("/models/k25-ft")):
        assert _said(judge_served_model({**KIMI_K25, "model_path": "/models/k25-ft"}, expected)) == (None, None)
        renamed = judge_served_model({"model_path": "/models/k25-ft", "model_type": "deepseek_v3"}, expected)
        assert renamed.refusal is None and renamed.warning is not None
        for text in ("'deepseek_v3'", "'kimi_k25'", "used because EAGLE3_SERVED_MODEL pins it"):
            assert text in renamed.warning
        elsewhere = judge_served_model(KIMI_K25, expected).refusal
        assert elsewhere is not None and "EAGLE3_SERVED_MODEL pins model_path '/models/k25-ft'" in elsewhere
    # no profile and no pin: nothing is judged (a config built by hand)
    assert _said(judge_served_model(QWEN, ExpectedModel("x"))) == (None, None)


def test_a_pin_with_credentials_is_never_quoted(kimi: ExpectedModel) -> None:
    # the refusal goes to the run's log and the describe() line to the logs and the data card
    pinned = kimi.with_pin("s3://reader:pw-77x@bucket/k25-ft")
    refusal = judge_served_model(KIMI_K25, pinned).refusal
    assert refusal is not None and "EAGLE3_SERVED_MODEL pins model_path 's3://reader:" in refusal
    assert "pw-77x" not in refusal and "pw-77x" not in pinned.describe()
    assert "bucket/k25-ft" in refusal and "bucket/k25-ft" in pinned.describe()


def _config(*urls: str, **over) -> GenerationConfig:
    prof = load_profile("kimi-k2.5", MODELS)
    base = dict(max_new_tokens=24, max_in_flight=8, backoff_base_s=0.02, backoff_max_s=0.2, probe_interval_s=0.1)
    return GenerationConfig.from_profile(prof, urls, **{**base, **over})


@pytest.mark.integration
def test_a_server_of_another_model_is_refused_and_sent_nothing(start_sim, tmp_path: Path) -> None:
    sim = start_sim()
    sim.faults(claimed_model=QWEN)  # a Qwen3-8B server, as its /model_info says
    with pytest.raises(EndpointRefusedError) as e:
        generate_shard(make_prompts(6, seed=5), tmp_path / "s", _config(sim.url))
    for text in ("no usable SGLang endpoint", "serves another model", "'Qwen/Qwen3-8B'", "'qwen3'", "'kimi_k25'"):
        assert text in str(e.value), str(e.value)
    assert sim.requests() == 0 and read_generations(tmp_path / "s").height == 0


@pytest.mark.integration
def test_a_sibling_beside_a_good_server_is_left_out_and_named(start_sim, tmp_path: Path, caplog) -> None:
    good, sibling = start_sim(), start_sim("--model-type", "kimi_k2", "--model-path", KIMI_K2["model_path"])
    with caplog.at_level(logging.ERROR, logger="eagle3_dagster.generate.endpoints"):
        rep = generate_shard(make_prompts(8, seed=6), tmp_path / "s", _config(good.url, sibling.url))
    assert (rep.succeeded, rep.failed) == (8, 0) and sibling.requests() == 0
    assert set(rep.refused_endpoints) == {sibling.url} and "'kimi_k2'" in rep.refused_endpoints[sibling.url]
    assert rep.served_models[good.url] == "model_path 'moonshotai/Kimi-K2.5' (model_type 'kimi_k25')"
    assert any("refused for this run" in r.message and "'kimi_k2'" in r.message for r in caplog.records)
    assert set(read_generations(tmp_path / "s")["endpoint"]) == {good.url}


@pytest.mark.integration
def test_a_pinned_local_model_is_used_with_a_warning(start_sim, tmp_path: Path, caplog) -> None:
    sim = start_sim("--model-path", "/models/k25-ft", "--model-type", "deepseek_v3")  # a renamed config.json
    with pytest.raises(EndpointRefusedError, match="'deepseek_v3'"):
        generate_shard(make_prompts(4, seed=8), tmp_path / "refused", _config(sim.url))
    with caplog.at_level(logging.WARNING, logger="eagle3_dagster.generate.endpoints"):
        rep = generate_shard(
            make_prompts(4, seed=8), tmp_path / "s", _config(sim.url, served_model_pin="/models/k25-ft")
        )
    assert rep.succeeded == 4 and rep.model_revision == "/models/k25-ft@default"
    assert any("used because EAGLE3_SERVED_MODEL pins it" in r.message for r in caplog.records)


@pytest.mark.integration
def test_a_pinned_revision_still_checks_the_model(start_sim, tmp_path: Path) -> None:
    sim = start_sim()
    sim.faults(claimed_model=KIMI_K2)
    with pytest.raises(EndpointRefusedError, match="'kimi_k2'"):
        generate_shard(make_prompts(4, seed=9), tmp_path / "s", _config(sim.url, model_revision="pinned@1"))
    assert sim.requests() == 0


@pytest.mark.integration
def test_a_router_with_a_worker_of_another_model_is_refused(start_sim, tmp_path: Path) -> None:
    good, other = start_sim(), start_sim()
    other.faults(claimed_model=QWEN)
    port = free_port()
    router = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "mini_router.py"), "--port", str(port), "--worker", good.url]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(url + "/liveness", timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        httpx.post(url + "/_router/workers", json={"urls": [good.url, other.url]}, timeout=5).raise_for_status()
        with pytest.raises(EndpointRefusedError) as e:
            generate_shard(make_prompts(4, seed=10), tmp_path / "s", _config(url))
    finally:
        router.kill()
        router.wait()
    msg = str(e.value)
    assert f"router worker {other.url} serves another model" in msg and f"behind router {url}" in msg
    assert "'Qwen/Qwen3-8B'" in msg and "'kimi_k25'" in msg
    assert good.requests() == 0 and other.requests() == 0
