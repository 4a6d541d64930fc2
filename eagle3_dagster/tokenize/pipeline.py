"""The tokenize stage on tables: PROMPTS rows in, TOKENIZED_PROMPTS + TOKENIZE_REJECTS out.

Every input row lands in exactly one output frame (counts reconcile). Over-long prompts are
quarantined, never truncated: a truncated prompt would teach the drafter a context the target
model never saw.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import polars as pl
import pyarrow as pa

from .. import schemas
from ..profiles import ModelProfile
from .control_text import CONTROL_TEXT_POLICIES
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
    control_text: str | Mapping[str, str] = "reject",
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Render + encode PROMPTS rows. Returns (tokenized, rejects); never raises for a bad row.

    `control_text`: the policy for literal control-token text in the data (tokenize/control_text.py),
    one for all rows or per source name (the source YAML's `control_text`; absent sources: reject).
    """
    policies, default_policy = _control_text_policies(control_text)
    missing = [c for c in ("prompt_id", "source", "shard", "messages") if c not in prompts.columns]
    if missing:
        raise ValueError(f"prompts frame lacks column(s) {', '.join(missing)} (expected schemas.PROMPTS)")
    run = _TokenizeRun(renderer, max_new_tokens)
    has_tools = "tools" in prompts.columns
    in_flight: tuple[int, RowKeys, list[int], PendingRender] | None = None
    for start in range(0, prompts.height, batch_rows):
        chunk = prompts.slice(start, batch_rows)
        row_keys = (chunk["prompt_id"].to_list(), chunk["source"].to_list(), chunk["shard"].to_list())
        tools_col = chunk["tools"].to_list() if has_tools else [None] * chunk.height
        requests, offsets = run.parse_chunk(
            start, row_keys, chunk["messages"].to_list(), tools_col, policies, default_policy
        )
        # This chunk encodes on a worker thread while the next one is parsed and rendered; at most
        # two chunks are held at a time.
        submitted = (start, row_keys, offsets, renderer.submit_batch(requests))
        if in_flight is not None:
            run.collect(*in_flight)
        in_flight = submitted
    if in_flight is not None:
        run.collect(*in_flight)
    tokenized, rejects = run.frames()
    if tokenized.height + rejects.height != prompts.height:  # a bug here would silently lose rows
        raise RuntimeError(f"row count mismatch: {prompts.height} in, {tokenized.height} + {rejects.height} out")
    return tokenized, rejects


RowKeys = tuple[list[Any], list[Any], list[Any]]  # a chunk's prompt_id, source and shard columns


def _control_text_policies(control_text: str | Mapping[str, str]) -> tuple[Mapping[str, str], str]:
    """(policy per source, the policy of any other source); an unknown policy is a ValueError."""
    policies = control_text if isinstance(control_text, Mapping) else {}
    default_policy = control_text if isinstance(control_text, str) else "reject"
    for name, policy in [*policies.items(), ("*", default_policy)]:
        if policy not in CONTROL_TEXT_POLICIES:
            raise ValueError(
                f"control_text for source {name!r}: {policy!r} is not one of {', '.join(CONTROL_TEXT_POLICIES)}"
            )
    return policies, default_policy


