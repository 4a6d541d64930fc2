"""Generations -> conversations (prompt messages + the parsed assistant turn), round-trip checked."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from ..profiles import ModelProfile
from ..tokenize.parse import IdBatch, parse_generations_batch, round_trip_mismatches

PARSE_BATCH = 256  # samples parsed, decoded and re-encoded per batch

CONVERSATION_FAILURES_SCHEMA: dict[str, Any] = {"row_id": pl.String, "reasons": pl.List(pl.String)}
CONVERSATIONS_SCHEMA: dict[str, Any] = {
    "sample_id": pl.String,
    "conversation": pl.String,
    "tools": pl.String,
    "text_exact": pl.Boolean,
    "text_mismatch_pos": pl.Int32,
}


def openai_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every `tool_calls[].function.arguments` as OpenAI's shape: a JSON string.

    A string (the generated turn: exactly the bytes the model emitted) is kept byte for byte; a dict
    (history turns, parsed at ingest) becomes `json.dumps(args, ensure_ascii=False)`, the exact text
    the Kimi-K2.5 and Qwen3 chat templates rendered into the prompt the model saw.
    """
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(calls, list) and any(
            isinstance(c, dict)
            and isinstance(c.get("function"), dict)
            and not isinstance(c["function"].get("arguments", ""), str)
            for c in calls
        ):
            fixed = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and not isinstance(fn.get("arguments", ""), str):
                    c = {**c, "function": {**fn, "arguments": json.dumps(fn["arguments"], ensure_ascii=False)}}
                fixed.append(c)
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def parse_generations(
    generations: pl.DataFrame, prompts: pl.DataFrame, profile: ModelProfile, tokenizer: Any
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
    """Return (sample_id -> conversation JSON + tools JSON + text_exact flag, failures with reasons, counts).

    A sample fails (quarantine, reason codes) when its parse reports a problem. A clean parse whose text
    does not encode back to the generated ids is NOT a failure: the row is kept with `text_exact = false`
    and the first differing output position (`text_mismatch_pos`), so token-level tables keep it and
    text-level exports can flag or exclude it. counts: parsed = ok + parse_failures; text_exact_false
    counts the kept rows whose text does not re-encode to their ids.
    """
    by_prompt = {
        r["prompt_id"]: (r["messages"], r["tools"])
        for r in prompts.select("prompt_id", "messages", "tools").iter_rows(named=True)
    }
    ok_rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    round_trip_ok = 0
    for k in range(0, generations.height, PARSE_BATCH):
        chunk = generations.slice(k, PARSE_BATCH)
        sample_ids = chunk.get_column("sample_id").to_list()
        prompt_ids = chunk.get_column("prompt_id").to_list()
        known = [p in by_prompt for p in prompt_ids]
        outputs = IdBatch(chunk.get_column("output_ids").filter(pl.Series(known, dtype=pl.Boolean)))
        parsed = parse_generations_batch(outputs, profile, tokenizer)
        mismatches = iter(round_trip_mismatches(outputs, parsed, profile, tokenizer))
        parses = iter(parsed)
        for sample_id, prompt_id, is_known in zip(sample_ids, prompt_ids, known):
            if not is_known:
                failures.append({"row_id": sample_id, "reasons": ["prompt_missing"]})
                continue
            p, mismatch = next(parses), next(mismatches)
            round_trip_ok += mismatch is None
            if p.problems:
                failures.append({"row_id": sample_id, "reasons": list(p.problems)})
                continue
            msgs_json, tools_json = by_prompt[prompt_id]
            conversation = openai_tool_calls(json.loads(msgs_json)) + [p.assistant_message()]
            ok_rows.append(
                {
                    "sample_id": sample_id,
                    "conversation": json.dumps(conversation, ensure_ascii=False, sort_keys=True),
                    "tools": tools_json,
                    "text_exact": mismatch is None,
                    "text_mismatch_pos": mismatch,
                }
            )
    ok = pl.DataFrame(ok_rows, schema=CONVERSATIONS_SCHEMA)
    fail = pl.DataFrame(failures, schema=CONVERSATION_FAILURES_SCHEMA)
    counts = {
        "parsed": generations.height,
        "round_trip_ok": round_trip_ok,
        "parse_failures": fail.height,
        "text_exact_false": int((~ok["text_exact"]).sum()) if ok.height else 0,
    }
    return ok, fail, counts
