"""Reports a user reads (sample preview, histograms) and `eagle3 inspect` on a real Parquet shard."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import polars as pl
import pytest
from quality_helpers import EXPECTATIONS_DIR, generation_rows, tokenized_rows

from eagle3_dagster import schemas
from eagle3_dagster.app.cli import main as eagle3
from eagle3_dagster.quality import generation_features, run_gate, write_gate_result
from eagle3_dagster.report.previews import histograms_markdown, sample_preview_markdown
from eagle3_dagster.storage import shard_dir, write_frame_atomic

TOOL = ("functions.get_weather:0", '{"city": "Paris"}')


@pytest.fixture(scope="module")
def shard(kimi):
    tokenized = tokenized_rows(kimi, {"p0": "What is 2+2?", "p1": "Weather in Paris?"})
    gens = generation_rows(
        [
            dict(
                sample_id="s-plain", prompt_id="p0", output_ids=kimi.output("Two plus two is four.", "The answer is 4.")
            ),
            dict(sample_id="s-tool", prompt_id="p1", output_ids=kimi.output("I need the weather tool.", "", tool=TOOL)),
            dict(
                sample_id="s-broken",
                prompt_id="p0",
                output_ids=kimi.output("Hmm, thinking", "", think_end=False, eot=False),
                finish_reason="length",
            ),
        ]
    )
    return gens, tokenized


def test_sample_preview_shows_split_and_tool_calls(shard, kimi_tokenizer, kimi_profile):
    gens, tokenized = shard
    md = sample_preview_markdown(gens, tokenized, kimi_tokenizer, kimi_profile, n=3)
    plain, tool, broken = md.split("#### ")[1:]
    assert "think-end 163607 at position **6**" in plain
    assert "Two plus two is four." in plain and "The answer is 4." in plain
    assert "<|im_assistant|>assistant<|im_middle|><think>" in plain  # the prompt tail it continued
    assert "`functions.get_weather:0`" in tool and '{"city": "Paris"}' in tool
    assert "position **MISSING**" in broken and "finish_reason `length`" in broken
    assert sample_preview_markdown(gens, tokenized, kimi_tokenizer, kimi_profile, n=1).count("#### ") == 1


def test_preview_fences_cannot_be_broken_by_model_text(kimi, kimi_tokenizer, kimi_profile):
    gens = generation_rows([dict(sample_id="s", prompt_id="p", output_ids=kimi.output("r", "```\n# heading\n```"))])
    md = sample_preview_markdown(gens, None, kimi_tokenizer, kimi_profile)
    assert "````text\n```\n# heading\n```\n````" in md


def test_histograms_markdown(shard, kimi_profile):
    gens, tokenized = shard
    f = generation_features(gens, tokenized, kimi_profile)
    md = histograms_markdown(f, ["output_len", "think_end_pos", "finish_reason"])
    assert "**output_len** — n=3 nulls=0" in md
    assert "**think_end_pos** — n=2 nulls=1" in md
    assert re.search(r"stop \|\s+2 \|\s+66\.7%", md)
    # every numeric row is "label | count | bar", and the counts add up to the non-null values
    block = md.split("**output_len**")[1].split("```text\n")[1].split("```")[0]
    assert sum(int(line.split("|")[1]) for line in block.strip().splitlines()) == 3


def test_histogram_bins_are_exact_for_integers():
    md = histograms_markdown(pl.DataFrame({"x": list(range(100))}), ["x"], bins=10)
    rows = md.split("```text\n")[1].split("```")[0].strip().splitlines()
    assert rows[0].split("|")[0].strip() == "[0, 9]" and rows[-1].split("|")[0].strip() == "[90, 99]"
    assert all(int(r.split("|")[1]) == 10 for r in rows)


def _stored_shard(data, shard) -> None:
    """Shard 2's generations and tokenized prompts in `data`, as the pipeline stores them."""
    gens, tokenized = shard
    write_frame_atomic(gens, shard_dir(data, "generations", 2) / "part-0000.parquet", schema=schemas.GENERATIONS)
    write_frame_atomic(
        tokenized, shard_dir(data, "tokenized_prompts", 2) / "part-0000.parquet", schema=schemas.TOKENIZED_PROMPTS
    )


@pytest.mark.integration
def test_inspect_into_a_pipe_its_reader_closed_ends_without_a_traceback(shard, kimi_profile, tmp_path):
    """`eagle3 inspect | head`: the reader goes away early; the command stops writing, quietly, with the exit code
    of a command killed by SIGPIPE (141), never a BrokenPipeError traceback."""
    _stored_shard(tmp_path / "data", shard)
    env = {**os.environ, "EAGLE3_TOKENIZER": kimi_profile.tokenizer, "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "eagle3_dagster.app.cli",
        "inspect",
        "--shard",
        "2",
        "--data-dir",
        str(tmp_path / "data"),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `head` does once it has its lines: every later write meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


def test_inspect_prints_preview_and_stored_gate(shard, kimi_profile, kimi_tokenizer, tmp_path, capsys, monkeypatch):
    gens, tokenized = shard
    data = tmp_path / "data"
    write_frame_atomic(gens, shard_dir(data, "generations", 2) / "part-0000.parquet", schema=schemas.GENERATIONS)
    write_frame_atomic(
        tokenized, shard_dir(data, "tokenized_prompts", 2) / "part-0000.parquet", schema=schemas.TOKENIZED_PROMPTS
    )
    res = run_gate(
        "generations",
        generation_features(gens, tokenized, kimi_profile, kimi_tokenizer),
        expectations_dir=EXPECTATIONS_DIR,
        context_dir=data / "gx",
        profile=kimi_profile,
    )
    write_gate_result(data, "generations", 2, res)
    monkeypatch.setenv("EAGLE3_TOKENIZER", kimi_profile.tokenizer)
    assert eagle3(["inspect", "--shard", "2", "--data-dir", str(data), "--model", "kimi-k2.5", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("#### ") == 2 and "Two plus two is four." in out
    assert "gate `generations`: FAILED" in out
    assert "`s-broken`: 163607 present" in out
    assert "gate `prompts`: no stored result" in out
    assert eagle3(["inspect", "--shard", "2", "--data-dir", str(data), "-n", "0", "--histograms"]) == 0
    out = capsys.readouterr().out
    assert "**reasoning_len** — n=2 nulls=1" in out and "**prompt_len**" in out


def test_inspect_reports_a_missing_shard(tmp_path, capsys):
    assert eagle3(["inspect", "--shard", "7", "--data-dir", str(tmp_path)]) == 1
    assert "no generations" in capsys.readouterr().err
