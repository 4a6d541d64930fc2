"""Human-readable reports for gates: sample previews and text histograms (Markdown).

Both return plain Markdown strings, suitable for Dagster's MarkdownMetadataValue and for the
terminal (`eagle3 inspect`). Text is decoded from output_ids for display only; nothing here
re-encodes text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import polars as pl

from ..markdown import code_span, fence
from ..profiles import ModelProfile

_BAR = 40


def _excerpt(text: str, head: int, tail: int) -> str:
    if len(text) <= head + tail + 20:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} chars ...]\n{text[-tail:]}"


def _index(ids: list[int], token: int | None, start: int = 0) -> int | None:
    if token is None:
        return None
    try:
        return ids.index(token, start)
    except ValueError:
        return None


def split_output(ids: list[int], profile: ModelProfile) -> dict[str, Any]:
    """Split raw output ids into reasoning / answer / tool-call id spans (positions, not text)."""
    t = profile.tool_call_ids
    lead = 1 if (not profile.generation_prompt_ends_with_think_start and ids[:1] == [profile.think_start_id]) else 0
    end = _index(ids, profile.think_end_id)
    body_start = (end + 1) if end is not None else len(ids)
    stop = len(ids) - 1 if ids and ids[-1] in profile.stop_token_ids else len(ids)
    starts = [
        p for p in (_index(ids, t.section_begin, body_start), _index(ids, t.call_begin, body_start)) if p is not None
    ]
    tool_start = min(starts) if starts else None
    calls: list[tuple[list[int], list[int]]] = []  # (name ids, argument ids)
    pos = body_start
    while t.call_begin is not None and t.call_end is not None:
        b = _index(ids, t.call_begin, pos)
        if b is None:
            break
        e = _index(ids, t.call_end, b + 1)
        if e is None:
            calls.append((ids[b + 1 : stop], []))
            break
        a = _index(ids, t.argument_begin, b + 1) if t.argument_begin is not None else None
        if a is not None and a < e:
            calls.append((ids[b + 1 : a], ids[a + 1 : e]))
        else:
            calls.append(([], ids[b + 1 : e]))
        pos = e + 1
    return {
        "think_end_pos": end,
        "reasoning": ids[lead : end if end is not None else stop],
        "answer": ids[body_start : tool_start if tool_start is not None else stop] if end is not None else [],
        "tool_calls": calls,
    }


PREVIEW_PROMPT_TAIL = 24  # prompt ids shown (decoded) per previewed sample


def sample_preview_markdown(
    generations: pl.DataFrame,
    tokenized: pl.DataFrame | None,
    tokenizer: Any,
    profile: ModelProfile,
    n: int = 3,
    *,
    sample_ids: Sequence[str] | None = None,
    excerpt_chars: int = 400,
) -> str:
    """A few samples: think-end position, reasoning / answer excerpts and tool calls.

    Picks `sample_ids` if given, else the first `n` rows.
    """
    df = generations
    if sample_ids is not None:
        df = df.filter(pl.col("sample_id").is_in(list(sample_ids)))
    df = df.head(n)
    prompts: dict[str, list[int]] = {}
    lengths: dict[str, int] = {}
    if tokenized is not None and df.height:
        sub = tokenized.filter(pl.col("prompt_id").is_in(df["prompt_id"].to_list()))
        prompts = dict(zip(sub["prompt_id"].to_list(), sub["input_ids"].to_list()))
        if "prompt_len" in sub.columns:
            # a prompt view (generate.inputs.prompt_view) holds only the tail of input_ids
            lengths = {k: v for k, v in zip(sub["prompt_id"].to_list(), sub["prompt_len"].to_list()) if v is not None}
    dec = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
    out: list[str] = [f"### Sample preview ({df.height} of {generations.height}, profile `{profile.name}`)"]
    for row in df.iter_rows(named=True):
        ids = list(row["output_ids"] or [])
        parts = split_output(ids, profile)
        pos = parts["think_end_pos"]
        out.append("")
        out.append(f"#### {code_span(str(row['sample_id']))}")
        out.append(
            f"- prompt {code_span(str(row.get('prompt_id')))} source {code_span(str(row.get('source')))}, "
            f"finish_reason {code_span(str(row.get('finish_reason')))}, "
            f"{len(ids)} output ids (completion_tokens {row.get('completion_tokens')})"
        )
        out.append(
            f"- think-end {profile.think_end_id} at position **{pos if pos is not None else 'MISSING'}**"
            f" (count {ids.count(profile.think_end_id)}); last id {ids[-1] if ids else None}"
        )
        pid = row.get("prompt_id")
        p_ids = prompts.get(pid) if pid is not None else None
        if pid is not None and p_ids is not None:
            out.append(f"- prompt tail ({lengths.get(pid, len(p_ids))} ids):")
            out.append(fence(_excerpt(dec(p_ids[-PREVIEW_PROMPT_TAIL:]), 0, 200)))
        out.append(f"- reasoning ({len(parts['reasoning'])} ids):")
        out.append(fence(_excerpt(dec(parts["reasoning"]), excerpt_chars // 2, excerpt_chars // 2)))
        out.append(f"- answer ({len(parts['answer'])} ids):")
        out.append(fence(_excerpt(dec(parts["answer"]), excerpt_chars // 2, excerpt_chars // 2)))
        if parts["tool_calls"]:
            out.append(f"- tool calls ({len(parts['tool_calls'])}):")
            for name_ids, arg_ids in parts["tool_calls"]:
                name = dec(name_ids).strip()
                out.append(f"  - {code_span(name or '?')}")
                out.append(fence(_excerpt(dec(arg_ids), excerpt_chars // 2, excerpt_chars // 2)))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------


def _numeric_histogram(s: pl.Series, bins: int) -> list[str]:
    v = s.drop_nulls().cast(pl.Float64)
    if v.len() == 0:
        return ["(no values)"]
    lo, hi = cast(float, v.min()), cast(float, v.max())  # a non-empty Float64 column
    integer = s.dtype.is_integer()
    if integer:
        # Integer bins [a, a+width-1] with a whole width, so every label is exact.
        width = float(max(1, math.ceil((hi - lo + 1) / bins)))
        nb = int((hi - lo) // width) + 1
    else:
        width = (hi - lo) / bins or 1.0
        nb = bins if hi > lo else 1
    idx = ((v - lo) / width).floor().cast(pl.Int64).clip(0, nb - 1)
    counts = [0] * nb
    for i, c in zip(*idx.value_counts().to_dict(as_series=False).values()):
        counts[i] = c
    labels = []
    for i in range(nb):
        a = lo + i * width
        if integer:
            labels.append(f"{int(a)}" if width == 1 else f"[{int(a)}, {int(a + width - 1)}]")
        else:
            labels.append(f"[{a:.3g}, {a + width:.3g}" + (")" if i < nb - 1 else "]"))
    top = max(counts) or 1
    w = max(len(x) for x in labels)
    cw = max(len(str(c)) for c in counts)
    return [
        f"{lab:>{w}} | {c:>{cw}} | {'█' * (max(1, round(_BAR * c / top)) if c else 0)}"
        for lab, c in zip(labels, counts)
    ]


def _categorical_table(s: pl.Series, top: int = 10) -> list[str]:
    vc = s.cast(pl.String).fill_null("(null)").value_counts(sort=True).head(top)
    total = max(s.len(), 1)
    name = vc.columns[0]
    peak = max(vc["count"].to_list() or [1])
    return [
        f"{k!s:>12} | {c:>8} | {100 * c / total:5.1f}% | {'█' * max(1, round(_BAR * c / peak))}"
        for k, c in zip(vc[name].to_list(), vc["count"].to_list())
    ]


def histograms_markdown(features: pl.DataFrame, columns: Sequence[str], *, bins: int = 10) -> str:
    """Markdown: per column a stats line and a text histogram (numeric) or value table (other)."""
    out: list[str] = []
    for col in columns:
        if col not in features.columns:
            out.append(f"**{col}**: not in the feature frame\n")
            continue
        s = features[col]
        nulls = s.null_count()
        if s.dtype.is_numeric() and s.dtype != pl.Boolean:
            v = s.drop_nulls()
            if v.len():
                q = lambda p, v=v: v.quantile(p, interpolation="nearest")
                # numbers (a numeric column), whatever polars' stubs allow
                lo: Any = v.min()
                hi: Any = v.max()
                mean: Any = v.mean()
                stats = (
                    f"n={v.len()} nulls={nulls} min={lo} p50={q(0.5)} p90={q(0.9)} "
                    f"p99={q(0.99)} max={hi} mean={mean:.4g}"
                )
            else:
                stats = f"n=0 nulls={nulls}"
            body = _numeric_histogram(s, bins)
        else:
            stats = f"n={s.len() - nulls} nulls={nulls}"
            body = _categorical_table(s)
        out.append(f"**{col}** — {stats}")
        out.append(fence("\n".join(body)))
    return "\n".join(out)
