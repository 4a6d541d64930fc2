"""Per-row feature frames for the quality gates, computed with polars (vectorized).

Great Expectations validates these narrow, typed, scalar frames, never the raw token lists:
GX on pandas cannot look inside a list<int32> cheaply, and a scalar column per check keeps the
suites model-agnostic (the profile's token ids are applied here; the suite only says e.g.
"think_end_count is 1").

Conventions:
- `row_id` is the table's key (prompt_id for prompts, sample_id for generations / training samples).
- A null feature means "not applicable to this row" (e.g. tool-argument parsing for a row without a
  tool call, or `ends_with_think_start` for a profile whose template does not prefill <think>).
  GX column-map expectations ignore nulls, so such a row neither passes nor fails that expectation.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from ..profiles import ModelProfile

ROW_ID = "row_id"

# Marker codes for the tool-call grammar check (one character per marker token).
_SECTION_BEGIN, _SECTION_END, _CALL_BEGIN, _ARG_BEGIN, _CALL_END = "S", "s", "C", "A", "c"


def _first_pos(ids: pl.Expr, token: int) -> pl.Expr:
    """Index of the first occurrence of `token` in each list, null when absent."""
    return (
        pl.when(ids.list.count_matches(token) > 0)
        .then(ids.list.eval(pl.element() == token).list.arg_max())
        .otherwise(None)
        .cast(pl.Int32)
    )


# ---------------------------------------------------------------------------------------------
# prompts


def prompt_features(tokenized: pl.DataFrame, profile: ModelProfile) -> pl.DataFrame:
    """One row per tokenized prompt (schemas.TOKENIZED_PROMPTS) -> scalar features.

    `ends_with_think_start` is null (skipped by design) when the profile's generation prompt does
    not end with <think> (e.g. Qwen3, whose model emits <think> itself): the expectation
    "thinking token ends prompt" then always passes for that profile.
    """
    ids = pl.col("input_ids")
    n = ids.list.len().cast(pl.Int32)
    applies = profile.generation_prompt_ends_with_think_start
    has_len_col = "prompt_len" in tokenized.columns
    out = tokenized.select(
        pl.col("prompt_id").cast(pl.String).alias(ROW_ID),
        (pl.col("source").cast(pl.String) if "source" in tokenized.columns else pl.lit(None, pl.String)).alias(
            "source"
        ),
        n.alias("prompt_len"),
        ids.list.last().cast(pl.Int64).alias("last_id"),
        ids.list.min().cast(pl.Int64).alias("min_id"),
        ids.list.max().cast(pl.Int64).alias("max_id"),
        ((ids.list.last() == profile.think_start_id).fill_null(False) if applies else pl.lit(None, pl.Boolean)).alias(
            "ends_with_think_start"
        ),
        ((ids.list.min() >= 0) & (ids.list.max() < profile.vocab_size)).fill_null(True).alias("ids_in_vocab"),
        ((n >= 1) & (n <= profile.max_prompt_tokens)).alias("prompt_fits"),
        ((pl.col("prompt_len") == n) if has_len_col else pl.lit(True)).fill_null(False).alias("prompt_len_consistent"),
    )
    return out


# ---------------------------------------------------------------------------------------------
# generations


def _tool_marker_map(profile: ModelProfile) -> dict[int, str]:
    t = profile.tool_call_ids
    m = {
        t.section_begin: _SECTION_BEGIN,
        t.section_end: _SECTION_END,
        t.call_begin: _CALL_BEGIN,
        t.argument_begin: _ARG_BEGIN,
        t.call_end: _CALL_END,
    }
    return {int(k): v for k, v in m.items() if k is not None}


def tool_marker_grammar(profile: ModelProfile) -> str:
    """Regex over marker codes that a well-formed tool-call region must match.

    Kimi: one section holding one or more calls, each `call_begin name argument_begin args call_end`.
    Profiles without section markers (Qwen3 `<tool_call>...</tool_call>`): zero or more calls.
    """
    t = profile.tool_call_ids
    call = _CALL_BEGIN + (_ARG_BEGIN if t.argument_begin is not None else "") + _CALL_END
    if t.section_begin is not None and t.section_end is not None:
        return f"^({_SECTION_BEGIN}({call})+{_SECTION_END})?$"
    return f"^({call})*$"


def _marker_strings(df: pl.DataFrame, profile: ModelProfile) -> pl.Series:
    """The tool-marker code string of each output ('' when it has none).

    Filtering inside list.eval is fast; mapping ids to characters is done on the exploded markers
    only (a few per tool-call row), which keeps this cheap on a million rows.
    """
    mapping = _tool_marker_map(profile)
    if not mapping:
        return pl.Series("markers", [""] * df.height, pl.String)
    ids = list(mapping)
    e = pl.element()
    markers = df.select(pl.col("output_ids").list.eval(e.filter(e.is_in(ids))).alias("m")).with_row_index("_r")
    exploded = markers.filter(pl.col("m").list.len() > 0).explode("m")
    joined = (
        exploded.with_columns(pl.col("m").replace_strict(mapping, return_dtype=pl.String))
        .group_by("_r", maintain_order=True)
        .agg(pl.col("m").str.join(""))
    )
    full = markers.select("_r").join(joined, on="_r", how="left", maintain_order="left")
    return full["m"].fill_null("").alias("markers")


def _ngram_keys(ids: pl.Series, n: int, *, chunk_values: int = 1 << 22) -> pl.Series:
    """Per output, the list of its n-gram keys (u64), computed on the flat id array with numpy.

    Global shifts over the flat array cost ~4x less than shifting inside polars' list.eval.
    Positions whose n-gram would cross into the next row are dropped. Keys mix n ids
    multiplicatively modulo 2**64: a collision only blurs a heuristic. Work goes in row-aligned
    chunks of about `chunk_values` ids so temporaries stay small (large fresh allocations are
    page-fault bound).
    """
    arr = ids.rechunk().to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    lens = np.diff(offsets)
    per_row = np.maximum(lens - n + 1, 0)
    new_offsets = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64)
    out = np.empty(int(new_offsets[-1]), dtype=np.uint64)
    rows = len(lens)
    r0 = 0
    mult = np.uint64(0x9E3779B1)
    while r0 < rows:
        # rows [r0, r1) hold about chunk_values ids (at least one row)
        r1 = max(int(np.searchsorted(offsets, offsets[r0] + chunk_values, side="right")) - 1, r0 + 1)
        r1 = min(r1, rows)
        a, b = int(offsets[r0]), int(offsets[r1])
        v = values[a:b].astype(np.uint64)
        keys = v.copy()
        for i in range(1, n):
            keys *= mult
            keys[:-i] += v[i:]
        keep = np.ones(b - a, dtype=bool)
        ends = offsets[r0 + 1 : r1 + 1] - a
        chunk_lens = lens[r0:r1]
        for j in range(1, n):  # the last n-1 positions of each row start no complete n-gram
            keep[(ends - j)[chunk_lens >= j]] = False
        out[new_offsets[r0] : new_offsets[r1]] = keys[keep]
        r0 = r1
    return pl.Series("_ngrams", pa.LargeListArray.from_arrays(pa.array(new_offsets), pa.array(out)))


def _ngram_stats(df: pl.DataFrame, n: int, min_len: int) -> pl.DataFrame:
    """Per output: the largest count of one n-gram and the number of distinct n-grams.

    Rows shorter than `min_len` get nulls: too short for repetition to mean anything. The max
    count is only computed (per-list value counts, the slow part) where some n-gram repeats;
    elsewhere it is 1 by definition.
    """
    if df.height == 0:
        return pl.DataFrame(schema={"max_ngram_count": pl.Int32, "distinct_ngrams": pl.Int32})
    keys = _ngram_keys(df["output_ids"], n)
    frame = pl.DataFrame({"k": keys}).with_columns(
        pl.col("k").list.len().alias("total"), pl.col("k").list.n_unique().alias("distinct")
    )
    repeats = frame["total"] > frame["distinct"]
    max_count = pl.Series("m", [1] * frame.height, pl.Int64)
    if repeats.any():
        idx = repeats.arg_true()
        sub = frame[idx].select(pl.col("k").list.eval(pl.element().unique_counts()).list.max().cast(pl.Int64))
        max_count = max_count.scatter(idx, sub.to_series())
    long_enough = df["output_ids"].list.len() >= min_len
    return pl.DataFrame(
        {
            "max_ngram_count": pl.Series(max_count).cast(pl.Int32),
            "distinct_ngrams": frame["distinct"].cast(pl.Int32),
            "_long": long_enough,
        }
    ).select(
        pl.when("_long").then(pl.col("max_ngram_count")).alias("max_ngram_count"),
        pl.when("_long").then(pl.col("distinct_ngrams")).alias("distinct_ngrams"),
    )


def _tool_args_parse(df: pl.DataFrame, profile: ModelProfile, tokenizer: Any) -> pl.Series:
    """True/False for rows with a tool call (every call's arguments decode to valid JSON), else null.

    The arguments are decoded from output_ids (never re-encoded). Profiles with an
    argument_begin marker (Kimi) parse the span argument_begin..call_end; profiles without one
    (Qwen3) parse the whole call body, which is itself a JSON object. Spans are located with
    polars; only the decode and json.loads run per call.
    """
    t = profile.tool_call_ids
    n = df.height
    if tokenizer is None or t.call_begin is None or t.call_end is None or n == 0:
        return pl.Series("tool_args_parse", [None] * n, pl.Boolean)
    open_id = t.argument_begin if t.argument_begin is not None else t.call_begin
    e = pl.element()
    where = lambda tok: pl.col("output_ids").list.eval(pl.int_range(pl.len()).filter(e == tok))
    rows = (
        df.with_row_index("_r")
        .filter(pl.col("has_tool_call"))
        .select("_r", "output_ids", where(open_id).alias("_o"), where(t.call_end).alias("_c"))
    )
    # One span per open/close pair; a row whose markers do not pair up cannot parse.
    paired = rows.filter((pl.col("_o").list.len() == pl.col("_c").list.len()) & (pl.col("_o").list.len() > 0))
    calls = paired.explode("_o", "_c")
    calls = calls.with_columns((pl.col("_o") < pl.col("_c")).alias("_ordered"))
    spans = calls.filter("_ordered").select(
        "_r", pl.col("output_ids").list.slice(pl.col("_o") + 1, pl.col("_c") - pl.col("_o") - 1).alias("_span")
    )
    texts = tokenizer.batch_decode(spans["_span"].to_list(), skip_special_tokens=False) if spans.height else []
    parsed = []
    for text in texts:
        try:
            json.loads(text)
            parsed.append(True)
        except ValueError:
            parsed.append(False)
    per_call = pl.concat(
        [
            spans.select("_r").with_columns(pl.Series("_ok", parsed, pl.Boolean)),
            calls.filter(~pl.col("_ordered")).select("_r", pl.lit(False).alias("_ok")),
        ]
    )
    per_row = per_call.group_by("_r").agg(pl.col("_ok").all())
    verdict = rows.select("_r").join(per_row, on="_r", how="left").with_columns(pl.col("_ok").fill_null(False))
    out = pl.Series("tool_args_parse", [None] * n, pl.Boolean)
    if verdict.height:
        out = out.scatter(verdict["_r"], verdict["_ok"])
    return out


def _output_parts(ids: pl.Expr, profile: ModelProfile) -> dict[str, pl.Expr]:
    """Where an output's parts are (one definition for the gate's features and the training summaries):
    leading (1: a legitimate leading <think>), think_end_pos, first_tool (first tool-call marker),
    last_is_stop (1: the last id is a stop id), all Int32."""
    # Qwen3-style templates leave <think> to the model: one leading <think> is legitimate there.
    leading_allowed = not profile.generation_prompt_ends_with_think_start
    leading = ((ids.list.first() == profile.think_start_id).fill_null(False) & pl.lit(leading_allowed)).cast(pl.Int32)
    t = profile.tool_call_ids
    tool_starts = [x for x in (t.section_begin, t.call_begin) if x is not None]
    first_tool = (
        pl.min_horizontal(*[_first_pos(ids, x) for x in tool_starts]) if tool_starts else pl.lit(None, pl.Int32)
    )
    return {
        "leading": leading,
        "think_end_pos": _first_pos(ids, profile.think_end_id),
        "first_tool": first_tool,
        "last_is_stop": ids.list.last().is_in(list(profile.stop_token_ids)).fill_null(False).cast(pl.Int32),
    }


def _reasoning_len(think_end_pos: pl.Expr, leading: pl.Expr) -> pl.Expr:
    """Tokens before the think-end (after a legitimate leading <think>); null without a think-end."""
    return think_end_pos - leading


def _answer_len(think_end_pos: pl.Expr, first_tool: pl.Expr, output_len: pl.Expr, last_is_stop: pl.Expr) -> pl.Expr:
    """Tokens after the think-end up to the first tool-call marker or the stop id; null without a think-end."""
    return (
        pl.when(think_end_pos.is_null())
        .then(None)
        .otherwise((pl.coalesce(first_tool, output_len - last_is_stop) - think_end_pos - 1).clip(lower_bound=0))
        .cast(pl.Int32)
    )


def output_lengths(ids: pl.Expr, profile: ModelProfile) -> list[pl.Expr]:
    """output_len, reasoning_len, answer_len, think_end (a think-end present), has_tool_call (a call-begin
    present) of each output: exactly generation_features' definitions, without its other features."""
    parts = _output_parts(ids, profile)
    n = ids.list.len().cast(pl.Int32)
    call_begin = profile.tool_call_ids.call_begin
    return [
        n.alias("output_len"),
        _reasoning_len(parts["think_end_pos"], parts["leading"]).alias("reasoning_len"),
        _answer_len(parts["think_end_pos"], parts["first_tool"], n, parts["last_is_stop"]).alias("answer_len"),
        (ids.list.count_matches(profile.think_end_id) > 0).alias("think_end"),
        (ids.list.count_matches(call_begin) > 0 if call_begin is not None else pl.lit(False)).alias("has_tool_call"),
    ]


