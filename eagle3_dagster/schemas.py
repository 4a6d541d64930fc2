"""The Parquet table contracts between stages: one place that says what each table holds.

Token ids are list<int32>, masks list<int8>. Conversations and tools are canonical JSON strings
(sorted keys, compact) so that nested, optional OpenAI fields survive Parquet unchanged.
"""

from __future__ import annotations

import pyarrow as pa

IDS = pa.list_(pa.int32())
MASK = pa.list_(pa.int8())

# prompts/prompts.parquet: one row per unique canonical prompt.
PROMPTS = pa.schema(
    [
        ("prompt_id", pa.string()),  # sha256 hex (32 chars) of canonical messages + tools
        ("source", pa.string()),  # source name (assets/sources/<name>.yaml)
        ("source_file", pa.string()),
        ("source_row", pa.int64()),  # 1-based line (JSONL) or record index (JSON array, Parquet)
        ("shard", pa.int32()),  # stable: int(prompt_id[:16], 16) % n_shards
        ("messages", pa.string()),  # canonical JSON list of OpenAI-shaped messages (the prompt)
        ("tools", pa.string()),  # canonical JSON list of OpenAI function tools, or null
        ("n_messages", pa.int32()),
        # regenerate: all_turns sources only (ingest/turns.py), else null: the whole conversation
        # (canonical JSON; `messages` is then turn 1's prompt) and the options JSON
        ("conversation", pa.string()),
        ("regenerate", pa.string()),
    ]
)

# prompts/prompt_rejects.parquet: every row that did not become a prompt, with why.
PROMPT_REJECTS = pa.schema(
    [
        ("source", pa.string()),
        ("source_file", pa.string()),
        ("source_row", pa.int64()),
        ("reason", pa.string()),  # reason code, e.g. not_json, unknown_role, empty_conversation
        ("detail", pa.string()),  # human-readable, names the field
        ("excerpt", pa.string()),  # the raw row's head, <= 200 bytes of UTF-8; a cut one ends "…[cut]"
    ]
)

# tokenized_prompts/shard=NNNN/part-*.parquet
TOKENIZED_PROMPTS = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("source", pa.string()),
        ("shard", pa.int32()),
        ("input_ids", IDS),
        ("prompt_len", pa.int32()),
        ("profile", pa.string()),
        ("tokenizer_fingerprint", pa.string()),
        ("template_hash", pa.string()),
        # the source's control_text: as_served let literal control-token text of the data become
        # special ids in input_ids (tokenize/control_text.py); false otherwise
        ("control_text_in_content", pa.bool_()),
    ]
)

# tokenized_prompts/shard=NNNN/rejects.parquet
TOKENIZE_REJECTS = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("source", pa.string()),
        ("shard", pa.int32()),
        ("reason", pa.string()),  # render_error, prompt_too_long, ...
        ("detail", pa.string()),
    ]
)

# generations/shard=NNNN/part-*.parquet: output_ids exactly as the server returned them.
GENERATIONS = pa.schema(
    [
        ("sample_id", pa.string()),  # the cache key: prompt x model rev x template x sampling x seed
        ("prompt_id", pa.string()),
        ("source", pa.string()),
        ("shard", pa.int32()),
        ("rid", pa.string()),
        ("output_ids", IDS),
        ("text", pa.string()),  # the server's text, for reference only; never re-encoded
        ("finish_reason", pa.string()),  # stop | length | abort
        ("finish_matched", pa.string()),  # JSON of finish_reason.matched (int id or stop string) or null
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("cached_tokens", pa.int32()),
        ("e2e_latency", pa.float64()),
        ("meta_info", pa.string()),  # the full meta_info as JSON
        ("endpoint", pa.string()),
        ("model_revision", pa.string()),
        ("template_hash", pa.string()),
        ("sampling_hash", pa.string()),
        ("integrity_violations", pa.list_(pa.string())),
        ("generated_at", pa.timestamp("us", tz="UTC")),
        # speculative decoding (generate/drafter.py): meta_info's figures as received, null when the
        # server does not speculate, and the serving endpoint's drafter (its /server_info) as lineage
        ("spec_accept_length", pa.float64()),  # completion_tokens / spec_verify_ct (bonus token included)
        ("spec_accept_rate", pa.float64()),  # spec_num_correct_drafts / spec_num_proposed_drafts
        ("spec_verify_ct", pa.int64()),
        ("spec_num_correct_drafts", pa.int64()),
        ("spec_num_proposed_drafts", pa.int64()),
        ("spec_correct_drafts_histogram", pa.list_(pa.int64())),  # [k]: verify steps that accepted k drafts
        ("drafter_id", pa.string()),  # DrafterIdentity.drafter_id: a digest of the six fields below
        ("spec_algorithm", pa.string()),
        ("spec_draft_model_path", pa.string()),
        ("spec_draft_model_revision", pa.string()),
        ("spec_num_steps", pa.int64()),
        ("spec_eagle_topk", pa.int64()),
        ("spec_num_draft_tokens", pa.int64()),
        # who generated the answer: the SGLang server (`endpoint` itself; behind a gateway the worker it named
        # in x-smg-routed-worker-id, null when it names none) and its release (/server_info `version`)
        ("worker", pa.string()),
        ("sglang_version", pa.string()),
        # SGLang 0.5.18+ in DSpark's ragged-verify modes only (null otherwise): mean verify length a step was
        # capped at, mean accepted block (cap-accept), [c]: verify steps capped at c tokens
        ("spec_cap_length", pa.float64()),
        ("spec_block_accept_length", pa.float64()),
        ("spec_cap_lens_histogram", pa.list_(pa.int64())),
    ]
)

