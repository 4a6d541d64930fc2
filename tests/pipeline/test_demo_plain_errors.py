"""Conditions a newcomer meets in `eagle3 demo` (a source file that is not there, a data dir that cannot be
written) end in one line naming the cause and the fix, a non-zero exit and no Python traceback."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from proc_helpers import EAGLE3, command_env

from eagle3_dagster.config import PROJECT_ROOT

pytestmark = pytest.mark.integration


def _demo(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [EAGLE3, "demo", "--shards", "0000"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    return r, time.monotonic() - t0


def test_a_data_dir_that_cannot_be_written_is_one_line(tmp_path: Path):
    (tmp_path / "a-file").write_text("in the way\n")
    env = command_env(tmp_path)
    env["EAGLE3_DATA_DIR"] = str(tmp_path / "a-file" / "data")
    r, took = _demo(env)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, r.stderr
    assert r.stderr.splitlines() == [
        f"eagle3 demo: error: cannot write {tmp_path / 'a-file' / 'data'}: Not a directory; EAGLE3_DATA_DIR and "
        "EAGLE3_WORK_DIR must be folders you can write to, with free space (`eagle3 check` tests them)"
    ]
    assert r.stdout.splitlines()[-1] == "result:     FAILED" and took < 60


def test_a_missing_source_file_is_named_without_a_stack_trace(tmp_path: Path):
    src = tmp_path / "assets" / "sources"
    src.mkdir(parents=True)
    (tmp_path / "assets" / "models").symlink_to(PROJECT_ROOT / "assets" / "models")
    (src / "lost.yaml").write_text("path: nowhere.jsonl\n")
    env = command_env(tmp_path)
    env["EAGLE3_ASSETS_DIR"] = str(tmp_path / "assets")
    r, _ = _demo(env)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out and "Stack Trace" not in out, out[-4000:]
    assert f"error:      ingest source__lost: source 'lost': file not found: {src / 'nowhere.jsonl'}" in out
    [nxt] = [ln for ln in out.splitlines() if ln.startswith("next:")]
    assert "fix the source or setting named above" in nxt


def test_a_model_that_names_no_profile_is_named_not_blamed_on_the_tokenizer(tmp_path: Path):
    env = {**command_env(tmp_path), "EAGLE3_MODEL": "kimi"}
    r, took = _demo(env)
    profile = PROJECT_ROOT / "assets" / "models" / "kimi.yaml"
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"eagle3 demo: error: model profile 'kimi' not found at {profile} (did you mean 'kimi-k2.5'?) "
        "(available: kimi-k2.5, qwen3)"
    ], r.stderr
    assert "simulator" not in r.stdout and took < 60  # refused before anything started


def test_a_tokenizer_that_does_not_load_is_named_in_one_whole_line(tmp_path: Path):
    empty = tmp_path / "not-a-tokenizer"
    empty.mkdir()
    r, _ = _demo({**command_env(tmp_path), "EAGLE3_TOKENIZER": str(empty)})
    first, hint = r.stderr.splitlines()
    assert r.returncode == 2 and first.startswith(
        f"eagle3 demo: error: TokenizerLoadError: {empty}: cannot load tokenizer: ValueError: "
    ), r.stderr
    assert first.endswith("to convert a slow tokenizer to a fast one."), first  # the reason whole, not its first line
    assert hint.startswith("eagle3 demo: the tokenizer comes from EAGLE3_TOKENIZER")