def _spec_metrics_consistent(columns: list[str]) -> pl.Expr:
    """False when the client flagged the row's speculative-decoding figures (generate/drafter.py:
    `spec_metrics_inconsistent:*`), null for a row without any (the server does not speculate), else True."""
    if "integrity_violations" not in columns or "spec_verify_ct" not in columns:
        return pl.lit(None, pl.Boolean)
    flagged = pl.col("integrity_violations").list.eval(pl.element().str.starts_with("spec_metrics_inconsistent"))
    has_spec = (
        pl.col("drafter_id").is_not_null()
        | pl.col("spec_verify_ct").is_not_null()
        | pl.col("spec_correct_drafts_histogram").is_not_null()
    )
    bad = flagged.list.any().fill_null(False)
    return pl.when(bad).then(False).when(has_spec).then(True).otherwise(None)


def generation_features(
    generations: pl.DataFrame,
    tokenized: pl.DataFrame | None,
    profile: ModelProfile,
    tokenizer: Any = None,
    *,
    echo_window: int = 8,
    ngram: int = 4,
    min_len_for_repetition: int = 32,
) -> pl.DataFrame:
    """One row per generation (schemas.GENERATIONS) -> scalar features.

    - `tokenized` (schemas.TOKENIZED_PROMPTS), joined on prompt_id, enables `echoes_prompt_tail`;
      without it that feature is null (not checked).
    - `tokenizer` enables `tool_args_parse` (arguments are decoded from output_ids); without it
      that feature is null (not checked).
    """
    base = _generation_base(generations, profile)
    base, echo = _with_prompt_tail(base, tokenized, echo_window)
    markers = _marker_strings(base, profile)
    ngrams = _ngram_stats(base, ngram, min_len_for_repetition)
    feats = base.with_columns(markers, *ngrams.get_columns()).with_columns(echo, *_structure_features(profile, ngram))
    feats = feats.with_columns(
        pl.when(pl.col("answer_len").is_null())
        .then(None)
        .otherwise((pl.col("answer_len") > 0) | pl.col("has_tool_call"))
        .alias("has_answer_or_tool_call"),
        _tool_args_parse(feats, profile, tokenizer),
    )
    feats = with_same_answer_counts(feats)
    return feats.drop(
        "output_ids",
        "_leading",
        "_first_tool",
        "_last_is_stop",
        "max_ngram_count",
        "distinct_ngrams",
        "markers",
        *(["_tail"] if "_tail" in feats.columns else []),
    )


