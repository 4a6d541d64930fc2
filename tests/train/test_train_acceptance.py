"""EAGLE3_TRAIN_ACCEPTANCE: each training row's drafter acceptance in the training table and in the
`input_ids` + `loss_mask` export, read by SpecForge 0.2.0's own online loader exactly as before; figures that
failed their checks are null there and counted in the manifest, and switching the columns on publishes a new
snapshot (its identity covers what the export carries).

Real parts: the demo prompts rendered with the real Kimi tokenizer, generated over HTTP by an eagle3-sim
that speculates (sim/speculative.py) and lies about the figures of 4 answers (the fleet fault
spec_inconsistent), parsed, built and published by the snapshot code.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import httpx
import polars as pl
import pytest

from eagle3_dagster.config import PROJECT_ROOT, Settings
from eagle3_dagster.generate import GenerationConfig, generate_shard, read_generations
from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs
from eagle3_dagster.publish.export import SPECFORGE_FILE, SPECFORGE_TEMPLATES, exporters_for
from eagle3_dagster.publish.snapshot import SnapshotContent, build_snapshot
from eagle3_dagster.schemas import TRAINING_SAMPLES
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.storage import write_frame_atomic
from eagle3_dagster.tokenize import PromptRenderer, tokenize_prompts
from eagle3_dagster.train import build_training_samples
from eagle3_dagster.train.conversations import parse_generations
from eagle3_dagster.train.samples import ACCEPTANCE_COLUMNS, with_acceptance

pytestmark = pytest.mark.integration

SPEC = ("--speculative-draft-model-path", "test/kimi-eagle3", "--speculative-num-draft-tokens", "4")
LYING = 4
FLAG = "spec_metrics_inconsistent:accept_length"


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
        # 4 answers carry figures that do not add up (accept length off by 0.5): flagged, never exported
        faults = {"spec_inconsistent": LYING, "spec_inconsistent_kind": "accept_length"}
        httpx.post(sim.url + "/_sim/faults", json=faults, timeout=5).raise_for_status()
        cfg = GenerationConfig.from_profile(kimi_profile, (sim.url,), max_new_tokens=512)
        generate_shard(tokenized, tmp / "generations", cfg)
    gens = read_generations(tmp / "generations")
    conv, failures, _ = parse_generations(gens, prompts, kimi_profile, renderer.tokenizer)
    kw = dict(exclude_sample_ids=set(failures["row_id"].to_list()), conversations=conv)
    return SimpleNamespace(tmp=tmp, gens=gens, tokenized=tokenized, kw=kw, tok=renderer.tokenizer)


def _publish(b, tmp, profile, acceptance: bool):
    samples, counts = build_training_samples(b.gens, b.tokenized, acceptance=acceptance, **b.kw)
    b.counts = counts
    schema = with_acceptance(TRAINING_SAMPLES) if acceptance else TRAINING_SAMPLES
    write_frame_atomic(samples, tmp / "training_samples" / "shard=0000" / "part-0000.parquet", schema=schema)
    passed = lambda gate, shard: SimpleNamespace(success=True)
    snap = build_snapshot(
        tmp,
        [0],
        passed,
        SnapshotContent(config={"profile": profile.name}, exporters=exporters_for(profile.name, b.tok)),
    )
    return samples, snap


def test_the_setting_is_off_by_default_and_read_from_the_environment():
    assert Settings.from_env({}).stages.train_acceptance is False
    assert Settings.from_env({"EAGLE3_TRAIN_ACCEPTANCE": "1"}).stages.train_acceptance is True


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
    flagged = {sid for sid, r in by_gen.items() if FLAG in r["integrity_violations"]}
    assert len(flagged) == LYING
    lying = flagged & set(rows)  # flagged figures: the rows themselves are trained on (unless they fail parsing)
    assert lying
    for sid, r in rows.items():
        for c in ACCEPTANCE_COLUMNS:
            if sid in lying:  # a figure that failed its checks feeds no export: null, and named
                assert r[c] is None and r["spec_left_out"] == "accept_length", (sid, c)
            else:
                assert r[c] is not None and r[c] == by_gen[sid][c]  # the server's figure, unchanged
    assert built.counts["acceptance_left_out"] == len(lying)
    lines = [json.loads(x) for x in (snap.path / SPECFORGE_FILE).read_text().splitlines()]
    assert {r["id"] for r in lines} == set(rows)
    for r in lines:
        assert {c: r[c] for c in ACCEPTANCE_COLUMNS} == {c: rows[r["id"]][c] for c in ACCEPTANCE_COLUMNS}
    acc = snap.manifest["exports"][SPECFORGE_FILE]["acceptance"]
    assert (acc["rows_with_figures"], acc["rows_left_out_flagged"]) == (len(rows) - len(lying), len(lying))
    assert acc["left_out_by_check"] == {"accept_length": len(lying)} and acc["rows_without_figures"] == 0
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


def test_switching_the_columns_on_publishes_new_content_with_them(built, tmp_path, kimi_profile):
    """The same rows published without the acceptance columns, then with them: a new snapshot whose export
    carries them (the identity covers what the exports carry), never "already LATEST (same content)"."""
    _, before = _publish(built, tmp_path, kimi_profile, acceptance=False)
    _, after = _publish(built, tmp_path, kimi_profile, acceptance=True)
    assert after.created and after.version != before.version and after.latest == after.version
    lines = [json.loads(x) for x in (after.path / SPECFORGE_FILE).read_text().splitlines()]
    assert lines and all(set(ACCEPTANCE_COLUMNS) <= set(r) for r in lines)
    _, again = _publish(built, tmp_path, kimi_profile, acceptance=True)
    assert not again.created and again.version == after.version  # unchanged content: the same version