class _TokenizeRun:
    """The tokenized rows and the rejects of one tokenize_prompts call, as columns being filled.

    Per-row work is plain list operations (prompt_id, source, shard lists per chunk = row keys): with
    native rendering the per-row bookkeeping is a visible share of the throughput."""

    def __init__(self, renderer: PromptRenderer, max_new_tokens: int) -> None:
        self.renderer, self.profile, self.max_new_tokens = renderer, renderer.profile, max_new_tokens
        self.ok: dict[str, list[Any]] = {name: [] for name in schemas.TOKENIZED_PROMPTS.names}
        self.bad: dict[str, list[Any]] = {name: [] for name in schemas.TOKENIZE_REJECTS.names}
        self.bad_order: list[int] = []  # input positions, to list rejects in input order
        profile = self.profile
        self.length_limit = min(int(profile.max_prompt_tokens), int(profile.context_length) - int(max_new_tokens))

    def reject(self, position: int, row_keys: RowKeys, offset: int, reason: str, detail: str) -> None:
        bad = self.bad
        self.bad_order.append(position)
        bad["prompt_id"].append(row_keys[0][offset])
        bad["source"].append(row_keys[1][offset])
        bad["shard"].append(row_keys[2][offset])
        bad["reason"].append(reason)
        bad["detail"].append(detail)

    def parse_chunk(
        self,
        start: int,
        row_keys: RowKeys,
        messages_col: list[Any],
        tools_col: list[Any],
        policies: Mapping[str, str],
        default_policy: str,
    ) -> tuple[list[RenderRequest], list[int]]:
        """The render requests of a chunk's rows and their offsets in it; a row whose JSON does not parse
        is rejected here."""
        loads = json.loads
        requests: list[RenderRequest] = []
        offsets: list[int] = []
        for offset, (raw_messages, raw_tools) in enumerate(zip(messages_col, tools_col)):
            try:  # the common case inline; _parse_json_field words the problems
                messages = loads(raw_messages)
                tools = None if raw_tools is None else loads(raw_tools)
            except Exception:
                messages, problem = _parse_json_field(raw_messages, "messages", nullable=False)
                tools, tools_problem = _parse_json_field(raw_tools, "tools", nullable=True)
                self.reject(start + offset, row_keys, offset, INVALID_JSON, (problem or tools_problem) or "")
                continue
            # the tools JSON text is canonical (schemas.PROMPTS), so equal text means equal tools
            policy = policies.get(row_keys[1][offset], default_policy) if policies else default_policy
            requests.append(
                RenderRequest(messages=messages, tools=tools or None, tools_key=raw_tools, control_text=policy)
            )
            offsets.append(offset)
        return requests, offsets

    def collect(self, start: int, row_keys: RowKeys, offsets: list[int], batch: PendingRender) -> None:
        """A chunk's encoded rows: kept, or rejected for a render problem or no room for the answer."""
        prompt_ids, sources, shards = row_keys
        ok = self.ok
        ok_prompt_id, ok_source, ok_shard = ok["prompt_id"], ok["source"], ok["shard"]
        ok_input_ids, ok_prompt_len, ok_control = ok["input_ids"], ok["prompt_len"], ok["control_text_in_content"]
        for offset, result in zip(offsets, batch.results()):
            if result.reason is not None:
                self.reject(start + offset, row_keys, offset, result.reason or "render_error", result.detail or "")
                continue
            ids = result.input_ids or []
            # Room for the answer: a prompt that leaves less than max_new_tokens of context is quarantined.
            if len(ids) > self.length_limit:
                too_long = prompt_length_problem(len(ids), self.profile, self.max_new_tokens)
                if too_long:
                    self.reject(start + offset, row_keys, offset, PROMPT_TOO_LONG, too_long)
                    continue
            ok_prompt_id.append(prompt_ids[offset])
            ok_source.append(sources[offset])
            ok_shard.append(shards[offset])
            ok_input_ids.append(ids)
            ok_prompt_len.append(len(ids))
            ok_control.append(result.control_text_in_content)

    def frames(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(tokenized, rejects) as frames; the rejects in input order."""
        ok, bad = self.ok, self.bad
        n_ok = len(ok["prompt_id"])
        ok["profile"] = [self.profile.name] * n_ok
        ok["tokenizer_fingerprint"] = [self.renderer.tokenizer_fingerprint] * n_ok
        ok["template_hash"] = [self.renderer.template_hash] * n_ok
        tokenized = pl.from_arrow(pa.Table.from_pydict(ok, schema=schemas.TOKENIZED_PROMPTS))
        if self.bad_order != sorted(self.bad_order):
            order = sorted(range(len(self.bad_order)), key=self.bad_order.__getitem__)
            bad = {name: [values[i] for i in order] for name, values in bad.items()}
        rejects = pl.from_arrow(pa.Table.from_pydict(bad, schema=schemas.TOKENIZE_REJECTS))
        assert isinstance(tokenized, pl.DataFrame) and isinstance(rejects, pl.DataFrame)
        return tokenized, rejects