OUTPUT_HASH = "output_hash"  # a hash of the row's output ids (null: no output ids)


def with_same_answer_counts(feats: pl.DataFrame) -> pl.DataFrame:
    """`same_answer_prompts`: how many different prompts (prompt_id) of the frame got exactly this row's output
    ids (1: only this one; null: no output ids). A table-level feature: over the whole shard, so a gate that
    computes features batch by batch calls this again on the concatenated frame. A cache keyed on the wrong
    field sends one answer for many prompts, each with its own rid and prompt length: only this sees it
    (expectation `same_answer_to_different_prompts`)."""
    shared = pl.col("prompt_id").n_unique().over(OUTPUT_HASH).cast(pl.Int32)
    counts = pl.when(pl.col(OUTPUT_HASH).is_null()).then(None).otherwise(shared)
    return feats.with_columns(counts.alias("same_answer_prompts"))


def _generation_base(generations: pl.DataFrame, profile: ModelProfile) -> pl.DataFrame:
    """The per-row counts and flags read straight off output_ids and the server's claims, plus the
    positions (`_leading`, `_first_tool`, `_last_is_stop`) the later features need."""
    ids = pl.col("output_ids")
    n = ids.list.len().cast(pl.Int32)
    last = ids.list.last()
    t = profile.tool_call_ids
    parts = _output_parts(ids, profile)
    leading, think_end_pos = parts["leading"], parts["think_end_pos"]
    first_tool, last_is_stop = parts["first_tool"], parts["last_is_stop"]

    return generations.select(
        pl.col("sample_id").cast(pl.String).alias(ROW_ID),
        pl.col("prompt_id").cast(pl.String),
        pl.col("source").cast(pl.String)
        if "source" in generations.columns
        else pl.lit(None, pl.String).alias("source"),
        ids,
        n.alias("output_len"),
        ids.list.count_matches(profile.think_end_id).cast(pl.Int32).alias("think_end_count"),
        think_end_pos.alias("think_end_pos"),
        ids.list.count_matches(profile.think_start_id).cast(pl.Int32).alias("think_start_count"),
        (ids.list.count_matches(profile.think_start_id).cast(pl.Int32) - leading).alias("unexpected_think_start_count"),
        leading.alias("_leading"),
        pl.col("finish_reason").cast(pl.String),
        last.cast(pl.Int64).alias("last_id"),
        (last == profile.end_of_turn_id).fill_null(False).alias("ends_with_end_of_turn"),
        (n == pl.col("completion_tokens")).fill_null(False).alias("len_matches_completion_tokens"),
        # ids as received: one outside [0, vocab_size) is no token of this model (padded or another vocab);
        # a negative id fails it too; no ids at all (output_ids null) is not in it either
        pl.when(ids.is_null())
        .then(False)
        .otherwise(((ids.list.min() >= 0) & (ids.list.max() < profile.vocab_size)).fill_null(True))
        .alias("output_ids_in_vocab"),
        # SGLang's NaN guard (spec §3.3): the last id was replaced by EOS, the finish says "NaN happened"
        (
            (pl.col("finish_matched").cast(pl.String) == '"NaN happened"').fill_null(False)
            if "finish_matched" in generations.columns
            else pl.lit(False)
        ).alias("nan_finish"),
        (
            ids.list.count_matches(t.call_begin).cast(pl.Int32) if t.call_begin is not None else pl.lit(0, pl.Int32)
        ).alias("tool_call_count"),
        first_tool.alias("_first_tool"),
        last_is_stop.alias("_last_is_stop"),
        _spec_metrics_consistent(generations.columns).alias("spec_metrics_consistent"),
        # the answer's identity (no answer: null, not judged): same_answer_prompts counts the prompts sharing it
        pl.when(n > 0).then(ids.hash()).otherwise(None).alias(OUTPUT_HASH),
    )


