"""The GPU lane (scripts/gpu-smoke.sh, docs/real-sglang.md) on a machine without a GPU, and its JSON summary
(eagle3_dagster.app.smoke) on real demo runs against the simulator with the Qwen3 profile."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from eagle3_dagster.app.smoke import SmokeSummary, smoke_summary
from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate.active import read_active_generations
from eagle3_dagster.sim.process import free_port

SCRIPT = PROJECT_ROOT / "scripts" / "gpu-smoke.sh"
DOCS = PROJECT_ROOT / "docs" / "real-sglang.md"
QWEN_TOKENIZER = (PROJECT_ROOT.parent / "shared" / "tokenizers" / "qwen3").resolve()
QWEN_THINK_END = 151668


def script_steps() -> list[str]:
    block = SCRIPT.read_text().split("STEPS=(\n", 1)[1].split("\n)\n", 1)[0]
    return [line.strip().strip('"').replace("\\$", "$") for line in block.splitlines() if line.strip()]


def documented_steps() -> list[str]:
    section = DOCS.read_text().split("\n## Steps\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1).strip() for m in re.finditer(r"^\d+\. (.+)$", section, flags=re.M)]


def test_the_scripts_steps_are_the_documented_ones():
    steps = script_steps()
    assert len(steps) == 6 and any("sglang.launch_server" in s for s in steps), steps
    assert documented_steps() == steps


def _run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "EAGLE3_GPU_MODEL_PATH"}
    full.update(GPU_SMOKE_WORK=str(tmp_path / "work"), GPU_VENV=str(tmp_path / "venv"), **env)
    return subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_without_cuda_it_exits_0_after_one_line_saying_what_it_would_do(tmp_path: Path):
    r = _run_script(tmp_path, NVIDIA_SMI=str(tmp_path / "no-nvidia-smi"))
    assert r.returncode == 0 and r.stderr == "", r
    [line] = r.stdout.splitlines()
    assert line.startswith("gpu-smoke: no CUDA GPU here") and "nothing done" in line
    for i, step in enumerate(documented_steps(), 1):
        assert f"{i}) {step}" in line
    assert not (tmp_path / "work").exists() and not (tmp_path / "venv").exists()  # nothing installed or started


@pytest.mark.integration
def test_on_a_gpu_machine_it_names_what_it_needs_before_installing_anything(tmp_path: Path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    r = _run_script(tmp_path, NVIDIA_SMI=str(fake))
    assert r.returncode == 1 and r.stdout == "", r
    assert "step 1/6" in r.stderr and "EAGLE3_GPU_MODEL_PATH is not set" in r.stderr and "Qwen3" in r.stderr
    r = _run_script(tmp_path, NVIDIA_SMI=str(fake), EAGLE3_GPU_MODEL_PATH=str(tmp_path))
    assert r.returncode == 1 and "has no config.json" in r.stderr, r
    assert not (tmp_path / "venv").exists()


def _demo(tmp_path: Path, *sim_args: str, shards: str) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_")}
    env.update(
        DAGSTER_HOME=str(tmp_path / "home"),
        EAGLE3_DATA_DIR=str(tmp_path / "data"),
        EAGLE3_MODEL="qwen3",
        EAGLE3_TOKENIZER=str(QWEN_TOKENIZER),
        HF_HUB_OFFLINE="1",
    )
    args = [f"--sim-arg={s}" for s in sim_args]
    subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.app.cli", "demo", "--shards", shards, *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        timeout=400,
    )
    return tmp_path / "data"


@pytest.mark.integration
@pytest.mark.full  # a whole demo for the GPU script's summary: `make test-full`
def test_the_summary_names_the_gate_that_failed(tmp_path: Path):
    """A server that drops </think> (the bug this product exists to catch): the JSON line says so."""
    data = _demo(tmp_path, "--mode", "drop-think-end", shards="0000")
    s = smoke_summary(data, QWEN_THINK_END)
    assert isinstance(s, SmokeSummary) and not s.success, s
    assert s.generated > 0 and s.think_end_present_rate == 0.0  # counted over the generations, published or not
    assert any(g.startswith("shard 0000 generations:think_end_present") for g in s.failed_gates), s.failed_gates
    assert s.spec_rows == 0 and s.drafter_ids == []  # no draft model: no speculative-decoding figures, none made up


def _check_summary_against_tables(summary: dict, data: Path) -> None:
    """The JSON line is the summary of the tables the run wrote, each figure recomputed from them."""
    s = smoke_summary(data, QWEN_THINK_END)
    assert summary == json.loads(s.json_line()) == json.loads(json.dumps(s.__dict__))  # one object, every field
    train = pl.concat([pl.read_parquet(f) for f in sorted((data / "training_samples").glob("shard=*/part-*.parquet"))])
    gens = pl.concat([read_active_generations(d) for d in sorted((data / "generations").glob("shard=*"))])
    assert s.success and s.failed_gates == [] and s.snapshot is not None, s
    assert s.rows == s.generated == train.height == gens.height > 10
    assert s.finish_reasons == dict(gens["finish_reason"].value_counts().iter_rows())
    with_think_end = sum(QWEN_THINK_END in ids for ids in gens["output_ids"].to_list())
    assert s.think_end_present_rate == pytest.approx(with_think_end / gens.height)
    flagged = int((~train["text_exact"]).sum())
    assert 0 < flagged < train.height  # the simulator split half the samples non-canonically
    assert s.non_canonical_rate == pytest.approx(flagged / train.height, abs=1e-6)
    assert s.output_tokens_per_s and s.ideal_tokens_per_s and s.ideal_tokens_per_s >= s.output_tokens_per_s
    assert s.fraction_of_ideal is not None and 0 < s.fraction_of_ideal <= 1


def _stand_in_env(tmp_path: Path) -> dict[str, str]:
    """A fake nvidia-smi and a stand-in venv whose `python -m sglang.launch_server` is eagle3-sim (qwen3 profile;
    SGLang's --speculative-* flags passed through), and the script's environment around them."""
    fake_smi = tmp_path / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    model = tmp_path / "Qwen3-stand-in"
    model.mkdir()
    for f in QWEN_TOKENIZER.iterdir():
        (model / f.name).symlink_to(f)
    (model / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    sim = Path(sys.executable).parent / "eagle3-sim"
    (venv_bin / "python").write_text(
        "#!/usr/bin/env bash\n"
        'case "$1 $2" in\n'
        '  "-m pip") exit 0 ;;\n'  # the install: nothing to do
        '  "-c import sys, torch"*) exit 0 ;;\n'  # torch.cuda.is_available()
        '  "-m sglang.launch_server")\n'
        "    spec=()\n"
        "    shift 2; while [ $# -gt 0 ]; do case $1 in --model-path) m=$2;; --host) h=$2;; --port) p=$2;;\n"
        "      --speculative-*) spec+=($1 $2);; esac; shift; done\n"
        f'    exec {sim} --model qwen3 --tokenizer "$m" --host "$h" --port "$p" --log-level WARNING "${{spec[@]}}" $SIM_ARGS ;;\n'
        "esac\n"
        "exit 9\n"
    )
    for f in (fake_smi, venv_bin / "python"):
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_")}
    env.update(
        NVIDIA_SMI=str(fake_smi),
        EAGLE3_GPU_MODEL_PATH=str(model),
        GPU_VENV=str(tmp_path / "venv"),
        GPU_SMOKE_WORK=str(tmp_path / "work"),
        GPU_SMOKE_PORT=str(free_port()),
        GPU_SMOKE_BUDGET_S="400",
        PROJECT_PY=sys.executable,
    )
    return env


@pytest.mark.integration
@pytest.mark.full  # the script's whole run (a demo behind a stand-in server): `make test-full`
def test_the_gpu_path_runs_end_to_end_with_the_simulator_standing_in_for_sglang(tmp_path: Path):
    """Steps 3-6 of the script for real (server start with a draft model, readiness wait, the demo, the JSON line,
    the stop), with a fake nvidia-smi and a stand-in venv whose `python -m sglang.launch_server` is eagle3-sim
    (qwen3 profile, speculating with SGLang's flags), a messy one: half its samples split non-canonically, 1 ms
    per token. (Without a draft model the script passes no --speculative-* flag: the summary's no-figures case
    is test_the_summary_names_the_gate_that_failed's.)"""
    env = _stand_in_env(tmp_path)
    env["SIM_ARGS"] = "--noncanonical-rate 0.5 --token-latency-ms 1"
    draft = tmp_path / "Qwen3-EAGLE3-stand-in"
    draft.mkdir()
    (draft / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    env["EAGLE3_GPU_DRAFT_MODEL_PATH"] = str(draft)
    port = int(env["GPU_SMOKE_PORT"])
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, (r.stderr[-3000:], (tmp_path / "work" / "demo.log").read_text()[-3000:])
    assert "--speculative-draft-model-path" in r.stderr  # the flags the server got, said once
    [line] = r.stdout.splitlines()
    summary = json.loads(line)
    assert summary["success"] and summary["failed_gates"] == [] and summary["rows"] == summary["generated"] > 10
    assert summary["think_end_present_rate"] == 1.0 and summary["finish_reasons"]
    assert summary["spec_rows"] == summary["generated"]
    assert len(summary["drafter_ids"]) == 1 and 1.0 < summary["spec_accept_length"] <= 4.0
    _check_summary_against_tables(summary, tmp_path / "work" / "data")
    said = [ln for ln in r.stderr.splitlines() if " step " in ln]
    assert [ln.split("step ", 1)[1].split(":", 1)[0] for ln in said] == [f"{i}/6" for i in range(1, 7)], said
    # the server is stopped: nothing answers on its port any more
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    # the check can fail: the same data dir judged as if its rows had come back without figures
    data = tmp_path / "work" / "data"
    for f in (data / "generations").glob("shard=*/part-*.parquet"):
        t = pl.read_parquet(f).with_columns(pl.lit(None, pl.Int64).alias("spec_verify_ct"))
        t.write_parquet(f)
    s = smoke_summary(data, QWEN_THINK_END, expect_drafter=True)
    assert not s.success and any(g.startswith("speculative decoding:") for g in s.failed_gates), s.failed_gates
