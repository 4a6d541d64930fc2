"""Credentials in the endpoint URL (`http://user:pass@host`): httpx sends them as Basic auth, which replaces
the SGLANG_API_KEY Bearer key. The combination is refused (settings, run start); alone, a 401 names the
credential that was sent; the password is never printed or stored. What a server says about itself
(a refusal quoting its defaults) is redacted the same way."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster.config import Settings, SettingsError
from eagle3_dagster.generate import AuthError, generate_shard
from eagle3_dagster.generate.endpoint_info import EndpointRefusedError
from eagle3_dagster.generate.store import read_generation_errors
from eagle3_dagster.orchestration.resources import resources_from_settings
from eagle3_dagster.secret import Secret

PASSWORD = "hunter2-url-pw"
KEY = "e3-url-test-key-5a6b"


def _with_user(url: str) -> str:
    return url.replace("http://", f"http://bob:{PASSWORD}@")


def test_settings_refuse_url_credentials_next_to_the_api_key():
    env = {"EAGLE3_SGLANG_URL": _with_user("http://gw:8080"), "SGLANG_API_KEY": KEY}
    with pytest.raises(SettingsError) as ei:
        Settings.from_env(env)
    msg = str(ei.value)
    assert "EAGLE3_SGLANG_URL" in msg and "SGLANG_API_KEY" in msg and "http://gw:8080" in msg
    assert PASSWORD not in msg and KEY not in msg
    # either one alone is a valid setting
    assert Settings.from_env({"EAGLE3_SGLANG_URL": env["EAGLE3_SGLANG_URL"]}).fleet.api_key is None
    assert Settings.from_env({"SGLANG_API_KEY": KEY}).fleet.api_key is not None


def test_run_start_refuses_url_credentials_next_to_the_api_key():
    # the URL may come from the sglang resource's `urls`, the key from the settings: refused at run start too
    with pytest.raises(ValueError) as ei:
        make_config(_with_user("http://gw:8080"), api_key=Secret(KEY))
    assert "SGLANG_API_KEY" in str(ei.value) and "http://gw:8080" in str(ei.value)
    assert PASSWORD not in str(ei.value)


def test_url_credentials_stay_out_of_the_run_config():
    s = Settings.from_env({"EAGLE3_SGLANG_URL": _with_user("http://gw:8080")})
    assert resources_from_settings(s)["sglang"].urls is None  # the step reads the setting, run config never holds it
    plain = Settings.from_env({"EAGLE3_SGLANG_URL": "http://gw:8080"})
    assert resources_from_settings(plain)["sglang"].urls == "http://gw:8080"


@pytest.mark.integration
def test_a_401_names_the_credential_that_was_sent(start_sim, tmp_path: Path, caplog):
    sim = start_sim("--api-key-env", "SIM_TEST_KEY", env={"SIM_TEST_KEY": KEY})
    caplog.set_level(logging.DEBUG)
    prompts = make_prompts(2, seed=41)
    cases = {
        "url": (
            make_config(_with_user(sim.url)),
            "Basic credentials of the endpoint URL's user info (user 'bob', password not shown) were sent and refused",
        ),
        "key": (make_config(sim.url, api_key=Secret("wrong-" + KEY)), "Bearer key from SGLANG_API_KEY was sent"),
        "none": (make_config(sim.url), "no credential was sent (SGLANG_API_KEY is not set"),
    }
    texts = []
    for name, (cfg, said) in cases.items():
        with pytest.raises(AuthError) as ei:
            generate_shard(prompts, tmp_path / name, cfg)
        assert "answered 401" in str(ei.value) and said in str(ei.value), str(ei.value)
        texts.append(str(ei.value))
    texts += [r.getMessage() for r in caplog.records]
    assert not [t for t in texts if PASSWORD in t or KEY in t]


@pytest.mark.integration
def test_url_credentials_never_printed_or_stored(start_sim, tmp_path: Path, caplog):
    sim = start_sim()  # no key: the URL's Basic auth is accepted (a proxy's job, here nobody checks)
    sim.faults(quote_headers=1)  # one 400 quoting the headers: the Basic credentials among them
    caplog.set_level(logging.DEBUG)
    rep = generate_shard(make_prompts(4, seed=43), tmp_path / "s", make_config(_with_user(sim.url)))
    assert (rep.succeeded, rep.failed) == (3, 1)
    errors = read_generation_errors(tmp_path / "s")
    texts = [json.dumps(rep.as_metadata(), default=str), repr(rep), errors.write_json()]
    texts += [r.getMessage() for r in caplog.records]
    assert any(sim.url.removeprefix("http://") in t for t in texts)  # endpoints are named, without user info
    assert "authorization" in errors.write_json().lower()
    assert not [t for t in texts if PASSWORD in t or "Ym9iOmh1bnRlcjItdXJsLXB3" in t], (
        "URL password (or its Basic form)"
    )


@pytest.mark.integration
def test_a_refusal_quoting_server_defaults_never_shows_a_credential(start_sim, tmp_path: Path):
    sim = start_sim()
    # server-side defaults the client does not send: the endpoint is refused, quoting them
    sim.faults(preferred_sampling_params={"custom_params": {"api_key": "psp-secret-31"}})
    with pytest.raises(EndpointRefusedError) as ei:
        generate_shard(make_prompts(2), tmp_path / "s", make_config(sim.url, wait_for_endpoint_s=5))
    assert "custom_params" in str(ei.value) and "[redacted]" in str(ei.value)
    assert "psp-secret-31" not in str(ei.value)


@pytest.mark.integration
def test_a_401_to_url_credentials_is_named_as_such_by_check_and_the_demo(start_sim, tmp_path: Path):
    """`eagle3 check` (and the demo's first probe) and the demo's advice after a failed shard: with credentials
    only in the URL, the refusal names the URL's user info that was sent and refused, never "set SGLANG_API_KEY"
    as if no credential had been sent."""
    from eagle3_dagster.app.demo import endpoint_advice
    from eagle3_dagster.generate.fleet_capacity import endpoint_problems, probe_fleet

    sim = start_sim("--api-key-env", "SIM_TEST_KEY", env={"SIM_TEST_KEY": KEY})
    [line] = endpoint_problems(probe_fleet([_with_user(sim.url)]))
    assert "answered 401" in line and "URL's user info (user 'bob', password not shown) were sent and refused" in line
    assert "check that user and password" in line and "wants an API key" not in line and PASSWORD not in line
    [keyless] = endpoint_problems(probe_fleet([sim.url]))
    assert "no credential was sent" in keyless and "set SGLANG_API_KEY to its --api-key" in keyless
    [wrong] = endpoint_problems(probe_fleet([sim.url], headers={"Authorization": "Bearer wrong-" + KEY}))
    assert "the Bearer key from SGLANG_API_KEY was sent and refused" in wrong and KEY not in wrong

    cfg = make_config(_with_user(sim.url))
    with pytest.raises(AuthError) as ei:
        generate_shard(make_prompts(1, seed=44), tmp_path / "s", cfg)
    advice = endpoint_advice([f"generations: AuthError: {ei.value}"])
    assert advice is not None and "user info" in advice and "were sent" in advice and "refused" in advice
    assert "refused the API key" not in advice
    assert "wants a key" in (endpoint_advice([f"generations: AuthError: {make_refusal({})}"]) or "")


def make_refusal(headers: dict[str, str]) -> str:
    from eagle3_dagster.generate.endpoint_info import auth_refused

    return str(auth_refused("http://gw:1/generate", 401, "http://gw:1", headers))