def _with_prompt_tail(
    base: pl.DataFrame, tokenized: pl.DataFrame | None, echo_window: int
) -> tuple[pl.DataFrame, pl.Expr]:
    """Echo: the output opens with the prompt's last `echo_window` ids (a client or server that
    returns prompt + output, or a template that re-emits the generation prompt). Without the
    tokenized prompts the feature is null (not checked)."""
    if tokenized is None:
        return base, pl.lit(None, pl.Boolean).alias("echoes_prompt_tail")
    tail = tokenized.select(
        pl.col("prompt_id").cast(pl.String),
        pl.col("input_ids").list.tail(echo_window).alias("_tail"),
    ).unique("prompt_id", keep="first")
    base = base.join(tail, on="prompt_id", how="left", maintain_order="left")
    w = pl.col("_tail").list.len()
    echo = (
        pl.when(pl.col("_tail").is_null())
        .then(None)
        .otherwise((pl.col("output_ids").list.head(w) == pl.col("_tail")) & (w > 0))
        .alias("echoes_prompt_tail")
    )
    return base, echo


def _structure_features(profile: ModelProfile, ngram: int) -> list[pl.Expr]:
    """Tool-call markers, reasoning/answer lengths and repetition, over the base, marker and n-gram columns."""
    n_grams_total = (pl.col("output_len") - ngram + 1).clip(lower_bound=1)
    return [
        (pl.col("tool_call_count") > 0).alias("has_tool_call"),
        # Markers balanced and in grammar order, and the tool-call region after </think>.
        (
            pl.col("markers").str.contains(tool_marker_grammar(profile))
            & (
                pl.col("_first_tool").is_null()
                | pl.col("think_end_pos").is_null()
                | (pl.col("_first_tool") > pl.col("think_end_pos"))
            )
        ).alias("tool_markers_ok"),
        _reasoning_len(pl.col("think_end_pos"), pl.col("_leading")).alias("reasoning_len"),
        _answer_len(
            pl.col("think_end_pos"), pl.col("_first_tool"), pl.col("output_len"), pl.col("_last_is_stop")
        ).alias("answer_len"),
        (pl.col("max_ngram_count") * ngram / pl.col("output_len")).clip(upper_bound=1.0).alias("max_ngram_coverage"),
        (1.0 - pl.col("distinct_ngrams") / n_grams_total).alias("repeated_ngram_fraction"),
    ]


