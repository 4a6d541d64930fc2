"""speculators lane: vllm speculators 0.9.0's OWN data preparation reads exports/specforge_prompts.jsonl exactly.

Installed by `make install` (the `.[speculators]` extra: openai and jiter, which speculators' package import
pulls in; then `speculators==0.9.0 hs-connectors==0.9.0 --no-deps`, beside the SpecForge lane's CPU torch
and datasets). speculators' `prepare-data --data X.jsonl` runs `load_and_preprocess_dataset`: a JSONL whose
rows have both `input_ids` and `loss_mask` is "speculator format" and passes straight through (no chat
template, no render server), clipped to `--seq-length`, rows with no supervised token dropped, every other
key removed, shuffled; the result is saved with `save_to_disk` for its trainer's `load_from_disk`.

A Kimi-K2.5 snapshot is built from real parts (every demo and shared source, the real tokenizer, generated
over real HTTP by an eagle3-sim that speculates and splits 25% of samples non-canonically), published once
with EAGLE3_TRAIN_ACCEPTANCE off and once on (the rows then carry spec_accept_rate / spec_accept_length).
Both times speculators' own `prepare_data` command function writes its dataset, and what it saved holds
exactly the snapshot's training rows: the same ids and loss masks, no row dropped, clipped or added.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import polars as pl
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import GenerationConfig, generate_shard, read_generations
from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs
from eagle3_dagster.publish.export import SPECFORGE_FILE, exporters_for
from eagle3_dagster.publish.snapshot import SnapshotContent, build_snapshot
from eagle3_dagster.schemas import TRAINING_SAMPLES
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.storage import write_frame_atomic
from eagle3_dagster.tokenize import PromptRenderer, tokenize_prompts
from eagle3_dagster.train import build_training_samples
from eagle3_dagster.train.conversations import parse_generations
from eagle3_dagster.train.samples import ACCEPTANCE_COLUMNS, with_acceptance

pytestmark = pytest.mark.integration

PER_SOURCE = 4  # prompts per source (12 sources)
MAX_NEW = 1024
SPEC = ("--speculative-draft-model-path", "test/kimi-eagle3", "--speculative-num-draft-tokens", "4")

try:  # no skip: `make test` installs the lane, and a missing install must fail loudly
    from datasets import load_from_disk
    from speculators.cli.prepare_data import prepare_data

    SPECULATORS_ERROR = None
except ImportError as e:  # pragma: no cover - reported by the fixture below
    SPECULATORS_ERROR = e


@pytest.fixture(scope="module", autouse=True)
def _speculators_installed():
    if SPECULATORS_ERROR is not None:
        pytest.fail(
            f"speculators' data code is not importable ({SPECULATORS_ERROR}); install the lane with `make install` "
            "(pip install -e '.[speculators]' and pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0)"
        )


@pytest.fixture(scope="module")
def generated(tmp_path_factory, kimi_profile):
    tmp = tmp_path_factory.mktemp("speculators")
    specs = load_source_specs(PROJECT_ROOT / "assets" / "sources") + load_source_specs(
        PROJECT_ROOT / "examples" / "shared-sources"
    )
    for spec in specs:
        ingest_source(replace(spec, limit=PER_SOURCE), tmp / "sources" / spec.name, n_shards=1)
    combine_sources([tmp / "sources" / s.name for s in specs], tmp / "prompts", n_shards=1)
    prompts = pl.read_parquet(tmp / "prompts" / "prompts.parquet")
    renderer = PromptRenderer(kimi_profile)
    tokenized, _ = tokenize_prompts(prompts, renderer, max_new_tokens=MAX_NEW)
    args = ["--model", kimi_profile.name, "--tokenizer", kimi_profile.tokenizer, "--log-level", "WARNING", *SPEC]
    with start_simulator(extra_args=[*args, "--noncanonical-rate", "0.25"]) as sim:
        cfg = GenerationConfig.from_profile(kimi_profile, (sim.url,), max_new_tokens=MAX_NEW)
        generate_shard(tokenized, tmp / "generations", cfg)
    gens = read_generations(tmp / "generations")
    conv, failures, _ = parse_generations(gens, prompts, kimi_profile, renderer.tokenizer)
    kw = dict(exclude_sample_ids=set(failures["row_id"].to_list()), conversations=conv)
    return SimpleNamespace(gens=gens, tokenized=tokenized, kw=kw, tok=renderer.tokenizer)


def _publish(g, tmp, profile, acceptance: bool):
    samples, _ = build_training_samples(g.gens, g.tokenized, acceptance=acceptance, **g.kw)
    schema = with_acceptance(TRAINING_SAMPLES) if acceptance else TRAINING_SAMPLES
    write_frame_atomic(samples, tmp / "training_samples" / "shard=0000" / "part-0000.parquet", schema=schema)
    passed = lambda gate, shard: SimpleNamespace(success=True)
    snap = build_snapshot(
        tmp,
        [0],
        passed,
        SnapshotContent(config={"profile": profile.name}, exporters=exporters_for(profile.name, g.tok)),
    )
    return samples, snap


def _row(ids, mask) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(int(x) for x in ids), tuple(int(x) for x in mask)


@pytest.mark.parametrize("acceptance", [False, True], ids=["acceptance-off", "acceptance-on"])
def test_speculators_prepare_data_reads_the_export_exactly(tmp_path, generated, kimi_profile, acceptance):
    samples, snap = _publish(generated, tmp_path, kimi_profile, acceptance)
    export = snap.path / SPECFORGE_FILE
    lines = [json.loads(x) for x in export.read_text().splitlines()]
    extra = set(ACCEPTANCE_COLUMNS) if acceptance else set()
    assert lines and all(set(r) == {"id", "input_ids", "loss_mask", *extra} for r in lines)
    if acceptance:  # the extra keys are really there, with the server's figures
        assert all(r[c] is not None for r in lines for c in ACCEPTANCE_COLUMNS)
    rows = {r["sample_id"]: r for r in samples.iter_rows(named=True)}
    assert len(rows) >= 30 and any(not r["text_exact"] for r in rows.values())  # both kinds of rows
    expected = Counter(_row(r["input_ids"], r["loss_mask"]) for r in rows.values())
    assert len(expected) == len(rows)  # distinct rows: equal multisets are a one-to-one match

    # speculators' own `prepare-data` command, as its CLI calls it, on our export
    out = tmp_path / "speculators_data"
    prepare_data(
        model=kimi_profile.tokenizer,
        data=[str(export)],
        output=str(out),
        seq_length=snap.manifest["exports"][SPECFORGE_FILE]["speculators_settings"]["--seq-length"],
        num_preprocessing_workers=1,
    )
    ds = load_from_disk(str(out))  # what its trainer opens
    assert set(ds.column_names) == {"input_ids", "loss_mask", "seq_len"}  # id and acceptance keys not carried on
    got = Counter(_row(r["input_ids"], r["loss_mask"]) for r in ds.with_format(None))
    assert sum(got.values()) == len(ds) == len(lines) == len(rows)
    assert got == expected
    assert list(ds.with_format(None)["seq_len"]) == [len(r["input_ids"]) for r in ds.with_format(None)]
