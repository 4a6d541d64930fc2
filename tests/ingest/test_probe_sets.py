"""Probe sets (`role: probe`): a fixed prompt set that is generated for every drafter but never trained on.

What a user relies on: the probe prompts reach prompts.parquet (so they are tokenized and generated),
while a training prompt that is (or embeds) a probe prompt is quarantined as `probe_overlap`, naming the
probe source and prompt, and the counts reconcile with it; an eval overlap still wins over a probe one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from eagle3_dagster.ingest import SourceSpecError, combine_sources, ingest_source, load_source_specs
from eagle3_dagster.ingest.pipeline import DECONTAMINATION_FILE, EvalSet

PROBES = [
    "Write a Python function that merges two sorted lists into one sorted list without using the sort method.",
    "Explain step by step how a hash map handles collisions and what happens to lookups when it grows.",
    "Summarise the plot of a short story about a lighthouse keeper who finds a message in a bottle.",
]


def _user(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "..."}]}


def _write(tmp_path: Path) -> Path:
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "probe.jsonl").write_text("".join(json.dumps(_user(t)) + "\n" for t in PROBES))
    (sources / "probe_set.yaml").write_text("path: probe.jsonl\nformat: openai\nrole: probe\n")
    train = [
        _user(PROBES[0]),  # line 1: the probe prompt itself (exact)
        _user(f"My teacher gave me this task. {PROBES[1]} Please keep it short."),  # line 2: embedded (13-grams)
        _user("What is the capital of Australia?"),  # line 3: unrelated
        _user("Write a haiku about autumn rain."),  # line 4: unrelated
    ]
    (sources / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    # named "a_train" so that it sorts before the probe set: the probe set is still combined last
    (sources / "a_train.yaml").write_text("path: train.jsonl\nformat: openai\n")
    return sources


def _combine(sources: Path, data: Path):
    specs = load_source_specs(sources)
    for spec in specs:
        ingest_source(spec, data / "sources" / spec.name, n_shards=2)
    names = [s.name for s in specs if s.role == "train"] + [s.name for s in specs if s.role == "probe"]
    probes = [EvalSet(s.name, data / "sources" / s.name) for s in specs if s.role == "probe"]
    return combine_sources([data / "sources" / n for n in names], data / "prompts", n_shards=2, probe_sets=probes)


def test_probe_prompts_are_combined_and_overlapping_training_prompts_quarantined(tmp_path) -> None:
    data = tmp_path / "data"
    counts = _combine(_write(tmp_path), data)
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
    probe_ids = pl.read_parquet(data / "sources" / "probe_set" / "accepted.parquet")["prompt_id"].to_list()

    # every probe prompt is in prompts.parquet (tokenized and generated), under its own source
    assert sorted(prompts.filter(pl.col("source") == "probe_set")["prompt_id"].to_list()) == sorted(probe_ids)
    # the training prompts that are probe prompts are not; the unrelated ones are
    assert sorted(prompts.filter(pl.col("source") == "a_train")["source_row"].to_list()) == [3, 4]

    rejects = pl.read_parquet(data / "prompts" / "prompt_rejects.parquet").sort("source_row")
    assert rejects["reason"].to_list() == ["probe_overlap", "probe_overlap"]
    assert rejects["source_row"].to_list() == [1, 2]
    first, second = rejects.to_dicts()
    assert first["detail"].startswith(
        f"exact match after normalisation with probe source 'probe_set' prompt {probe_ids[0]}"
    )
    assert f"probe source 'probe_set' prompt {probe_ids[1]} (row 2)" in second["detail"]
    assert second["detail"].startswith("13-gram overlap")

    assert (counts.probe_sources, counts.probe_overlap, counts.eval_overlap) == (1, 2, 0)
    assert counts.probe_overlap_by_source == {"a_train": 2}
    assert counts.rejects_by_reason == {"probe_overlap": 2}
    assert counts.input_accepted == counts.prompts + counts.cross_source_duplicates + counts.probe_overlap
    assert counts.reconciles()
    summary = json.loads((data / "prompts" / DECONTAMINATION_FILE).read_text())
    assert summary["probe_overlap"] == 2
    assert summary["probe_overlap_by_training_source"] == {"a_train": 2}
    assert [(p["source"], p["eval_prompts"], p["exact"], p["ngram"]) for p in summary["probe_sources"]] == [
        ("probe_set", 3, 1, 1)
    ]


def test_eval_overlap_wins_over_probe_overlap(tmp_path) -> None:
    """A training prompt that is both an eval and a probe prompt is an eval overlap (one reject row)."""
    sources = _write(tmp_path)
    (sources / "ev.jsonl").write_text(json.dumps(_user(PROBES[0])) + "\n")
    (sources / "ev.yaml").write_text("path: ev.jsonl\nformat: openai\nrole: eval\n")
    data = tmp_path / "data"
    specs = load_source_specs(sources)
    for spec in specs:
        ingest_source(spec, data / "sources" / spec.name, n_shards=2)
    counts = combine_sources(
        [data / "sources" / "a_train", data / "sources" / "probe_set"],
        data / "prompts",
        n_shards=2,
        eval_sets=[EvalSet("ev", data / "sources" / "ev")],
        probe_sets=[EvalSet("probe_set", data / "sources" / "probe_set")],
    )
    assert (counts.eval_overlap, counts.probe_overlap) == (1, 1)
    assert counts.reconciles()
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
    assert prompts.filter(pl.col("source") == "probe_set").height == 3  # a probe prompt is not checked


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("overlap_threshold: 0.5\n", "field 'overlap_threshold' only applies with 'role: eval' or 'role: probe'"),
    ],
)
def test_bad_probe_fields_are_named(tmp_path, body: str, problem: str) -> None:
    (tmp_path / "s.yaml").write_text("path: x.jsonl\n" + body)
    with pytest.raises(SourceSpecError, match=re.escape(problem)):
        load_source_specs(tmp_path)


def test_a_probe_source_may_regenerate_every_turn(tmp_path) -> None:
    """Multi-turn probe conversations are measured turn by turn (docs/probes.md): all_turns is a probe's choice."""
    (tmp_path / "s.yaml").write_text("path: x.jsonl\nrole: probe\nregenerate: all_turns\nmax_turns: 4\n")
    (spec,) = load_source_specs(tmp_path)
    assert (spec.role, spec.regenerate, spec.max_turns) == ("probe", "all_turns", 4)


def test_probe_overlap_threshold_is_accepted(tmp_path) -> None:
    (tmp_path / "s.yaml").write_text("path: x.jsonl\nrole: probe\noverlap_threshold: 0.8\n")
    (spec,) = load_source_specs(tmp_path)
    assert (spec.role, spec.overlap_threshold) == ("probe", 0.8)