# ---------------------------------------------------------------------------------------------
# training samples


def available_source_shares(tokenized: pl.DataFrame) -> dict[str, float]:
    """Each source's share of a shard's tokenized prompts: what the sources could give that shard."""
    if tokenized.height == 0 or "source" not in tokenized.columns:
        return {}
    vc = tokenized.select(pl.col("source").cast(pl.String).fill_null("(none)")).to_series().value_counts()
    return {str(k): int(v) / tokenized.height for k, v in vc.iter_rows()}


def training_features(
    samples: pl.DataFrame,
    profile: ModelProfile,
    *,
    max_total_len: int,
    available_shares: dict[str, float] | None = None,
) -> pl.DataFrame:
    """One row per training sample (schemas.TRAINING_SAMPLES) -> scalar features.

    Table-level features (`input_hash` for the duplicate rate, `source_share` for the source mix)
    are per-row columns that the suite aggregates. `source_share_excess` is the row's source's
    share of the samples minus its share of what the sources could give (`available_shares`, e.g.
    available_source_shares(tokenized prompts of the shard)): a single-source run is 0, a source
    whose rows were lost to rejects or quarantine makes the others over-represented. Null (not
    judged) without `available_shares`.
    """
    return with_training_table_features(training_row_features(samples, max_total_len=max_total_len), available_shares)


