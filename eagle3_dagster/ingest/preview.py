"""The `prompts` asset's preview: the first prompts with their last user/tool turn, as Markdown.

Prompt text is a dataset's text: it is shown in code fences (eagle3_dagster/markdown.py), never as
Markdown, so an image link in a prompt is not fetched by the browser of whoever opens the asset.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from ..markdown import code_span, fence

PREVIEW_TEXT_CHARS = 200  # characters of the last user/tool turn shown per prompt


def _last_turn_text(messages: list[dict[str, Any]]) -> str:
    last = next((m for m in reversed(messages) if m.get("role") in ("user", "tool")), messages[-1] if messages else {})
    content = last.get("content", "")
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def prompts_preview_markdown(prompts: pl.DataFrame, n: int = 8) -> str:
    """Per prompt (the first `n` rows of prompts.parquet): a line with its id, source, shard, turns and
    tools, then the last user/tool turn (first PREVIEW_TEXT_CHARS characters) in a code fence."""
    df = prompts.head(n)
    out = [f"### The first {df.height} prompt(s)"]
    for row in df.iter_rows(named=True):
        msgs = json.loads(row["messages"])
        tools = len(json.loads(row["tools"])) if row["tools"] else 0
        text = _last_turn_text(msgs)
        shown = text[:PREVIEW_TEXT_CHARS] + (
            f" [... {len(text) - PREVIEW_TEXT_CHARS} more chars]" if len(text) > PREVIEW_TEXT_CHARS else ""
        )
        out.append("")
        out.append(
            f"- {code_span(str(row['prompt_id'])[:12])} source {code_span(str(row['source']))}, shard {row['shard']}, "
            f"{row['n_messages']} turn(s), {tools} tool(s); last user/tool turn:"
        )
        out.append(fence(shown))
    return "\n".join(out)
