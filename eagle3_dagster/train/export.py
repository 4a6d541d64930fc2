"""Exports from a snapshot, in the shapes trainers read as they are.

- `specforge_prompts.jsonl`: one object per sample, `{"id", "input_ids", "loss_mask"}` —
  pre-tokenized, token-exact; the safest input because no trainer re-tokenizes it.
- `conversations.jsonl`: `{"id", "conversations": [{"role", "content", "reasoning_content"?,
  "tool_calls"?, "tool_call_id"?}], "tools"}` — for SpecForge's `train_data_path` and for
  speculators, which render it with the chat template themselves.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from ..storage import PathLike, TextSink, as_data_path, read_parquet

SPECFORGE_FILE = "exports/specforge_prompts.jsonl"
CONVERSATIONS_FILE = "exports/conversations.jsonl"


def _snapshot_frame(snapshot_dir: PathLike, columns: list[str]) -> pl.DataFrame:
    files = as_data_path(snapshot_dir).joinpath("training_samples").glob("shard=*.parquet")
    if not files:
        return pl.DataFrame(schema=dict.fromkeys(columns, pl.String))
    return read_parquet(files, columns=columns).sort("sample_id")


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


def export_specforge_prompts(snapshot_dir: PathLike, exports_dir: PathLike) -> dict[str, Any]:
    snapshot_dir = as_data_path(snapshot_dir)
    df = _snapshot_frame(snapshot_dir, ["sample_id", "input_ids", "loss_mask"])
    n = _write_jsonl(
        snapshot_dir / SPECFORGE_FILE,
        ({"id": r["sample_id"], "input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in df.iter_rows(named=True)),
    )
    return {SPECFORGE_FILE: {"rows": n, "format": "specforge prompts_path (input_ids, loss_mask)"}}


def export_conversations(snapshot_dir: PathLike, exports_dir: PathLike) -> dict[str, Any]:
    snapshot_dir = as_data_path(snapshot_dir)
    df = _snapshot_frame(snapshot_dir, ["sample_id", "conversation", "tools"])

    def rows():
        for r in df.iter_rows(named=True):
            yield {
                "id": r["sample_id"],
                "conversations": json.loads(r["conversation"]),
                "tools": json.loads(r["tools"]) if r["tools"] else [],
            }

    n = _write_jsonl(snapshot_dir / CONVERSATIONS_FILE, rows())
    return {CONVERSATIONS_FILE: {"rows": n, "format": "conversations (SpecForge train_data_path, speculators)"}}


EXPORTERS = (export_specforge_prompts, export_conversations)