def training_row_features(samples: pl.DataFrame, *, max_total_len: int) -> pl.DataFrame:
    """The per-row part of training_features: one row of scalars per sample, batch by batch (streamed)."""
    ids = pl.col("input_ids")
    mask = pl.col("loss_mask")
    n = ids.list.len().cast(pl.Int32)
    m = mask.list.len().cast(pl.Int32)
    p = pl.col("prompt_len")
    prompt_part = mask.list.head(p)
    output_part = mask.list.slice(p)
    feats = samples.select(
        pl.col("sample_id").cast(pl.String).alias(ROW_ID),
        pl.col("source").cast(pl.String),
        n.alias("total_len"),
        p.cast(pl.Int32).alias("prompt_len"),
        (n == m).alias("lens_match"),
        ((p + pl.col("output_len") == n) & (pl.col("total_len") == n)).fill_null(False).alias("lens_consistent"),
        (
            # the mask covers exactly the ids: zeros over [0, prompt_len), ones over [prompt_len, len)
            (prompt_part.list.len() == p)
            & (output_part.list.len() == n - p)
            & (prompt_part.list.max().fill_null(0) == 0)
            & (prompt_part.list.min().fill_null(0) == 0)
            & (output_part.list.min().fill_null(1) == 1)
            & (output_part.list.max().fill_null(1) == 1)
        )
        .fill_null(False)
        .alias("mask_layout_ok"),
        mask.list.sum().cast(pl.Int32).alias("supervised_tokens"),
        (n <= max_total_len).alias("fits_max_len"),
        ids.hash().alias("input_hash"),
    )
    return feats


def with_training_table_features(feats: pl.DataFrame, available_shares: dict[str, float] | None) -> pl.DataFrame:
    """The table-level columns of training_features (source_share, source_share_excess) over the whole shard's
    row features."""
    total = max(feats.height, 1)
    feats = feats.with_columns((pl.len().over("source") / total).alias("source_share"))
    if available_shares is None:
        excess = pl.lit(None, pl.Float64)
    else:
        avail = (
            pl.col("source")
            .fill_null("(none)")
            .replace_strict(
                {str(k): float(v) for k, v in available_shares.items()}, default=0.0, return_dtype=pl.Float64
            )
        )
        excess = pl.col("source_share") - avail
    return feats.with_columns(excess.alias("source_share_excess"))
