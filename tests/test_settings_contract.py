"""The settings contract: the generated configuration page <-> Settings fields, one endpoint-list parser, the
API key as a Secret, and domain functions without a global fallback (their callers pass the values)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from eagle3_dagster.config import (
    PROJECT_ROOT,
    SECTIONS,
    SETTINGS_SECTIONS,
    Settings,
    SettingsError,
    derived_fields,
    section_of,
    setting_fields,
)
from eagle3_dagster.devtools.docs_gen import variables_read_by_settings
from eagle3_dagster.generate import GenerationConfig
from eagle3_dagster.generate.config import deployment_fields, generation_config
from eagle3_dagster.generate.store import lock_path_for
from eagle3_dagster.orchestration.resources import SGLangFleet
from eagle3_dagster.profiles import ProfileError, load_profile
from eagle3_dagster.storage import data_root
from eagle3_dagster.urls import Endpoints, parse_endpoint_urls

CONFIG_PAGE = PROJECT_ROOT / "docs" / "reference" / "configuration.md"


def documented_variables() -> dict[str, str]:
    """Variable -> its row in the configuration reference (docs/reference/configuration.md, generated from
    Settings by eagle3_dagster/devtools/docs_gen.py; tests/test_docs_reference.py checks the file is current)."""
    rows = [ln for ln in CONFIG_PAGE.read_text().splitlines() if ln.startswith(("| `", "| [`"))]
    out: dict[str, str] = {}
    for row in rows:
        first = row.split("|")[1]
        names = re.findall(r"`([A-Z][A-Z0-9_]+)`", first)
        assert names, f"a configuration row without a variable: {row}"
        for n in names:
            assert n not in out, f"{n} is documented twice"
            out[n] = row
    assert len(out) >= 15, out  # the parse found the table
    return out


def samples(tmp: Path) -> dict[str, str]:
    """One valid, non-default value per variable (a new variable needs one here)."""
    for d in ("assets", "expectations"):
        (tmp / d).mkdir()
    return {
        "EAGLE3_SGLANG_URL": "http://gpu-1:30000,http://gpu-2:30000",
        "SGLANG_API_KEY": "sk-contract-test",
        "EAGLE3_MODEL": "qwen3",
        "EAGLE3_TOKENIZER": "org/tokenizer",
        "EAGLE3_SERVED_MODEL": "/models/qwen3-ft",
        "EAGLE3_ASSETS_DIR": str(tmp / "assets"),
        "EAGLE3_DATA_DIR": str(tmp / "data"),
        "EAGLE3_WORK_DIR": str(tmp / "work"),
        "EAGLE3_EXPECTATIONS_DIR": str(tmp / "expectations"),
        "EAGLE3_ENDPOINT_WAIT_S": "5",
        "EAGLE3_STREAM": "0",
        "TOKENIZERS_PARALLELISM": "0",
        "EAGLE3_STALL_TIMEOUT_S": "7",
        "EAGLE3_REQUEST_DEADLINE_S": "5400",
        "EAGLE3_ALLOW_OLD_SGLANG": "1",
        "EAGLE3_CONTEXT_OVERFLOW": "skip",
        "EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS": "3",
        "EAGLE3_GX_KEEP_VALIDATIONS": "5",
        "EAGLE3_N_SHARDS": "9",
        "EAGLE3_NIGHTLY_CRON": "5 3 * * *",
        "EAGLE3_NIGHTLY_TZ": "Europe/Paris",
        "EAGLE3_SNAPSHOT_MAX_AGE": "2h",
        "EAGLE3_SNAPSHOT_RETENTION": "3",
        "EAGLE3_SENSOR_INTERVAL_S": "7",
        "EAGLE3_EXECUTOR": "in_process",
        "EAGLE3_TRAIN_ACCEPTANCE": "1",
        "DAGSTER_HOME": str(tmp / "home"),
    }


def test_every_configuration_page_row_is_one_settings_field_and_back(tmp_path):
    documented = documented_variables()
    read = variables_read_by_settings()
    assert not read - set(documented), (
        f"read by Settings.from_env but not on the configuration page: {read - set(documented)}"
    )
    assert not set(documented) - read, f"on the configuration page but never read: {set(documented) - read}"

    values = samples(tmp_path)
    assert set(values) == read, f"tests need one sample value per variable: {read ^ set(values)}"
    pinned = {"EAGLE3_WORK_DIR": values["EAGLE3_WORK_DIR"]}  # else the work dir follows the data dir
    base = Settings.from_env(pinned)
    field_of: dict[str, str] = {}
    for var, value in values.items():
        changed = Settings.from_env({**pinned, var: value})
        if var == "EAGLE3_WORK_DIR":
            changed, base_ = Settings.from_env({var: value}), Settings.from_env({})
        else:
            base_ = base
        diff = {f.name for f in fields(Settings) if getattr(changed, f.name) != getattr(base_, f.name)}
        diff -= set(derived_fields())
        assert len(diff) == 1, f"{var} should set exactly one Settings field, it changes {sorted(diff)}"
        field_of[var] = diff.pop()
    # the page names the field each variable sets, and it is the one the variable changes
    for var, field in field_of.items():
        assert f"| `{field}` |" in documented[var], f"{var} sets Settings.{field}, its row says {documented[var]}"
    # and every Settings field is set by exactly one documented variable (or derived from one)
    by_field = sorted(field_of.values())
    assert len(by_field) == len(set(by_field)), field_of
    assert set(by_field) | set(derived_fields()) == {f.name for f in fields(Settings)}, (
        f"Settings fields without a documented variable: {({f.name for f in fields(Settings)} - set(by_field)) - set(derived_fields())}"
    )


def test_each_setting_is_declared_by_exactly_one_section_model():
    """One typed model per section declares its settings; `Settings` is their union plus what is derived from them."""
    declared = [f.name for section in SETTINGS_SECTIONS for f in fields(section)]
    assert len(declared) == len(set(declared)), "a setting declared by two sections"
    assert set(declared) == {f.name for f, _ in setting_fields()}
    assert {f.name for f in fields(Settings)} == set(declared) | set(derived_fields())
    # the reference page lists the sections in this order, each variable under the model that declares it
    page = (PROJECT_ROOT / "docs" / "reference" / "configuration.md").read_text()
    headings = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS)
    for f, spec in setting_fields():
        under = page.split(f"### `{spec.env}`", 1)[0].rsplit("\n## ", 1)[1].splitlines()[0]
        assert under == section_of(f.name), (spec.env, under)


def test_one_parser_for_endpoint_lists(kimi_profile):
    raw = " http://gpu-1:30000/ , http://gpu-2:30000,"
    want = ("http://gpu-1:30000", "http://gpu-2:30000")
    assert Settings.from_env({"EAGLE3_SGLANG_URL": raw}).sglang_urls == want
    assert SGLangFleet(urls=raw).endpoints() == want
    assert GenerationConfig.from_profile(kimi_profile, raw).endpoints == want
    assert GenerationConfig.from_profile(kimi_profile, list(want)).endpoints == want

    bad = "http://gpu-1:30000,ftp://user:hunter2@gpu-2:21/x?token=abc"
    msgs = []
    with pytest.raises(SettingsError) as e1:
        Settings.from_env({"EAGLE3_SGLANG_URL": bad})
    msgs.append(str(e1.value))
    with pytest.raises(ValueError) as e2:
        SGLangFleet(urls=bad).endpoints()
    msgs.append(str(e2.value))
    with pytest.raises(ValueError) as e3:
        GenerationConfig.from_profile(kimi_profile, bad)
    msgs.append(str(e3.value))
    for msg, source in zip(msgs, ("EAGLE3_SGLANG_URL", "sglang resource", "GenerationConfig"), strict=True):
        # the same rule and wording everywhere, naming where the list came from; no credentials echoed
        assert source in msg and "must be comma-separated http(s)://host:port URLs, got 'ftp://gpu-2:21/x'" in msg
        assert "hunter2" not in msg and "abc" not in msg


def test_the_api_key_is_read_by_the_settings_and_handed_over_masked(kimi_profile):
    key = "sk-do-not-print-4f1a"
    s = Settings.from_env({"SGLANG_API_KEY": key})
    overrides = deployment_fields(s)
    cfg = generation_config(kimi_profile, "http://h:1", s, {})
    assert cfg.api_key is not None and cfg.api_key.reveal() == key
    for text in (repr(s), str(s), repr(cfg), str(cfg), f"{cfg.api_key}", repr(overrides)):
        assert key not in text
    assert Settings.from_env({}).sglang_api_key is None and "api_key" not in deployment_fields(Settings.from_env({}))


def test_domain_functions_take_their_values_as_parameters(tmp_path, monkeypatch):
    # a broken environment must not matter to them: they never read the settings themselves
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(tmp_path / "missing"))
    monkeypatch.setenv("EAGLE3_WORK_DIR", str(tmp_path / "w"))
    with pytest.raises(ProfileError, match="pass models_dir"):
        load_profile("kimi-k2.5")
    assert load_profile("kimi-k2.5", PROJECT_ROOT / "assets" / "models").name == "kimi-k2.5"
    remote = data_root("memory://contract/data") / "generations" / "shard=0001"
    with pytest.raises(ValueError, match="needs a local lock_dir"):
        lock_path_for(remote, None)
    assert lock_path_for(remote, tmp_path / "locks").parent == tmp_path / "locks"
    with pytest.raises(TypeError):
        GenerationConfig.from_profile(load_profile("qwen3", PROJECT_ROOT / "assets" / "models"))  # type: ignore[call-arg]


def test_the_url_is_configured_only_when_the_variable_names_one():
    # the resources bind `sglang.urls` only when it is configured; else the demo's simulator or the default
    assert not Settings.from_env({}).sglang_url_configured
    blanks = Settings.from_env({"EAGLE3_SGLANG_URL": " , "})
    assert blanks.sglang_urls == ("http://127.0.0.1:30000",) and not blanks.sglang_url_configured
    assert Settings.from_env({"EAGLE3_SGLANG_URL": "http://127.0.0.1:30000"}).sglang_url_configured


def test_the_url_list_is_parsed_once_and_handed_on_typed(kimi_profile):
    s = Settings.from_env({"EAGLE3_SGLANG_URL": "http://gpu-1:30000/, http://gpu-2:30000"})
    assert isinstance(s.sglang_urls, Endpoints) and parse_endpoint_urls(s.sglang_urls) is s.sglang_urls
    cfg = generation_config(kimi_profile, s.sglang_urls, s, {})
    assert cfg.endpoints is s.sglang_urls and s.sglang_urls.as_text() == "http://gpu-1:30000,http://gpu-2:30000"


def test_each_generation_field_arrives_by_one_route(kimi_profile):
    s = Settings.from_env({"EAGLE3_STREAM": "0", "EAGLE3_STALL_TIMEOUT_S": "7", "SGLANG_API_KEY": "sk-route"})
    urls = ("http://h:1",)
    unset = generation_config(kimi_profile, urls, s, SGLangFleet().generation_fields())
    assert (unset.stream, unset.stall_timeout_s, unset.api_key is not None) == (False, 7.0, True)
    run = generation_config(kimi_profile, urls, s, SGLangFleet(stream=True).generation_fields())
    assert (run.stream, run.stall_timeout_s) == (True, 7.0)  # the run's resource value wins over the setting
    plain = generation_config(kimi_profile, urls, Settings.from_env({}), {})
    assert (plain.stream, plain.stall_timeout_s, plain.compact_after_chunks) == (True, 300.0, 8)
    assert plain.request_deadline_s == 10800.0  # the setting reaches the client; unset, the default
    deadline = Settings.from_env({"EAGLE3_REQUEST_DEADLINE_S": "5400"})
    assert generation_config(kimi_profile, urls, deadline, {}).request_deadline_s == 5400.0
    never = Settings.from_env({"EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS": "0"})
    assert generation_config(kimi_profile, urls, never, {}).compact_after_chunks is None
    with pytest.raises(TypeError, match="given by two routes: api_key"):
        generation_config(kimi_profile, urls, s, {}, api_key=None)
    with pytest.raises(TypeError, match="given by two routes: stream"):
        generation_config(kimi_profile, urls, s, {"stream": None}, stream=True)


def test_the_settings_are_read_once_and_again_when_a_variable_changes(tmp_path, monkeypatch):
    from eagle3_dagster.config import reset_settings, settings

    assets = tmp_path / "assets"
    assets.mkdir()
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    first = settings()
    assert settings() is first  # one parsed object for every caller
    monkeypatch.setenv("EAGLE3_N_SHARDS", "3")
    assert settings().n_shards == 3 and settings() is not first  # a changed variable is read again
    assets.rmdir()
    assert settings().assets_dir == assets  # nothing changed in the environment: the cached object
    reset_settings()
    with pytest.raises(SettingsError, match="EAGLE3_ASSETS_DIR must be an existing directory"):
        settings()
    monkeypatch.setenv("EAGLE3_N_SHARDS", "abc")
    with pytest.raises(SettingsError, match="EAGLE3_N_SHARDS must be an integer >= 1, got 'abc'"):
        settings()  # a bad value is refused on every call, never cached
