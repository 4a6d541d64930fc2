"""SpecForge lane: SpecForge 0.2.0's OWN data code reads our exports token-exact, for Kimi-K2.5 and Qwen3.

Installed by `make install` (the `.[specforge]` extra: torch==2.13.0 CPU + the packages `specforge.data`
imports, then `specforge==0.2.0 --no-deps`). Per profile, a snapshot is built from real parts: the demo
prompts and every shared dataset (multi-turn, tools, tool history) ingested and rendered with the real
tokenizer, generated over real HTTP by eagle3-sim (with 25% of samples carrying non-canonical splits),
parsed into training_samples and published by the snapshot code with the pipeline's exporters. Then:

- offline: `specforge.data.preprocessing.build_eagle3_dataset` (what SpecForge's prepare_hidden_states
  runs) on specforge_preformatted.jsonl with the manifest's settings (is_preformatted, train_only_last_turn,
  the chat template, max_length) gives the training row's input_ids, and supervises exactly the generated
  ids (+ the prefilled `<think>` for Kimi) for >= 99% of the canonical rows;
- our own check (`check_preformatted`, which decides what the export holds and what the manifest records)
  agrees with SpecForge's preprocessing on EVERY snapshot row, kept or left out;
- online: `specforge.data.prompt_builder.prepare_prompt_tasks` on specforge_prompts.jsonl gives every
  row's ids and loss mask unchanged.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import polars as pl
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import GenerationConfig, generate_shard, read_generations
from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs
from eagle3_dagster.publish.export import (
    PREFORMATTED_FILE,
    SPECFORGE_FILE,
    SPECFORGE_TEMPLATES,
    check_preformatted,
    exporters_for,
)
from eagle3_dagster.publish.snapshot import SnapshotContent, build_snapshot
from eagle3_dagster.schemas import TRAINING_SAMPLES
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.storage import write_frame_atomic
from eagle3_dagster.tokenize import PromptRenderer, tokenize_prompts
from eagle3_dagster.train import build_training_samples
from eagle3_dagster.train.conversations import parse_generations

pytestmark = pytest.mark.integration

PER_SOURCE = 8  # prompts per source (12 sources): ~90 rows per profile
MAX_NEW = 1536

try:  # no skip: `make test` installs the lane, and a missing install must fail loudly
    import specforge.data.preprocessing as sf_pre
    from specforge.data.prompt_builder import prepare_prompt_tasks
    from specforge.data.template import TEMPLATE_REGISTRY

    SPECFORGE_ERROR = None
except ImportError as e:  # pragma: no cover - reported by the fixture below
    SPECFORGE_ERROR = e


@pytest.fixture(scope="module", autouse=True)
def _specforge_installed():
    if SPECFORGE_ERROR is not None:
        pytest.fail(
            f"SpecForge's data code is not importable ({SPECFORGE_ERROR}); install the lane with `make install` "
            "(pip install -e '.[specforge]' and pip install --no-deps specforge==0.2.0)"
        )


def _snapshot(tmp, profile):
    specs = load_source_specs(PROJECT_ROOT / "assets" / "sources") + load_source_specs(
        PROJECT_ROOT / "examples" / "shared-sources"
    )
    dirs = []
    for spec in specs:
        ingest_source(replace(spec, limit=PER_SOURCE), tmp / "sources" / spec.name, n_shards=1)
        dirs.append(tmp / "sources" / spec.name)
    combine_sources(dirs, tmp / "prompts", n_shards=1)
    prompts = pl.read_parquet(tmp / "prompts" / "prompts.parquet")
    renderer = PromptRenderer(profile)
    tokenized, _ = tokenize_prompts(prompts, renderer, max_new_tokens=MAX_NEW)
    args = [
        "--model",
        profile.name,
        "--tokenizer",
        profile.tokenizer,
        "--noncanonical-rate",
        "0.25",
        "--log-level",
        "WARNING",
    ]
    with start_simulator(extra_args=args) as sim:
        generate_shard(
            tokenized, tmp / "generations", GenerationConfig.from_profile(profile, (sim.url,), max_new_tokens=MAX_NEW)
        )
    gens = read_generations(tmp / "generations")
    conv, failures, _ = parse_generations(gens, prompts, profile, renderer.tokenizer)
    samples, _ = build_training_samples(
        gens, tokenized, exclude_sample_ids=set(failures["row_id"].to_list()), conversations=conv
    )
    write_frame_atomic(samples, tmp / "training_samples" / "shard=0000" / "part-0000.parquet", schema=TRAINING_SAMPLES)
    passed = lambda gate, shard: SimpleNamespace(success=True)
    snap = build_snapshot(
        tmp,
        [0],
        passed,
        SnapshotContent(config={"profile": profile.name}, exporters=exporters_for(profile.name, renderer.tokenizer)),
    )
    return snap, samples, renderer.tokenizer


def _supervised(mask) -> list[int]:
    return [i for i, x in enumerate(mask) if x]


def _specforge_exact(ids, mask, row) -> bool:
    p, n = row["prompt_len"], row["total_len"]
    return ids == row["input_ids"] and _supervised(mask) in (list(range(p, n)), list(range(p - 1, n)))


@pytest.mark.parametrize("which", ["kimi", "qwen"])
def test_specforge_reads_exports_token_exact(tmp_path, which, kimi_profile, qwen_profile):
    profile = kimi_profile if which == "kimi" else qwen_profile
    snap, samples, tok = _snapshot(tmp_path, profile)
    manifest = snap.manifest["exports"]
    rows = {r["sample_id"]: r for r in samples.iter_rows(named=True)}
    canonical = {s for s, r in rows.items() if r["text_exact"]}
    assert len(rows) >= 60 and len(canonical) < len(rows)  # both kinds of rows are in the snapshot

    # our template facts are SpecForge's own
    name, header, eot = SPECFORGE_TEMPLATES[profile.name]
    t = TEMPLATE_REGISTRY.get(name)
    assert (t.assistant_header, t.end_of_turn_token) == (header, eot)

    # OFFLINE: SpecForge's dataset builder on the preformatted export, with the manifest's settings
    settings = manifest[PREFORMATTED_FILE]["specforge_settings"]
    assert settings["data.chat_template"] == name and settings["data.max_length"] == max(
        r["total_len"] for r in rows.values()
    )
    from datasets import load_dataset

    ds = load_dataset("json", data_files=str(snap.path / PREFORMATTED_FILE), split="train")
    order = ds.shuffle(seed=42)["id"]  # build_eagle3_dataset shuffles with seed 42 and drops the id column
    built = sf_pre.build_eagle3_dataset(
        ds,
        tok,
        chat_template=settings["data.chat_template"],
        max_length=settings["data.max_length"],
        is_preformatted=settings["data.is_preformatted"],
        train_only_last_turn=settings["data.train_only_last_turn"],
        num_proc=1,
    )
    exact = {
        sid
        for sid, b in zip(order, built)
        if _specforge_exact(b["input_ids"].view(-1).tolist(), b["loss_mask"].view(-1).tolist(), rows[sid])
    }
    assert len(built) == manifest[PREFORMATTED_FILE]["rows"] == manifest[PREFORMATTED_FILE]["specforge_exact_rows"]
    assert exact == set(order)  # every row in the export is reproduced exactly
    assert len(exact & canonical) / len(canonical) >= 0.99, (len(exact & canonical), len(canonical))

    # our check agrees with SpecForge's preprocessing on every row, also the ones it left out
    texts, verdicts = [], []
    for r in rows.values():
        text, reason = check_preformatted(r["input_ids"], r["prompt_len"], tok, profile.name)
        texts.append(text)
        verdicts.append(reason is None)
    out = sf_pre.preprocess_conversations(
        tok, texts, t, max_length=100_000, is_preformatted=True, train_only_last_turn=True, tools=[[] for _ in texts]
    )
    theirs = [
        _specforge_exact(i.view(-1).tolist(), m.view(-1).tolist(), r)
        for i, m, r in zip(out["input_ids"], out["loss_mask"], rows.values())
    ]
    assert theirs == verdicts
    assert sum(theirs) == len(exact)

    # ONLINE: SpecForge's prompt builder on the pre-tokenized export keeps every row, ids and mask unchanged
    tasks = prepare_prompt_tasks(
        snap.path / SPECFORGE_FILE,
        tok,
        chat_template=name,
        max_length=manifest[SPECFORGE_FILE]["max_total_len"],
        is_preformatted=False,
        train_only_last_turn=False,
        cache_dir=None,
        cache_key=None,
        num_proc=1,
    )
    ids_in_file = [json.loads(x)["id"] for x in (snap.path / SPECFORGE_FILE).read_text().splitlines()]
    assert len(tasks) == len(rows) == manifest[SPECFORGE_FILE]["specforge_exact_rows"]
    for sid, task in zip(ids_in_file, tasks):
        assert list(task["payload"]["input_ids"]) == rows[sid]["input_ids"]
        assert list(task["payload"]["loss_mask"]) == rows[sid]["loss_mask"]
