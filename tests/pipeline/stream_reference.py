"""The streamed training stage writes what the whole-shard build wrote (called from a real Dagster run's test).

The reference is the whole-shard path (read every generation, parse_generations + build_training_samples
over all of them, training_features, summarize_samples), computed here from the same stored inputs and
gate results. `small_stream_batches` makes batches and sort buckets tiny so a demo shard crosses many of both.
tests/pipeline/test_noncanonical_graph.py runs the graph (non-canonical outputs: text_exact true and false rows)
and calls `assert_training_shard_equals_whole_shard_build`: no extra graph run for this check.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from eagle3_dagster.generate import read_generations
from eagle3_dagster.orchestration.resources import cached_renderer
from eagle3_dagster.quality import read_gate_result, run_gate, training_features
from eagle3_dagster.quality.features import available_source_shares
from eagle3_dagster.schemas import TOKENIZE_REJECTS, TOKENIZED_PROMPTS, TRAINING_SAMPLES
from eagle3_dagster.storage import write_frame_atomic
from eagle3_dagster.tokenize import tokenize_prompts
from eagle3_dagster.train import build_training_samples
from eagle3_dagster.train.conversations import parse_generations
from eagle3_dagster.train.summary import summarize_samples

BATCH, BUCKET = 2, 2


@pytest.fixture
def small_stream_batches(monkeypatch):
    from eagle3_dagster.defs import generate as gen_defs
    from eagle3_dagster.defs import tokenize as tok_defs
    from eagle3_dagster.storage import spill
    from eagle3_dagster.train import inputs as train_inputs

    monkeypatch.setattr(tok_defs, "PROMPT_SLICE_ROWS", BATCH)  # tokenized_prompts in many slices

    monkeypatch.setattr(gen_defs, "GENERATION_BATCH_ROWS", BATCH)
    monkeypatch.setattr(train_inputs, "GENERATION_BATCH_ROWS", BATCH)  # many batches ...
    monkeypatch.setattr(spill, "BUCKET_ROWS", BUCKET)  # ... and many sort buckets for a demo shard


def assert_training_shard_equals_whole_shard_build(data: Path, shard: str, pipeline, meta, tmp_path: Path) -> None:

    k = int(shard)
    folder = data / "training_samples" / f"shard={shard}"
    profile = pipeline.profile()
    tokenizer = cached_renderer(profile).tokenizer
    gen_dir = data / "generations" / f"shard={shard}"
    gens = read_generations(gen_dir).join(pl.read_parquet(gen_dir / "active.parquet"), on="sample_id", how="semi")
    tokenized = pl.read_parquet(data / "tokenized_prompts" / f"shard={shard}" / "part-*.parquet")
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == k)
    # tokenized_prompts, streamed slice by slice, wrote what tokenizing the whole shard at once gives
    ref_tok, ref_rej = tokenize_prompts(
        prompts, cached_renderer(profile), max_new_tokens=profile.max_new_tokens_for(pipeline.max_new_tokens)
    )
    assert prompts.height > 3 * BATCH and tokenized.equals(ref_tok)
    rej = pl.read_parquet(data / "tokenized_prompts" / f"shard={shard}" / "rejects.parquet")
    assert rej.equals(ref_rej.cast(dict(rej.schema)))  # type: ignore[arg-type]
    # ... byte for byte the files the whole-shard write made (the table is under ONE_ROW_GROUP_BYTES)
    tok_dir = data / "tokenized_prompts" / f"shard={shard}"
    write_frame_atomic(ref_tok, tmp_path / "ref_tok.parquet", schema=TOKENIZED_PROMPTS)
    write_frame_atomic(ref_rej, tmp_path / "ref_rej.parquet", schema=TOKENIZE_REJECTS)
    assert (tok_dir / "part-0000.parquet").read_bytes() == (tmp_path / "ref_tok.parquet").read_bytes()
    assert (tok_dir / "rejects.parquet").read_bytes() == (tmp_path / "ref_rej.parquet").read_bytes()
    bad_p = set(read_gate_result(data, "prompts", k).row_failures["row_id"].to_list())
    bad_s = set(read_gate_result(data, "generations", k).row_failures["row_id"].to_list())
    cands = gens.filter(~pl.col("sample_id").is_in(list(bad_s)) & ~pl.col("prompt_id").is_in(list(bad_p)))
    conv, failures, parse_counts = parse_generations(cands, prompts, profile, tokenizer)
    samples, counts = build_training_samples(
        gens,
        tokenized,
        exclude_sample_ids=bad_s | set(failures["row_id"].to_list()),
        exclude_prompt_ids=bad_p,
        conversations=conv,
    )
    assert samples.height > 3 * BUCKET and gens.height > 3 * BATCH  # the shard crossed several buckets and batches
    assert samples["text_exact"].sum() < samples.height  # non-canonical rows are in it

    # the training table: same rows, order, schema; and, as the shard is under ONE_ROW_GROUP_BYTES, byte for
    # byte the file the whole-shard build wrote (write_frame_atomic of every row), though it was streamed
    written = pq.read_table(folder / "part-0000.parquet")
    ref = samples.to_arrow().select(TRAINING_SAMPLES.names).cast(TRAINING_SAMPLES)
    assert written.schema.equals(ref.schema) and written.equals(ref)
    write_frame_atomic(samples, tmp_path / "ref_part.parquet", schema=TRAINING_SAMPLES)
    assert (folder / "part-0000.parquet").read_bytes() == (tmp_path / "ref_part.parquet").read_bytes()
    # the quarantine and the summary: byte for byte
    write_frame_atomic(failures, tmp_path / "ref_quarantine.parquet")
    assert (folder / "quarantine.parquet").read_bytes() == (tmp_path / "ref_quarantine.parquet").read_bytes()
    summary = json.dumps(summarize_samples(samples, profile), indent=1, default=str)
    assert (folder / "summary.json").read_text() == summary
    # counts, and the gate judged the same feature frame (stored result vs a fresh validation of the reference)
    assert {k: meta[k].value for k in (*counts, *parse_counts)} == {**counts, **parse_counts}
    feats = training_features(
        samples, profile, max_total_len=profile.max_train_len, available_shares=available_source_shares(tokenized)
    )
    stored = read_gate_result(data, "training_samples", k)
    fresh = run_gate(
        "training_samples",
        feats,
        expectations_dir=pipeline.expectations_path,
        context_dir=tmp_path / "gx",
        profile=profile,
    )
    assert stored.n_rows == fresh.n_rows == samples.height
    assert [(o.key, o.unexpected_count, o.success) for o in stored.outcomes] == [
        (o.key, o.unexpected_count, o.success) for o in fresh.outcomes
    ]

    # the generations gate: the streamed feature frame is the whole-shard one (same stored outcomes, same
    # quarantine bytes as validating generation_features over every generation at once)
    from eagle3_dagster.defs.generate import ECHO_WINDOW
    from eagle3_dagster.generate.inputs import prompt_view, tokenized_source
    from eagle3_dagster.quality import generation_features
    from eagle3_dagster.report.previews import PREVIEW_PROMPT_TAIL

    view = prompt_view(tokenized_source(data, k), tail=max(ECHO_WINDOW, PREVIEW_PROMPT_TAIL))
    gfeats = generation_features(gens, view, profile, tokenizer=tokenizer, echo_window=ECHO_WINDOW)
    gfresh = run_gate(
        "generations",
        gfeats,
        expectations_dir=pipeline.expectations_path,
        context_dir=tmp_path / "gx",
        profile=profile,
    )
    gstored = read_gate_result(data, "generations", k)
    assert gstored.n_rows == gfresh.n_rows == gens.height
    # the stored result also holds the step's per-shard request_failure_rate outcome (not a feature check)
    assert [(o.key, o.unexpected_count, o.success) for o in gstored.outcomes if o.key != "request_failure_rate"] == [
        (o.key, o.unexpected_count, o.success) for o in gfresh.outcomes
    ]
    write_frame_atomic(gfresh.row_failures, tmp_path / "ref_gen_quarantine.parquet")
    assert (gen_dir / "quarantine.parquet").read_bytes() == (tmp_path / "ref_gen_quarantine.parquet").read_bytes()
