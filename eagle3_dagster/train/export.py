"""Exports from a snapshot, in the shapes trainers read as they are.

- `specforge_prompts.jsonl` (token level): one object per sample, `{"id", "input_ids", "loss_mask"}` —
  pre-tokenized, token-exact, EVERY row (also the non-text-exact ones); SpecForge's ONLINE path
  (`data.prompts_path`) and vllm speculators' `prepare_data.py --data` (speculator-format rows pass
  through) read it as it is.
- `specforge_preformatted.jsonl` (text level): `{"id", "text"}`, text = the row's ids decoded with
  special tokens kept — SpecForge's OFFLINE path (`data.is_preformatted` / `--is-preformatted`, with
  `train_only_last_turn` and its `kimi-k2-thinking` / `qwen3-thinking` template) re-tokenizes it to the
  training row's ids and supervises the generated turn. Only rows for which that holds are written:
  non-text-exact rows (non-canonical tokenization) are LEFT OUT and counted in the manifest.
- `conversations.jsonl` (text level): `{"id", "conversations": [{"role", "content", "reasoning_content"?,
  "tool_calls"?, "tool_call_id"?}], "tools", "text_exact", "text_mismatch_pos"}` — EVERY row, the
  non-text-exact ones FLAGGED; for trainers that render it with a chat template themselves (SpecForge's
  `train_data_path`, speculators' /render route) — not token-exact that way: see docs/exports.md. Tool calls in
  OpenAI's shape everywhere: `function.arguments` is a JSON string; in the generated turn it is the
  model's bytes exactly.

Each exporter returns its manifest entry: rows written, rows flagged or left out, and how many rows
SpecForge reproduces exactly (`specforge_exact_rows`, with how that was established).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import polars as pl

from ..storage import PathLike, TextSink, as_data_path, read_parquet
from .conversations import openai_tool_calls

SPECFORGE_FILE = "exports/specforge_prompts.jsonl"
PREFORMATTED_FILE = "exports/specforge_preformatted.jsonl"
CONVERSATIONS_FILE = "exports/conversations.jsonl"

# SpecForge 0.2.0's TEMPLATE_REGISTRY entries for our profiles (specforge/data/template.py):
# (template name, assistant_header, end_of_turn_token). tests/train/test_specforge_lane.py checks these
# against the installed SpecForge and proves check_preformatted() agrees with its own preprocessing.
SPECFORGE_TEMPLATES: dict[str, tuple[str, str, str]] = {
    "kimi-k2.5": ("kimi-k2-thinking", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
    "qwen3": ("qwen3-thinking", "<|im_start|>assistant\n", "<|im_end|>\n"),
}
BATCH_ROWS = 256
CHECKED_BY = (
    "eagle3 check_preformatted (SpecForge 0.2.0 preprocess_conversations, is_preformatted=True, "
    "train_only_last_turn=True; agreement proven by tests/train/test_specforge_lane.py)"
)


def _snapshot_frame(snapshot_dir: PathLike, columns: list[str]) -> pl.DataFrame:
    files = as_data_path(snapshot_dir).joinpath("training_samples").glob("shard=*.parquet")
    if not files:
        return pl.DataFrame(schema=dict.fromkeys(columns, pl.String))
    optional = [c for c in ("text_exact", "text_mismatch_pos") if c in columns]
    try:
        df = read_parquet(files, columns=columns)
    except Exception:  # shards written before the text_exact columns existed: those read as null (not known)
        df = read_parquet(files, columns=[c for c in columns if c not in optional])
        df = df.with_columns(*(pl.lit(None).alias(c) for c in optional))
    return df.select(columns).sort("sample_id")


def _write_jsonl(path: PathLike, rows) -> int:
    """Atomic: a local temporary file, renamed (local data) or uploaded in one call (object storage)."""
    sink = TextSink(path)
    n = 0
    try:
        for row in rows:
            sink.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
    except BaseException:
        sink.abort()
        raise
    sink.commit()
    return n


def _not_text_exact(df: pl.DataFrame) -> int:
    return int((df["text_exact"] == False).sum() or 0) if df.height else 0  # noqa: E712 (null = not known)


def export_specforge_prompts(snapshot_dir: PathLike, exports_dir: PathLike) -> dict[str, Any]:
    snapshot_dir = as_data_path(snapshot_dir)
    df = _snapshot_frame(snapshot_dir, ["sample_id", "input_ids", "loss_mask", "total_len", "text_exact"])
    n = _write_jsonl(
        snapshot_dir / SPECFORGE_FILE,
        (
            {"id": r["sample_id"], "input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}
            for r in df.iter_rows(named=True)
        ),
    )
    max_len = int(df.select(pl.col("total_len").max()).item() or 0) if df.height else 0
    return {
        SPECFORGE_FILE: {
            "rows": n,
            "format": "specforge prompts_path (input_ids, loss_mask): SpecForge online",
            "rows_not_text_exact": _not_text_exact(df),  # kept: token level
            "specforge_exact_rows": n,
            "max_total_len": max_len,
            "specforge_exact_check": f"token level, copied ids; exact for every row when data.max_length >= {max_len}",
        }
    }


def _encode_many(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def check_preformatted_batch(
    rows: list[tuple[list[int], int]], tokenizer: Any, profile_name: str
) -> list[tuple[str, str | None]]:
    """For each (input_ids, prompt_len): (text, None) when SpecForge's offline preformatted route reproduces
    the row exactly, else (text, reason).

    Mirrors SpecForge 0.2.0 (GeneralParser.parse with preformatted=True, train_only_last_turn=True): it
    encodes the text, matches `header(.*?(?:end_of_turn|$))` over it, keeps the last match and maps its
    characters to tokens by the lengths of encode(text[:start]) and encode(text[:end]). Exact: its ids
    are input_ids and the supervised span is the generated ids (optionally also the prefilled `<think>`
    at prompt_len - 1, SpecForge's convention for templates that prefill it). Batched encodes.
    """
    texts = tokenizer.batch_decode(
        [list(ids) for ids, _ in rows], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    if profile_name not in SPECFORGE_TEMPLATES:
        return [(t, "no_specforge_template") for t in texts]
    _, header, eot = SPECFORGE_TEMPLATES[profile_name]
    full = _encode_many(tokenizer, texts)
    pattern = re.compile(re.escape(header) + r"([\s\S]*?(?:" + re.escape(eot) + "|$))", re.DOTALL)  # SpecForge's
    spans: list[tuple[int, int] | None] = []
    for t in texts:
        matches = list(pattern.finditer(t))  # SpecForge takes the last match
        spans.append((matches[-1].start(1), matches[-1].end(1)) if matches else None)
    prefix_texts = [t[: sp[0]] for t, sp in zip(texts, spans) if sp is not None]
    end_texts = [t[: sp[1]] for t, sp in zip(texts, spans) if sp is not None and sp[1] != len(t)]
    prefix_lens = iter(len(x) for x in _encode_many(tokenizer, prefix_texts))
    end_lens = iter(len(x) for x in _encode_many(tokenizer, end_texts))
    out: list[tuple[str, str | None]] = []
    for (ids, prompt_len), text, enc, sp in zip(rows, texts, full, spans):
        if sp is None:
            out.append((text, "supervised_span_differs"))
            continue
        s_tok = next(prefix_lens)
        e_tok = len(enc) if sp[1] == len(text) else next(end_lens)
        if enc != list(ids):
            out.append((text, "not_text_exact"))
        elif e_tok != len(ids) or s_tok not in (prompt_len, prompt_len - 1):
            out.append((text, "supervised_span_differs"))
        else:
            out.append((text, None))
    return out


def check_preformatted(
    input_ids: list[int], prompt_len: int, tokenizer: Any, profile_name: str
) -> tuple[str, str | None]:
    """check_preformatted_batch for one row."""
    return check_preformatted_batch([(input_ids, prompt_len)], tokenizer, profile_name)[0]


def make_preformatted_exporter(profile_name: str, tokenizer: Any | Callable[[], Any]) -> Callable[..., dict[str, Any]]:
    """The `specforge_preformatted.jsonl` exporter for one profile (the tokenizer may be given lazily)."""

    def export_specforge_preformatted(snapshot_dir: PathLike, exports_dir: PathLike) -> dict[str, Any]:
        snapshot_dir = as_data_path(snapshot_dir)
        tok = tokenizer() if callable(tokenizer) and not hasattr(tokenizer, "encode") else tokenizer
        df = _snapshot_frame(snapshot_dir, ["sample_id", "input_ids", "prompt_len", "total_len", "text_exact"])
        left_out: dict[str, int] = {}

        def rows():
            for chunk in df.iter_slices(BATCH_ROWS):
                todo = []
                for r in chunk.iter_rows(named=True):
                    if r["text_exact"] is False:  # known non-canonical: no need to re-encode it to know
                        left_out["not_text_exact"] = left_out.get("not_text_exact", 0) + 1
                    else:
                        todo.append(r)
                checked = check_preformatted_batch([(r["input_ids"], r["prompt_len"]) for r in todo], tok, profile_name)
                for r, (text, reason) in zip(todo, checked):
                    if reason is not None:
                        left_out[reason] = left_out.get(reason, 0) + 1
                        continue
                    yield {"id": r["sample_id"], "text": text}

        n = _write_jsonl(snapshot_dir / PREFORMATTED_FILE, rows())
        template = SPECFORGE_TEMPLATES.get(profile_name, (None,))[0]
        max_len = int(df.select(pl.col("total_len").max()).item() or 0) if df.height else 0
        return {
            PREFORMATTED_FILE: {
                "rows": n,
                "format": "specforge preformatted text (text): SpecForge offline",
                "snapshot_rows": df.height,
                "rows_left_out": sum(left_out.values()),
                "left_out_by_reason": left_out,
                "specforge_exact_rows": n if template else None,
                "specforge_exact_check": CHECKED_BY
                if template
                else f"not measured: no SpecForge template for {profile_name}",
                "specforge_settings": {
                    "data.chat_template": template,
                    "data.is_preformatted": True,
                    "data.train_only_last_turn": True,
                    "data.max_length": max_len,
                },
            }
        }

    return export_specforge_preformatted


def export_conversations(snapshot_dir: PathLike, exports_dir: PathLike) -> dict[str, Any]:
    snapshot_dir = as_data_path(snapshot_dir)
    df = _snapshot_frame(snapshot_dir, ["sample_id", "conversation", "tools", "text_exact", "text_mismatch_pos"])

    def rows():
        for r in df.iter_rows(named=True):
            yield {
                "id": r["sample_id"],
                "conversations": openai_tool_calls(json.loads(r["conversation"])),
                "tools": json.loads(r["tools"]) if r["tools"] else [],
                "text_exact": r["text_exact"],
                "text_mismatch_pos": r["text_mismatch_pos"],
            }

    n = _write_jsonl(snapshot_dir / CONVERSATIONS_FILE, rows())
    return {
        CONVERSATIONS_FILE: {
            "rows": n,
            "format": "conversations (re-rendered by the trainer's chat template); tool-call arguments as JSON strings",
            "rows_not_text_exact": _not_text_exact(df),  # flagged per row: text_exact false + text_mismatch_pos
            "specforge_exact_rows": None,
            "specforge_exact_check": "not measured in the pipeline: SpecForge re-renders conversations with the chat "
            "template (Kimi-K2.5 drops the reasoning of the final turn, a default system prompt is "
            "injected, tool-call arguments are re-serialized); use specforge_preformatted.jsonl",
        }
    }


EXPORTERS = (export_specforge_prompts, export_conversations)


def exporters_for(profile_name: str, tokenizer: Any | Callable[[], Any]) -> tuple[Callable[..., dict[str, Any]], ...]:
    """Every export of a snapshot for one model profile (the preformatted one needs its tokenizer)."""
    return (export_specforge_prompts, make_preformatted_exporter(profile_name, tokenizer), export_conversations)
