"""The settings contract: the generated configuration page <-> Settings fields, one endpoint-list parser, the
API key as a Secret, and domain functions without a global fallback (their callers pass the values)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import fields
from pathlib import Path

import pytest

from eagle3_dagster.config import (
    MAX_N_SHARDS,
    PROJECT_ROOT,
    SECTION_TYPES,
    SECTIONS,
    SETTINGS_SECTIONS,
    Settings,
    SettingsError,
    derived_fields,
    setting_fields,
)
from eagle3_dagster.devtools.docs_gen import variables_read_by_settings
from eagle3_dagster.generate import GenerationConfig
from eagle3_dagster.generate.config import deployment_fields, generation_config
from eagle3_dagster.generate.store import lock_path_for
from eagle3_dagster.orchestration.resources import PipelineSettings, SGLangFleet, resources_from_settings
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


def leaves(s: Settings) -> dict[str, object]:
    """Every setting of `s` by where a caller finds it: `fleet.stall_timeout_s` -> its value."""
    return {
        f"{name}.{f.name}": getattr(getattr(s, name), f.name)
        for name in SECTION_TYPES
        for f in fields(SECTION_TYPES[name])
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
    base = leaves(Settings.from_env(pinned))
    field_of: dict[str, str] = {}
    for var, value in values.items():
        changed = Settings.from_env({**pinned, var: value})
        base_ = leaves(Settings.from_env({})) if var == "EAGLE3_WORK_DIR" else base
        if var == "EAGLE3_WORK_DIR":
            changed = Settings.from_env({var: value})
        diff = {path for path, v in leaves(changed).items() if v != base_[path]}
        assert len(diff) == 1, f"{var} should set exactly one setting, it changes {sorted(diff)}"
        field_of[var] = diff.pop()
        assert var in changed.configured  # and the settings know the user set it
    # the page names the setting each variable sets, and it is the one the variable changes
    for var, path in field_of.items():
        assert f"| `{path}` |" in documented[var], f"{var} sets Settings.{path}, its row says {documented[var]}"
    # and every setting is set by exactly one documented variable
    by_field = sorted(field_of.values())
    assert len(by_field) == len(set(by_field)), field_of
    assert set(by_field) == set(base), f"settings without a documented variable: {set(base) - set(by_field)}"


def test_each_setting_is_declared_by_exactly_one_section_model():
    """One typed model per section declares its settings; `Settings` is the sections plus what is derived."""
    assert tuple(SECTION_TYPES.values()) == SETTINGS_SECTIONS
    assert {f.name for f in fields(Settings)} == set(SECTION_TYPES) | set(derived_fields())
    assert [d.path for d in setting_fields()] == list(leaves(Settings()))
    # the reference page lists the sections in this order, each variable under the model that declares it
    page = (PROJECT_ROOT / "docs" / "reference" / "configuration.md").read_text()
    headings = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS)
    for d in setting_fields():
        under = page.split(f"### `{d.spec.env}`", 1)[0].rsplit("\n## ", 1)[1].splitlines()[0]
        assert under == d.title, (d.spec.env, under)
        assert f"- allowed: {' '.join(d.spec.allowed.split())}" in page.split(f"### `{d.spec.env}`", 1)[1]


def test_every_default_is_concrete_and_has_one_home():
    """A setting's default is its value (None only where None is a value of its own, and the page says which);
    GenerationConfig's and the resources' defaults of the same values are read from the declarations."""
    for d in setting_fields():
        assert d.default is not None or d.spec.default_doc, f"{d.spec.env}: None without saying what it means"
    nones = {d.path for d in setting_fields() if d.default is None}
    assert nones == {"fleet.api_key", "model.served_model", "model.tokenizer_override"}, nones
    declared = leaves(Settings())
    generation = {f.name: f.default for f in fields(GenerationConfig)}
    for field, path in {
        "wait_for_endpoint_s": "fleet.wait_for_endpoint_s",
        "stream": "fleet.stream",
        "stall_timeout_s": "fleet.stall_timeout_s",
        "request_deadline_s": "fleet.request_deadline_s",
        "context_overflow": "fleet.context_overflow",
        "allow_old_server": "fleet.allow_old_server",
        "compact_after_chunks": "stages.compact_after_chunks",
    }.items():
        assert generation[field] == declared[path], field
        assert SGLangFleet.model_fields.get(field) is None or SGLangFleet.model_fields[field].default == declared[path]
    assert PipelineSettings.model_fields["model"].default == declared["model.name"]
    assert PipelineSettings.model_fields["assets_dir"].default == str(declared["storage.assets_dir"])


def test_a_section_built_in_code_is_held_to_the_declared_bounds():
    s = Settings()
    assert dataclasses.replace(s.shards, n_shards=MAX_N_SHARDS).n_shards == MAX_N_SHARDS
    for section, change, said in (
        (s.shards, {"n_shards": 0}, "EAGLE3_N_SHARDS must be an integer >= 1, got 0"),
        (s.shards, {"n_shards": MAX_N_SHARDS + 1}, "EAGLE3_N_SHARDS must be at most 4096"),
        (s.fleet, {"stall_timeout_s": 0.0}, "EAGLE3_STALL_TIMEOUT_S must be a number of seconds > 0, got 0.0"),
        (s.fleet, {"request_deadline_s": 5.0}, "EAGLE3_REQUEST_DEADLINE_S must be a number of seconds from 10 to"),
        (s.fleet, {"context_overflow": "trim"}, "EAGLE3_CONTEXT_OVERFLOW must be one of fit, skip, got 'trim'"),
        (s.fleet, {"stream": "yes"}, "EAGLE3_STREAM must be on or off"),
        (s.stages, {"snapshot_retention": 0}, "EAGLE3_SNAPSHOT_RETENTION must be an integer >= 1, got 0"),
        (s.dagster, {"executor": "celery"}, "EAGLE3_EXECUTOR must be one of multiprocess, in_process, k8s"),
    ):
        with pytest.raises(SettingsError, match=re.escape(said)):
            dataclasses.replace(section, **change)


def test_one_parser_for_endpoint_lists(kimi_profile):
    raw = " http://gpu-1:30000/ , http://gpu-2:30000,"
    want = ("http://gpu-1:30000", "http://gpu-2:30000")
    assert Settings.from_env({"EAGLE3_SGLANG_URL": raw}).fleet.urls == want
    assert SGLangFleet(urls=raw).endpoints(Settings().fleet.urls) == want
    assert GenerationConfig.from_profile(kimi_profile, raw).endpoints == want
    assert GenerationConfig.from_profile(kimi_profile, list(want)).endpoints == want

    bad = "http://gpu-1:30000,ftp://user:hunter2@gpu-2:21/x?token=abc"
    msgs = []
    with pytest.raises(SettingsError) as e1:
        Settings.from_env({"EAGLE3_SGLANG_URL": bad})
    msgs.append(str(e1.value))
    with pytest.raises(ValueError) as e2:
        SGLangFleet(urls=bad).endpoints(Settings().fleet.urls)
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
    assert Settings.from_env({}).fleet.api_key is None and "api_key" not in deployment_fields(Settings.from_env({}))


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
    assert not Settings.from_env({}).urls_configured
    blanks = Settings.from_env({"EAGLE3_SGLANG_URL": " , "})
    assert blanks.fleet.urls == ("http://127.0.0.1:30000",) and not blanks.urls_configured
    assert Settings.from_env({"EAGLE3_SGLANG_URL": "http://127.0.0.1:30000"}).urls_configured


def test_the_url_list_is_parsed_once_and_handed_on_typed(kimi_profile):
    s = Settings.from_env({"EAGLE3_SGLANG_URL": "http://gpu-1:30000/, http://gpu-2:30000"})
    assert isinstance(s.fleet.urls, Endpoints) and parse_endpoint_urls(s.fleet.urls) is s.fleet.urls
    cfg = generation_config(kimi_profile, s.fleet.urls, s, {})
    assert cfg.endpoints is s.fleet.urls and s.fleet.urls.as_text() == "http://gpu-1:30000,http://gpu-2:30000"


def test_each_generation_field_arrives_by_one_route(kimi_profile):
    s = Settings.from_env({"EAGLE3_STREAM": "0", "EAGLE3_STALL_TIMEOUT_S": "7", "SGLANG_API_KEY": "sk-route"})
    urls = ("http://h:1",)
    sglang = resources_from_settings(s)["sglang"]  # bound with the settings' values when the definitions are built
    bound_ = generation_config(kimi_profile, urls, s, sglang.generation_fields())
    assert (bound_.stream, bound_.stall_timeout_s, bound_.api_key is not None) == (False, 7.0, True)
    run = generation_config(kimi_profile, urls, s, {**sglang.generation_fields(), "stream": True})
    assert (run.stream, run.stall_timeout_s) == (True, 7.0)  # the run's resource value wins over the setting
    # a command without a resource (eagle3 plan, eagle3 drafters compare) generates with the settings' values
    cli = generation_config(kimi_profile, urls, s, {"max_new_tokens": 64})
    assert (cli.stream, cli.stall_timeout_s) == (False, 7.0)
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
    assert settings().shards.n_shards == 3 and settings() is not first  # a changed variable is read again
    assets.rmdir()
    assert settings().storage.assets_dir == assets  # nothing changed in the environment: the cached object
    reset_settings()
    with pytest.raises(SettingsError, match="EAGLE3_ASSETS_DIR must be an existing directory"):
        settings()
    monkeypatch.setenv("EAGLE3_N_SHARDS", "abc")
    with pytest.raises(SettingsError, match="EAGLE3_N_SHARDS must be an integer >= 1, got 'abc'"):
        settings()  # a bad value is refused on every call, never cached
