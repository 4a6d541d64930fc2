"""The tokenize stage on tables: PROMPTS rows in, TOKENIZED_PROMPTS + TOKENIZE_REJECTS out.

Every input row lands in exactly one output frame (counts reconcile). Over-long prompts are
quarantined, never truncated: a truncated prompt would teach the drafter a context the target
model never saw.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl
import pyarrow as pa

from .. import schemas
from ..profiles import ModelProfile
from .render import PendingRender, PromptRenderer, RenderRequest

INVALID_JSON = "invalid_json"
PROMPT_TOO_LONG = "prompt_too_long"

# Rows are rendered and encoded this many at a time: large enough for the batched encode to pay
# off, small enough to bound memory on big shards and to overlap rendering with encoding.
DEFAULT_BATCH_ROWS = 1024


def _parse_json_field(raw: Any, field: str, *, nullable: bool) -> tuple[Any, str | None]:
    if raw is None:
        return (None, None) if nullable else (None, f"{field}: missing (null)")
    try:
        return json.loads(raw), None
    except (TypeError, ValueError) as e:
        return None, f"{field}: not valid JSON: {e}"


def prompt_length_problem(prompt_len: int, profile: ModelProfile, max_new_tokens: int) -> str | None:
    """Why a prompt of this length must be quarantined, or None. Shared by the pipeline and the CLI."""
    limit = min(int(profile.max_prompt_tokens), int(profile.context_length) - int(max_new_tokens))
    if prompt_len <= limit:
        return None
    return (
        f"prompt_len {prompt_len} > limit {limit} (max_prompt_tokens {profile.max_prompt_tokens}, "
        f"context_length {profile.context_length} - max_new_tokens {max_new_tokens})"
    )


def tokenize_prompts(
    prompts: pl.DataFrame,
    renderer: PromptRenderer,
    *,
    max_new_tokens: int,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Render + encode PROMPTS rows. Returns (tokenized, rejects); never raises for a bad row."""
    missing = [c for c in ("prompt_id", "source", "shard", "messages") if c not in prompts.columns]
    if missing:
        raise ValueError(f"prompts frame lacks column(s) {', '.join(missing)} (expected schemas.PROMPTS)")
    profile = renderer.profile

    ok: dict[str, list[Any]] = {name: [] for name in schemas.TOKENIZED_PROMPTS.names}
    bad: dict[str, list[Any]] = {name: [] for name in schemas.TOKENIZE_REJECTS.names}
    bad_order: list[int] = []  # input positions, to list rejects in input order

    def reject(row: dict[str, Any], reason: str, detail: str) -> None:
        bad_order.append(row["index"])
        bad["prompt_id"].append(row["prompt_id"])
        bad["source"].append(row["source"])
        bad["shard"].append(row["shard"])
        bad["reason"].append(reason)
        bad["detail"].append(detail)

    def collect(request_rows: list[dict[str, Any]], batch: PendingRender) -> None:
        for row, result in zip(request_rows, batch.results()):
            if not result.ok:
                reject(row, result.reason or "render_error", result.detail or "")
                continue
            ids = result.input_ids or []
            # Room for the answer: a prompt that leaves less than max_new_tokens of context is quarantined.
            too_long = prompt_length_problem(len(ids), profile, max_new_tokens)
            if too_long:
                reject(row, PROMPT_TOO_LONG, too_long)
                continue
            ok["prompt_id"].append(row["prompt_id"])
            ok["source"].append(row["source"])
            ok["shard"].append(row["shard"])
            ok["input_ids"].append(ids)
            ok["prompt_len"].append(len(ids))

    has_tools = "tools" in prompts.columns
    in_flight: tuple[list[dict[str, Any]], PendingRender] | None = None
    for start in range(0, prompts.height, batch_rows):
        chunk = prompts.slice(start, batch_rows)
        chunk_rows = [
            {"index": start + i, "prompt_id": p, "source": s, "shard": sh, "messages": m, "tools": t}
            for i, (p, s, sh, m, t) in enumerate(zip(
                chunk["prompt_id"].to_list(), chunk["source"].to_list(), chunk["shard"].to_list(),
                chunk["messages"].to_list(), chunk["tools"].to_list() if has_tools else [None] * chunk.height,
            ))
        ]
        requests: list[RenderRequest] = []
        request_rows: list[dict[str, Any]] = []
        for row in chunk_rows:
            messages, problem = _parse_json_field(row["messages"], "messages", nullable=False)
            tools, tools_problem = _parse_json_field(row["tools"], "tools", nullable=True)
            if problem or tools_problem:
                reject(row, INVALID_JSON, (problem or tools_problem) or "")
                continue
            # the tools JSON text is canonical (schemas.PROMPTS), so equal text means equal tools
            requests.append(RenderRequest(messages=messages, tools=tools or None, tools_key=row["tools"]))
            request_rows.append(row)
        # This chunk encodes on a worker thread while the next one is parsed and rendered; at most
        # two chunks are held at a time.
        submitted = (request_rows, renderer.submit_batch(requests))
        if in_flight is not None:
            collect(*in_flight)
        in_flight = submitted
    if in_flight is not None:
        collect(*in_flight)
    n_ok = len(ok["prompt_id"])
    ok["profile"] = [profile.name] * n_ok
    ok["tokenizer_fingerprint"] = [renderer.tokenizer_fingerprint] * n_ok
    ok["template_hash"] = [renderer.template_hash] * n_ok

    tokenized = pl.from_arrow(pa.Table.from_pydict(ok, schema=schemas.TOKENIZED_PROMPTS))
    if bad_order != sorted(bad_order):
        order = sorted(range(len(bad_order)), key=bad_order.__getitem__)
        bad = {name: [values[i] for i in order] for name, values in bad.items()}
    rejects = pl.from_arrow(pa.Table.from_pydict(bad, schema=schemas.TOKENIZE_REJECTS))
    assert isinstance(tokenized, pl.DataFrame) and isinstance(rejects, pl.DataFrame)
    if tokenized.height + rejects.height != prompts.height:  # a bug here would silently lose rows
        raise RuntimeError(f"row count mismatch: {prompts.height} in, {tokenized.height} + {rejects.height} out")
    return tokenized, rejects
