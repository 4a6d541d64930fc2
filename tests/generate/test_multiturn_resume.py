"""all_turns generation is resumable and incremental like any shard (generate/multiturn.py, store.py).

A generate_shard process over a shard of conversations is killed (SIGKILL) mid-shard; the rerun
replays every stored turn, re-sends at most the unflushed checkpoint batch and the requests that
were in flight, and ends with exactly what an uninterrupted run stores. A dataset edit at turn 2
of one conversation sends that conversation's turns 2.. again, and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from multiturn_worker import run

from eagle3_dagster.generate.multiturn import read_turn_rows
from eagle3_dagster.ingest.pipeline import combine_sources, ingest_source
from eagle3_dagster.ingest.spec import SourceSpec
from eagle3_dagster.sim.record import read_recorded
from eagle3_dagster.storage import write_frame_atomic
from eagle3_dagster.tokenize import tokenize_prompts
from eagle3_dagster.tokenize.render import PromptRenderer

pytestmark = pytest.mark.integration

WORKER = str(Path(__file__).with_name("multiturn_worker.py"))
FLUSH_N, IN_FLIGHT = 2, 4  # multiturn_worker.py's checkpoint batch and client window


def _inputs(data: Path, datasets_dir: Path, kimi_profile) -> None:
    for name, rel, fmt in (
        ("ultrachat", "ultrachat_200k_sample/ultrachat_200k_sample20.json", "ultrachat"),
        ("sharegpt", "sharegpt_v3_test/sharegpt_test.json", "sharegpt"),
    ):
        spec = SourceSpec(
            name=name, path=str(datasets_dir / rel), format=fmt, limit=4, regenerate="all_turns", max_turns=3
        )
        ingest_source(spec, data / "sources" / name, n_shards=1)
    combine_sources([data / "sources" / "ultrachat", data / "sources" / "sharegpt"], data / "prompts", n_shards=1)
    _tokenize(data, kimi_profile)


def _tokenize(data: Path, kimi_profile) -> None:
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
    tok, rejects = tokenize_prompts(prompts, _renderer(kimi_profile), max_new_tokens=512)
    assert rejects.height == 0
    write_frame_atomic(tok, data / "tokenized" / "part-0000.parquet")


_RENDERER: list[PromptRenderer] = []


def _renderer(kimi_profile) -> PromptRenderer:
    if not _RENDERER:
        _RENDERER.append(PromptRenderer(kimi_profile))
    return _RENDERER[0]


def _stored(data: Path) -> pl.DataFrame:
    return read_turn_rows(data / "generations")


def test_kill_mid_shard_resumes_and_edits_regenerate_only_later_turns(
    tmp_path, datasets_dir, kimi_profile, start_sim
) -> None:
    log = tmp_path / "requests.jsonl"
    sim = start_sim("--token-latency-ms", "4", "--tool-call-rate", "0", "--record-requests", str(log))
    data = tmp_path / "killed"
    _inputs(data, datasets_dir, kimi_profile)

    # 1. a worker process, killed once a few checkpoint batches of turns are stored
    proc = subprocess.Popen([sys.executable, WORKER, str(data), sim.url], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if (data / "generations" / "turns").exists() and _stored(data).height >= 3 * FLUSH_N:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the shard finished before it could be killed (make it bigger or slower)"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    stored = _stored(data)
    sent_before = [tuple(r["input_ids"]) for r in read_recorded(log)]
    assert stored.height >= 3 * FLUSH_N and len(sent_before) > stored.height

    # 2. the rerun replays what is stored and sends the rest
    turns = run(data, sim.url, FLUSH_N)
    sent_after = [tuple(r["input_ids"]) for r in read_recorded(log)][len(sent_before) :]
    stored_prompts = {tuple(p) for p in stored["prompt_ids"].to_list()}
    assert not stored_prompts & set(sent_after), "a stored turn was sent again"
    redone = set(sent_before) & set(sent_after)
    assert len(redone) <= FLUSH_N + IN_FLIGHT, redone  # the unflushed batch + what was in flight
    assert turns["reconciles"] and turns["turns_cached"] == stored.height
    assert turns["turns_sent"] == len(sent_after)

    # 3. exactly what an uninterrupted run stores
    clean = tmp_path / "clean"
    _inputs(clean, datasets_dir, kimi_profile)
    clean_turns = run(clean, sim.url, FLUSH_N)
    assert clean_turns == {**turns, "turns_cached": 0, "turns_sent": clean_turns["turns_sent"]}
    a = _stored(data).select("sample_id", "output_ids", "turn_index").sort("sample_id")
    b = _stored(clean).select("sample_id", "output_ids", "turn_index").sort("sample_id")
    assert a.equals(b)

    # 4. an unchanged night sends nothing
    n = len(read_recorded(log))
    again = run(data, sim.url, FLUSH_N)
    assert len(read_recorded(log)) == n and again["turns_sent"] == 0
    assert again["turns_cached"] == again["turns_regenerated"] == turns["turns_regenerated"]

    # 5. the dataset edits the user message before assistant turn 2 of one conversation that reached turn 3
    by_conv = (
        _stored(data).group_by("conversation_id").agg(pl.col("turn_index").max()).filter(pl.col("turn_index") >= 3)
    )
    cid = by_conv["conversation_id"][0]
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
    row = prompts.filter(pl.col("prompt_id") == cid).row(0, named=True)
    messages = json.loads(row["conversation"])
    positions = json.loads(row["regenerate"])["turns"]
    user_before_2 = max(i for i in range(positions[1]) if messages[i]["role"] == "user")
    messages[user_before_2] = {**messages[user_before_2], "content": "Edited: " + messages[user_before_2]["content"]}
    edited = prompts.with_columns(
        pl.when(pl.col("prompt_id") == cid)
        .then(pl.lit(json.dumps(messages, ensure_ascii=False)))
        .otherwise(pl.col("conversation"))
        .alias("conversation")
    )
    write_frame_atomic(edited, data / "prompts" / "prompts.parquet")
    n = len(read_recorded(log))
    edit = run(data, sim.url, FLUSH_N)
    new = [r["input_ids"] for r in read_recorded(log)][n:]
    assert edit["reconciles"]
    assert 1 <= len(new) <= 2 and edit["turns_sent"] == len(new)  # turn 2 (and 3 unless it ended at 2)
    assert "Edited: " in kimi_profile_decode(kimi_profile, new[0])
    # everything else replayed: every other conversation, and turn 1 of this one
    assert edit["turns_cached"] == turns["turns_regenerated"] - 2
    assert edit["turns_cached"] + edit["turns_sent"] == edit["turns_regenerated"]


def kimi_profile_decode(profile, ids) -> str:
    from eagle3_dagster.tokenize.loading import load_tokenizer

    return (
        _RENDERER[0].tokenizer.decode(ids, skip_special_tokens=False)
        if _RENDERER
        else load_tokenizer(profile.tokenizer).decode(ids, skip_special_tokens=False)
    )