# generations/shard=NNNN/turns/part-*.parquet: turns of `regenerate: all_turns` conversations
# (generate/multiturn.py): a GENERATIONS row (prompt_id = the turn's prompt id) plus its lineage and
# the exact prompt it was generated from.
TURN_GENERATIONS = pa.schema(
    [
        *GENERATIONS,
        ("conversation_id", pa.string()),  # the conversation's prompt_id (prompts table)
        ("turn_index", pa.int32()),  # 1-based
        ("prompt_ids", IDS),  # exactly the input_ids sent for this turn
        ("prompt_messages", pa.string()),  # JSON: the messages rendered (the model's own earlier turns)
        ("tools", pa.string()),  # JSON tools of the conversation, or null
    ],
    metadata=GENERATIONS.metadata,
)

# training_samples rows of a shard that holds all_turns conversations: TRAINING_SAMPLES + lineage
# (final_turn-only shards keep TRAINING_SAMPLES, byte for byte as before).
TRAINING_SAMPLES_TURNS_EXTRA = (("conversation_id", pa.string()), ("turn_index", pa.int32()))

# generations/shard=NNNN/errors.parquet: requests that could not produce a sample.
GENERATION_ERRORS = pa.schema(
    [
        ("sample_id", pa.string()),
        ("prompt_id", pa.string()),
        ("shard", pa.int32()),
        ("reason", pa.string()),  # http_400, retries_exhausted, ...
        ("status", pa.int32()),
        ("detail", pa.string()),
    ]
)

# training_samples/shard=NNNN/part-*.parquet
TRAINING_SAMPLES = pa.schema(
    [
        ("sample_id", pa.string()),
        ("prompt_id", pa.string()),
        ("source", pa.string()),
        ("input_ids", IDS),  # prompt ids + output ids, exactly
        ("loss_mask", MASK),  # 0 over the prompt, 1 over the output
        ("prompt_len", pa.int32()),
        ("output_len", pa.int32()),
        ("total_len", pa.int32()),
        ("model_revision", pa.string()),
        ("template_hash", pa.string()),
        ("tokenizer_fingerprint", pa.string()),
        ("sampling_hash", pa.string()),
        ("endpoint", pa.string()),
        ("finish_reason", pa.string()),
        ("generated_at", pa.timestamp("us", tz="UTC")),
        ("conversation", pa.string()),  # JSON: prompt messages + the parsed assistant turn (derived from ids)
        ("tools", pa.string()),  # JSON list of tools offered in the prompt, or null
        ("text_exact", pa.bool_()),  # the parsed turn's text re-encodes to exactly the output ids
        ("text_mismatch_pos", pa.int32()),  # else the first differing output position (non-canonical tokenization)
        # the prompt's literal control-token text became special ids (its source's control_text: as_served;
        # tokenized_prompts.control_text_in_content); null: not known (a prompt row without the flag)
        ("control_text_in_content", pa.bool_()),
        # who served the row, copied from its generation row (GENERATIONS `worker`, `sglang_version`); null
        # where that row has none (a gateway that names no worker; rows stored before those columns existed)
        ("worker", pa.string()),
        ("sglang_version", pa.string()),
    ]
)
TRAINING_SAMPLES_TURNS = pa.schema([*TRAINING_SAMPLES, *TRAINING_SAMPLES_TURNS_EXTRA])
