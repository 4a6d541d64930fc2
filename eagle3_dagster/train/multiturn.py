"""Training rows for the turns of `regenerate: all_turns` conversations (generate/multiturn.py).

Each regenerated turn is one training row, built by the same code as any sample
(train/samples.py `build_training_samples`): its prompt is exactly the ids sent for that turn (the
turn's row in generations/shard=NNNN/turns/ keeps them), so `input_ids` = those ids + the output ids
as received and `loss_mask` is 1 over the output only. Its `conversation` JSON is the turn's prompt
messages (the model's own earlier turns, each with `reasoning_content` and `tool_calls`) plus the
parsed turn, so the last turn's row holds the whole regenerated conversation. Lineage:
`conversation_id` and `turn_index` (1-based) columns, present only in shards that hold such turns
(schemas.TRAINING_SAMPLES_TURNS), so final_turn shards stay byte for byte what they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from ..generate.multiturn import turn_generations, turn_lineage, turn_prompt_rows, turn_tokenized


@dataclass
class WithTurns:
    generations: pl.DataFrame  # GENERATIONS rows: final-turn samples + turns
    tokenized: pl.DataFrame  # TOKENIZED_PROMPTS rows: the prompts + every turn's exact prompt ids
    prompts: pl.DataFrame  # prompt_id, messages, tools (parse_generations' input)
    exclude_sample_ids: set[str]  # turns of conversations whose turn-1 prompt failed the prompts gate
    lineage: pl.DataFrame | None  # sample_id, conversation_id, turn_index; None: no turns in the shard
    source_tokenized: pl.DataFrame  # what the rows can come from, for the source-mix check


def with_turns(
    generations: pl.DataFrame,
    tokenized: pl.DataFrame,
    prompts: pl.DataFrame,
    turns: pl.DataFrame,
    *,
    profile_name: str,
    tokenizer_fingerprint: str,
    bad_prompt_ids: set[str],
) -> WithTurns:
    base_prompts = prompts.select("prompt_id", "messages", "tools")
    if turns.height == 0:
        return WithTurns(generations, tokenized, base_prompts, set(), None, tokenized)
    turn_tok = turn_tokenized(turns, profile_name=profile_name, tokenizer_fingerprint=tokenizer_fingerprint)
    tok_all = pl.concat([tokenized, turn_tok.select(tokenized.columns)], how="vertical_relaxed")
    conv_ids = turns["conversation_id"].unique().to_list()
    bad = turns.filter(pl.col("conversation_id").is_in(list(bad_prompt_ids)))["sample_id"].to_list()
    return WithTurns(
        generations=pl.concat([generations, turn_generations(turns)], how="vertical_relaxed"),
        tokenized=tok_all,
        prompts=pl.concat([base_prompts, turn_prompt_rows(turns)], how="vertical_relaxed"),
        exclude_sample_ids=set(bad),
        lineage=turn_lineage(turns),
        source_tokenized=tok_all.filter(~pl.col("prompt_id").is_in(conv_ids)),
    )


def rows_by_turn(samples: pl.DataFrame) -> dict[str, Any]:
    if "turn_index" not in samples.columns:
        return {}
    t = samples.filter(pl.col("turn_index").is_not_null())
    return {
        "conversations": int(t["conversation_id"].n_unique()),
        "rows_by_turn": {str(k): int(v) for k, v in t.group_by("turn_index").len().sort("turn_index").iter_rows()},
        "final_turn_rows": samples.height - t.height,
    }
