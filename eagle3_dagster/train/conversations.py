"""Generations -> conversations (prompt messages + the parsed assistant turn), round-trip checked."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from ..profiles import ModelProfile
from .parse import parse_generation, round_trips

CONVERSATION_FAILURES_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {"row_id": pl.String, "reasons": pl.List(pl.String)}


def parse_generations(
    generations: pl.DataFrame, prompts: pl.DataFrame, profile: ModelProfile, tokenizer: Any
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
    """Return (sample_id -> conversation JSON + tools JSON, failures with reasons, counts).

    A sample fails when its parse reports a problem or when the parsed turn does not encode back
    to the generated ids (round_trip_mismatch).
    """
    by_prompt = {r["prompt_id"]: (r["messages"], r["tools"]) for r in prompts.select("prompt_id", "messages", "tools").iter_rows(named=True)}
    ok_rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    round_trip_ok = 0
    for r in generations.select("sample_id", "prompt_id", "output_ids").iter_rows(named=True):
        msgs_json, tools_json = by_prompt.get(r["prompt_id"], (None, None))
        if msgs_json is None:
            failures.append({"row_id": r["sample_id"], "reasons": ["prompt_missing"]})
            continue
        parsed = parse_generation(r["output_ids"], profile, tokenizer)
        reasons = list(parsed.problems)
        if round_trips(r["output_ids"], parsed, profile, tokenizer):
            round_trip_ok += 1
        else:
            reasons.append("round_trip_mismatch")
        if reasons:
            failures.append({"row_id": r["sample_id"], "reasons": reasons})
            continue
        conversation = json.loads(msgs_json) + [parsed.assistant_message()]
        ok_rows.append({
            "sample_id": r["sample_id"],
            "conversation": json.dumps(conversation, ensure_ascii=False, sort_keys=True),
            "tools": tools_json,
        })
    ok = pl.DataFrame(ok_rows, schema={"sample_id": pl.String, "conversation": pl.String, "tools": pl.String})
    fail = pl.DataFrame(failures, schema=CONVERSATION_FAILURES_SCHEMA)
    counts = {"parsed": generations.height, "round_trip_ok": round_trip_ok, "parse_failures": fail.height}
    return ok, fail, counts
