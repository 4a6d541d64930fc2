"""`eagle3` from a plain shell: the project's defaults (config.project_env_defaults) apply without make,
and a tokenizer that cannot load is one line naming the setting, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT, SHARED_TOKENIZERS_DIR, project_env_defaults

pytestmark = pytest.mark.integration

EAGLE3 = Path(sys.executable).parent / "eagle3"
MAKE_VARS = ("EAGLE3_TOKENIZER", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DAGSTER_HOME", "EAGLE3_MODEL")


def plain_shell_env(**extra: str) -> dict[str, str]:
    """What a newcomer's shell has: none of the variables the Makefile or the tests export."""
    env = {k: v for k, v in os.environ.items() if k not in MAKE_VARS and not k.startswith("PYTEST")}
    env.update(extra)
    return env


def test_defaults_name_the_shared_tokenizer_and_never_override_what_is_set() -> None:
    got = project_env_defaults({})
    assert got["EAGLE3_TOKENIZER"] == str(SHARED_TOKENIZERS_DIR / "kimi-k2.5")
    assert got["HF_HUB_OFFLINE"] == "1"
    assert got["DAGSTER_HOME"] == str(PROJECT_ROOT / ".dagster_home")
    assert project_env_defaults({"EAGLE3_MODEL": "qwen3"})["EAGLE3_TOKENIZER"] == str(SHARED_TOKENIZERS_DIR / "qwen3")
    # what the user exported wins, and a user's own tokenizer does not switch the hub offline
    assert project_env_defaults({"EAGLE3_TOKENIZER": "/x", "DAGSTER_HOME": "/h"}) == {}
    # a profile given as a YAML path has no shared folder: the profile's own tokenizer is used
    assert "EAGLE3_TOKENIZER" not in project_env_defaults({"EAGLE3_MODEL": "/somewhere/model.yaml"})


def test_makefile_defaults_agree_with_the_cli() -> None:
    # what the Makefile exports to its recipes, expanded by make itself
    shown = subprocess.run(
        ["make", "-s", "--eval", "show:;@echo $$EAGLE3_TOKENIZER $$HF_HUB_OFFLINE $$DAGSTER_HOME", "show"],
        cwd=PROJECT_ROOT,
        env=plain_shell_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    want = project_env_defaults({})
    assert [str(Path(shown[0]).resolve()), shown[1], shown[2]] == [
        str(Path(want["EAGLE3_TOKENIZER"]).resolve()),
        want["HF_HUB_OFFLINE"],
        want["DAGSTER_HOME"],
    ]


def test_render_works_from_a_plain_shell(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    out = tmp_path / "out.jsonl"
    r = subprocess.run(
        [str(EAGLE3), "render", "--model", "kimi-k2.5", str(src), str(out)],
        cwd=tmp_path,
        env=plain_shell_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    row = json.loads(out.read_text().splitlines()[0])
    assert row["input_ids"][-1] == 163606  # <think>: the shared Kimi-K2.5 tokenizer was found without make


def test_a_tokenizer_that_cannot_load_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    r = subprocess.run(
        [str(EAGLE3), "render", "--model", "kimi-k2.5", str(src), str(tmp_path / "o.jsonl")],
        cwd=tmp_path,
        env=plain_shell_env(EAGLE3_TOKENIZER="nobody/no-such-tokenizer", HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr, r.stderr
    assert "nobody/no-such-tokenizer" in r.stderr and "EAGLE3_TOKENIZER" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr


@pytest.mark.parametrize(
    ("cmd", "says"),
    [
        ("check", ["Validate every EAGLE3_* setting", "DAGSTER_HOME"]),
        ("ui", ["Start the Dagster UI", "the UI's port on 127.0.0.1 (default: 3000)"]),
    ],
)
def test_check_and_ui_explain_themselves_with_help(tmp_path: Path, cmd: str, says: list[str]) -> None:
    r = subprocess.run(
        [str(EAGLE3), cmd, "--help"], cwd=tmp_path, env=plain_shell_env(), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: eagle3 {cmd}") and all(s in " ".join(r.stdout.split()) for s in says), r.stdout


def test_check_with_an_unknown_argument_is_a_usage_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [str(EAGLE3), "check", "--nope"],
        cwd=tmp_path,
        env=plain_shell_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "unrecognized arguments: --nope" in r.stderr, r.stderr


def test_the_simulator_starts_from_a_plain_shell(tmp_path: Path) -> None:
    """`eagle3-sim --port P` as the Makefile's backfill hint says, without the Makefile's variables."""
    import time

    import httpx

    from eagle3_dagster.sim.process import free_port

    port = free_port()
    log = (tmp_path / "sim.log").open("wb")
    proc = subprocess.Popen(
        [str(EAGLE3.with_name("eagle3-sim")), "--port", str(port)],
        cwd=tmp_path,
        env=plain_shell_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "sim.log").read_text()[-2000:]
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
