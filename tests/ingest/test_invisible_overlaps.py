"""Overlaps hidden by invisible characters (ingest/invisible.py): a training prompt that differs from an eval or
probe prompt only by format characters (U+200B, U+00AD, U+2060, U+FEFF, every other Cf character, the other
default-ignorable code points) is still caught. NFKC keeps them and each one was a word boundary, so a
zero-width space inside a word split it and the copy was published.

What a user relies on: no such copy of a probe or benchmark prompt reaches prompts.parquet, by either rule
(exact after normalisation, 13-gram overlap), through the real ingest; and the characters' table covers every
Cf character of the Unicode database Python ships.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

import polars as pl
import pytest

from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs
from eagle3_dagster.ingest.decontaminate import EvalIndex, normalize_text
from eagle3_dagster.ingest.invisible import INVISIBLE_RANGES, drop_invisible
from eagle3_dagster.ingest.pipeline import EvalSet

NAMED = (0x200B, 0x00AD, 0x2060, 0xFEFF)  # the four of the report: NFKC keeps every one
SHORT = "What is the capital of France and why did it become the capital?"
LONG = (
    "A farmer has seventeen sheep and all but nine run away through a broken fence during the night, "
    "so how many sheep does the farmer still have in the field the next morning?"
)


def _handled() -> list[int]:
    """Every code point of the table, but of the 4096-wide tag block only a few representatives."""
    out = []
    for lo, hi in INVISIBLE_RANGES:
        if lo == 0xE0000:
            out += [0xE0001, 0xE0020, 0xE0041, 0xE007F, 0xE0100, 0xE01EF]
        else:
            out += range(lo, hi + 1)
    return out


def _hide(text: str, c: str) -> str:
    """`text` with `c` inside every word of 4+ letters (after its second letter) and at its start."""
    return c + " ".join(w[:2] + c + w[2:] if len(w) >= 4 else w for w in text.split(" "))


def test_the_table_covers_every_format_character_python_knows() -> None:
    cf = {c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"}
    table = {c for lo, hi in INVISIBLE_RANGES for c in range(lo, hi + 1)}
    assert cf - table == set(), [f"U+{c:04X}" for c in sorted(cf - table)]
    for c in NAMED:  # NFKC keeps them: dropping them is ours to do
        assert unicodedata.normalize("NFKC", chr(c)) == chr(c)
        assert drop_invisible(f"a{chr(c)}b") == "ab"
    # only invisible characters: nothing a reader sees (letters, digits, spaces, emoji) is dropped
    visible = "Ünïcödé 日本語 ١٢٣ 👨 👩 x\u00a0y"
    assert drop_invisible(visible) == visible


@pytest.mark.parametrize("code", _handled(), ids=lambda c: f"U+{c:04X}")
def test_an_invisible_character_does_not_hide_an_overlap(code: int) -> None:
    c = chr(code)
    index = EvalIndex()
    index.add_source("probe_set")
    index.add("probe_set", "p-short", 1, [SHORT])
    index.add("probe_set", "p-long", 2, [LONG])
    assert normalize_text(_hide(SHORT, c)) == normalize_text(SHORT)
    exact = index.match([_hide(SHORT, c)])
    assert exact is not None and (exact.kind, exact.eval_prompt.prompt_id) == ("exact", "p-short")
    embedded = index.match([f"Please help with this one. {_hide(LONG, c)} Show every step."])
    assert embedded is not None and (embedded.kind, embedded.eval_prompt.prompt_id) == ("ngram", "p-long")
    assert embedded.fraction == 1.0


def _user(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "..."}]}


def test_hidden_copies_of_probe_and_eval_prompts_never_reach_the_prompts_table(tmp_path: Path) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "probe.jsonl").write_text(json.dumps(_user(SHORT)) + "\n")
    (sources / "probe_set.yaml").write_text("path: probe.jsonl\nformat: openai\nrole: probe\n")
    (sources / "ev.jsonl").write_text(json.dumps(_user(LONG)) + "\n")
    (sources / "ev.yaml").write_text("path: ev.jsonl\nformat: openai\nrole: eval\n")
    train = [_user(_hide(SHORT, chr(c))) for c in NAMED]  # lines 1-4: the probe prompt, hidden
    train += [_user(f"From my homework: {_hide(LONG, chr(c))}") for c in NAMED]  # lines 5-8: the eval one
    train += [_user("Write a haiku about autumn rain.")]  # line 9: unrelated
    (sources / "train.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in train))
    (sources / "a_train.yaml").write_text("path: train.jsonl\nformat: openai\n")
    data = tmp_path / "data"
    for spec in load_source_specs(sources):
        ingest_source(spec, data / "sources" / spec.name, n_shards=2)
    counts = combine_sources(
        [data / "sources" / "a_train", data / "sources" / "probe_set"],
        data / "prompts",
        n_shards=2,
        eval_sets=[EvalSet("ev", data / "sources" / "ev")],
        probe_sets=[EvalSet("probe_set", data / "sources" / "probe_set")],
    )
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
    assert prompts.filter(pl.col("source") == "a_train")["source_row"].to_list() == [9]
    rejects = pl.read_parquet(data / "prompts" / "prompt_rejects.parquet").sort("source_row")
    assert rejects["source_row"].to_list() == list(range(1, 9))
    assert rejects["reason"].to_list() == ["probe_overlap"] * 4 + ["eval_overlap"] * 4
    assert all(d.startswith("exact match after normalisation with probe source") for d in rejects["detail"][:4])
    assert all("13-gram overlap with eval source 'ev'" in d for d in rejects["detail"][4:])
    assert (counts.probe_overlap, counts.eval_overlap) == (4, 4) and counts.reconciles()
