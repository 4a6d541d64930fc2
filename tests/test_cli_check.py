"""`eagle3 check` from a plain shell: every problem of every source YAML, missing source files, an
unwritable data dir and a dead endpoint, one line each naming file and field (or setting), exit 2; and what
a run would die on later: a model profile that is not there, a tokenizer that does not load, a source whose
first records do not fit its format, a misspelt setting, YAML key or profile key ("did you mean"), a server
of another model than the profile's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.sim.process import free_port, start_simulator

pytestmark = pytest.mark.integration

QWEN_ARGS = ("--model", "qwen3", "--tokenizer", str(PROJECT_ROOT.parent / "shared" / "tokenizers" / "qwen3"))


def _check(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.app.cli", "check", *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r, time.monotonic() - t0


def _setup(tmp_path: Path) -> tuple[dict[str, str], Path, str]:
    src = tmp_path / "assets" / "sources"
    src.mkdir(parents=True)
    (tmp_path / "assets" / "models").symlink_to(PROJECT_ROOT / "assets" / "models")
    (src / "good.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (src / "good.yaml").write_text("path: good.jsonl\n")
    (src / "twobad.yaml").write_text("path: good.jsonl\nlimit: -1\nmax_reject_rate: 2\n")
    (src / "gone.yaml").write_text("path: missing.jsonl\n")
    (src / "nopath.yaml").write_text("fromat: openai\n")
    (tmp_path / "a-file").write_text("not a folder\n")
    dead = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_") or k == "EAGLE3_TOKENIZER"}
    env.update(
        DAGSTER_HOME=str(tmp_path / "home"),
        EAGLE3_ASSETS_DIR=str(tmp_path / "assets"),
        EAGLE3_DATA_DIR=str(tmp_path / "a-file" / "data"),
        EAGLE3_WORK_DIR=str(tmp_path / "work"),
        EAGLE3_SGLANG_URL=dead,
        HF_HUB_OFFLINE="1",
    )
    return env, src, dead


def test_check_names_every_problem_in_one_line_each(tmp_path: Path):
    env, src, dead = _setup(tmp_path)
    r, took = _check(env)
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout, r.stderr
    errors = [ln.removeprefix("eagle3 check: error: ") for ln in r.stderr.splitlines() if " error: " in ln]
    known = next(e.split("known: ")[1] for e in errors if "unknown field" in e)
    assert sorted(errors) == sorted(
        [
            f"{src / 'gone.yaml'}: field 'path': file not found: {src / 'missing.jsonl'}; a relative path is read "
            f"from the YAML's folder ({src})",
            f"{src / 'nopath.yaml'}: unknown field(s) fromat (did you mean 'format'?); known: {known}",
            f"{src / 'nopath.yaml'}: missing field 'path'",
            f"{src / 'twobad.yaml'}: source 'twobad': limit must be a positive integer, got -1",
            f"{src / 'twobad.yaml'}: source 'twobad': max_reject_rate must be a number in [0, 1], got 2",
            f"EAGLE3_DATA_DIR {tmp_path / 'a-file' / 'data'}: {tmp_path / 'a-file'} is a file, not a folder; "
            "point EAGLE3_DATA_DIR at a folder you can write to",
            f"EAGLE3_SGLANG_URL {dead}: connection refused; no server there: start it, or fix EAGLE3_SGLANG_URL "
            "(unset, `eagle3 demo` starts its own simulator) (`eagle3 check --offline` skips this probe)",
        ]
    ), r.stderr
    assert r.stderr.splitlines()[-1] == "eagle3 check: 7 problem(s); nothing was written"
    assert not (tmp_path / "home").exists() and not (tmp_path / "work").exists()
    assert took < 60

    offline, _ = _check(env, "--offline")  # the same, without the endpoint probe
    assert offline.returncode == 2 and "EAGLE3_SGLANG_URL" not in offline.stderr, offline.stderr
    assert offline.stderr.splitlines()[-1] == "eagle3 check: 6 problem(s); nothing was written"


def _fixed(tmp_path: Path) -> dict[str, str]:
    """The settings of _setup with every problem but the endpoint fixed."""
    env, src, _ = _setup(tmp_path)
    for name in ("twobad", "gone", "nopath"):
        (src / f"{name}.yaml").unlink()
    env["EAGLE3_DATA_DIR"] = str(tmp_path / "data")
    return env


def test_check_is_ok_once_everything_is_fixed_and_offline_says_it_did_not_probe(tmp_path: Path):
    env = _fixed(tmp_path)
    with start_simulator(extra_args=QWEN_ARGS) as qwen:  # a server of another model: offline, not asked
        r, _ = _check({**env, "EAGLE3_SGLANG_URL": qwen.url}, "--offline")
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert "1 source(s) OK" in r.stdout and "endpoints not probed (--offline)" in r.stdout, r.stdout


def test_check_names_a_server_of_another_model_and_a_pin_lets_it_through_with_a_warning(tmp_path: Path):
    """The run refuses an endpoint whose /model_info names another model than the profile's; so does check,
    with the same words, before the first hour of a run is spent on ingest and tokenize."""
    env = _fixed(tmp_path)
    with start_simulator(extra_args=QWEN_ARGS) as qwen:  # a real Qwen3 server (the Qwen tokenizer) for Kimi
        env["EAGLE3_SGLANG_URL"] = qwen.url
        r, _ = _check(env)
        wrote = (tmp_path / "home").exists()
        pinned, _ = _check({**env, "EAGLE3_SERVED_MODEL": "Qwen/Qwen3-8B"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert _errors(r) == [
        f"EAGLE3_SGLANG_URL {qwen.url}: the endpoint serves another model: model_path 'Qwen/Qwen3-8B' (model_type "
        "'qwen3'), but the model profile kimi-k2.5 expects model_type 'kimi_k25'. Point the run at a server of that "
        "model, choose the profile of this one (EAGLE3_MODEL), or, if you mean to use this model, pin it: "
        "EAGLE3_SERVED_MODEL=Qwen/Qwen3-8B"
    ], r.stderr
    assert r.stderr.splitlines()[-1] == "eagle3 check: 1 problem(s); nothing was written" and not wrote

    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stderr.splitlines() == [
        f"eagle3 check: warning: EAGLE3_SGLANG_URL {qwen.url}: the endpoint serves model_path 'Qwen/Qwen3-8B' "
        "(model_type 'qwen3'): not the model_type 'kimi_k25' of the model profile kimi-k2.5, used because "
        "EAGLE3_SERVED_MODEL pins it"
    ]
    assert "instance ready" in pinned.stdout and (tmp_path / "home" / "dagster.yaml").exists()


def _errors(r: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln.removeprefix("eagle3 check: error: ") for ln in r.stderr.splitlines() if " error: " in ln]


def test_check_refuses_what_the_run_would_die_on(tmp_path: Path):
    env, src, _ = _setup(tmp_path)
    for name in ("twobad", "gone", "nopath"):
        (src / f"{name}.yaml").unlink()
    env["EAGLE3_DATA_DIR"] = str(tmp_path / "data")

    # a misspelt setting: refused first, naming what was meant (else EAGLE3_N_SHARDS keeps its default, silently)
    r, _ = _check({**env, "EAGLE3_N_SHARD": "2"}, "--offline")
    assert r.returncode == 2 and _errors(r) == [
        "EAGLE3_N_SHARD is not a setting (did you mean 'EAGLE3_N_SHARDS'?): it would be ignored"
    ], r.stderr

    # a source whose records are OpenAI messages, declared as alpaca; a path written from the project's folder
    # (the demo's prompts, as the repository names them); a model name that names no profile
    (src / "wrong.yaml").write_text("path: good.jsonl\nformat: alpaca\n")
    (src / "rooted.yaml").write_text("path: assets/sources/data/demo_prompts.jsonl\n")
    demo = PROJECT_ROOT / "assets/sources/data/demo_prompts.jsonl"
    r, _ = _check({**env, "EAGLE3_MODEL": "kimi"}, "--offline")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert sorted(_errors(r)) == sorted(
        [
            f"{src / 'rooted.yaml'}: field 'path': file not found: {src / 'assets/sources/data/demo_prompts.jsonl'}; "
            f"a relative path is read from the YAML's folder ({src}), not from {PROJECT_ROOT}: write "
            f"{os.path.relpath(demo, src)!r} (or an absolute path)",
            f"{src / 'wrong.yaml'}: field 'format': none of the first 1 record(s) makes a prompt as format 'alpaca' "
            "(1 rejected as missing_field: field 'instruction' is missing or null); the first record looks like format "
            "'openai'",
            f"EAGLE3_MODEL 'kimi': model profile 'kimi' not found at {tmp_path / 'assets/models/kimi.yaml'} (did you "
            "mean 'kimi-k2.5'?) (available: kimi-k2.5, qwen3)",
        ]
    ), r.stderr
    assert not (tmp_path / "home").exists()

    # a tokenizer folder that holds no tokenizer: the whole reason, on one line
    for name in ("wrong", "rooted"):
        (src / f"{name}.yaml").unlink()
    r, _ = _check({**env, "EAGLE3_TOKENIZER": str(tmp_path / "assets")}, "--offline")
    [tok] = _errors(r)
    assert r.returncode == 2 and tok.startswith(
        f"EAGLE3_TOKENIZER {str(tmp_path / 'assets')!r} does not load: {tmp_path / 'assets'}: cannot load tokenizer: "
    ), tok
    assert tok.endswith("to convert a slow tokenizer to a fast one."), tok  # not cut at its first line
    assert not (tmp_path / "home").exists()


def test_a_misspelt_profile_key_is_named_with_what_was_meant(tmp_path: Path):
    from eagle3_dagster.profiles import ProfileError, load_profile

    text = (PROJECT_ROOT / "assets" / "models" / "qwen3.yaml").read_text().replace("vocab_size:", "vocab_sise:")
    (tmp_path / "typo.yaml").write_text(text)
    with pytest.raises(ProfileError) as e:
        load_profile(tmp_path / "typo.yaml")
    said = str(e.value)
    assert said.startswith(
        f"{tmp_path / 'typo.yaml'}: unknown field(s) vocab_sise (did you mean 'vocab_size'?); known: "
    )
    assert said.endswith("; missing field(s) vocab_size")


def test_a_demo_or_backfill_names_a_server_of_another_model_before_ingest(tmp_path: Path):
    """`eagle3 demo` / `eagle3 backfill` against a configured fleet print app/checkup.dead_endpoint_lines before
    ingest and tokenize: a server of another model is one of them (in process: the point is the line)."""
    from eagle3_dagster.app.checkup import dead_endpoint_lines
    from eagle3_dagster.config import Settings

    with start_simulator(extra_args=QWEN_ARGS) as qwen:
        env = {"EAGLE3_SGLANG_URL": qwen.url, "EAGLE3_DATA_DIR": str(tmp_path / "data")}
        [line] = dead_endpoint_lines(Settings.from_env(env))
        pinned = dead_endpoint_lines(Settings.from_env({**env, "EAGLE3_SERVED_MODEL": "Qwen/Qwen3-8B"}))
    assert line.startswith(f"EAGLE3_SGLANG_URL {qwen.url}: the endpoint serves another model: "), line
    assert pinned == []
