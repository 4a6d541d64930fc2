"""EAGLE3_TRAIN_ACCEPTANCE: each training row's drafter acceptance in the training table and in the
`input_ids` + `loss_mask` export, read by SpecForge 0.2.0's own online loader exactly as before.

Real parts: the demo prompts rendered with the real Kimi tokenizer, generated over HTTP by an eagle3-sim
that speculates (sim/speculative.py), parsed, built and published by the snapshot code.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import polars as pl
import pytest

from eagle3_dagster.config import PROJECT_ROOT, Settings
from eagle3_dagster.generate import GenerationConfig, generate_shard, read_generations
from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs
from eagle3_dagster.publish.export import SPECFORGE_FILE, SPECFORGE_TEMPLATES, exporters_for
from eagle3_dagster.publish.snapshot import build_snapshot
from eagle3_dagster.schemas import TRAINING_SAMPLES
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.storage import write_frame_atomic
from eagle3_dagster.tokenize import PromptRenderer, tokenize_prompts
from eagle3_dagster.train import build_training_samples
from eagle3_dagster.train.conversations import parse_generations
from eagle3_dagster.train.samples import ACCEPTANCE_COLUMNS, with_acceptance

pytestmark = pytest.mark.integration

SPEC = ("--speculative-draft-model-path", "test/kimi-eagle3", "--speculative-num-draft-tokens", "4")


@pytest.fixture(scope="module")
def built(tmp_path_factory, kimi_profile):
    tmp = tmp_path_factory.mktemp("acc")
    [spec] = [s for s in load_source_specs(PROJECT_ROOT / "assets" / "sources") if s.name == "demo"]
    ingest_source(replace(spec, limit=10), tmp / "sources" / "demo", n_shards=1)
    combine_sources([tmp / "sources" / "demo"], tmp / "prompts", n_shards=1)
    prompts = pl.read_parquet(tmp / "prompts" / "prompts.parquet")
    renderer = PromptRenderer(kimi_profile)
    tokenized, _ = tokenize_prompts(prompts, renderer, max_new_tokens=512)
    args = ["--model", kimi_profile.name, "--tokenizer", kimi_profile.tokenizer, "--log-level", "WARNING", *SPEC]
    with start_simulator(extra_args=args) as sim:
        cfg = GenerationConfig.from_profile(kimi_profile, (sim.url,), max_new_tokens=512)
        generate_shard(tokenized, tmp / "generations", cfg)
    gens = read_generations(tmp / "generations")
    conv, failures, _ = parse_generations(gens, prompts, kimi_profile, renderer.tokenizer)
    kw = dict(exclude_sample_ids=set(failures["row_id"].to_list()), conversations=conv)
    return SimpleNamespace(tmp=tmp, gens=gens, tokenized=tokenized, kw=kw, tok=renderer.tokenizer)


def _publish(b, tmp, profile, acceptance: bool):
    samples, _ = build_training_samples(b.gens, b.tokenized, acceptance=acceptance, **b.kw)
    schema = with_acceptance(TRAINING_SAMPLES) if acceptance else TRAINING_SAMPLES
    write_frame_atomic(samples, tmp / "training_samples" / "shard=0000" / "part-0000.parquet", schema=schema)
    passed = lambda gate, shard: SimpleNamespace(success=True)
    snap = build_snapshot(
        tmp, [0], passed, config={"profile": profile.name}, exporters=exporters_for(profile.name, b.tok)
    )
    return samples, snap


def test_the_setting_is_off_by_default_and_read_from_the_environment():
    assert Settings.from_env({}).train_acceptance is False
    assert Settings.from_env({"EAGLE3_TRAIN_ACCEPTANCE": "1"}).train_acceptance is True


def test_off_the_tables_and_export_keep_their_columns(built, tmp_path, kimi_profile):
    samples, snap = _publish(built, tmp_path, kimi_profile, acceptance=False)
    assert samples.columns == TRAINING_SAMPLES.names
    lines = [json.loads(x) for x in (snap.path / SPECFORGE_FILE).read_text().splitlines()]
    assert lines and all(set(r) == {"id", "input_ids", "loss_mask"} for r in lines)


def test_on_each_row_carries_its_acceptance_and_specforge_reads_the_export_exactly(built, tmp_path, kimi_profile):
    from specforge.data.prompt_builder import prepare_prompt_tasks

    samples, snap = _publish(built, tmp_path, kimi_profile, acceptance=True)
    assert samples.columns == with_acceptance(TRAINING_SAMPLES).names
    by_gen = {r["sample_id"]: r for r in built.gens.iter_rows(named=True)}
    rows = {r["sample_id"]: r for r in samples.iter_rows(named=True)}
    assert len(rows) >= 8
    for sid, r in rows.items():
        for c in ACCEPTANCE_COLUMNS:
            assert r[c] is not None and r[c] == by_gen[sid][c]  # the server's figure, unchanged
    lines = [json.loads(x) for x in (snap.path / SPECFORGE_FILE).read_text().splitlines()]
    assert {r["id"] for r in lines} == set(rows)
    for r in lines:
        assert {c: r[c] for c in ACCEPTANCE_COLUMNS} == {c: rows[r["id"]][c] for c in ACCEPTANCE_COLUMNS}
    name = SPECFORGE_TEMPLATES[kimi_profile.name][0]
    tasks = prepare_prompt_tasks(
        snap.path / SPECFORGE_FILE,
        built.tok,
        chat_template=name,
        max_length=snap.manifest["exports"][SPECFORGE_FILE]["max_total_len"],
        is_preformatted=False,
        train_only_last_turn=False,
        cache_dir=None,
        cache_key=None,
        num_proc=1,
    )
    assert len(tasks) == len(lines)
    for line, task in zip(lines, tasks):
        assert list(task["payload"]["input_ids"]) == rows[line["id"]]["input_ids"]
        assert list(task["payload"]["loss_mask"]) == rows[line["id"]]["loss_mask"]
