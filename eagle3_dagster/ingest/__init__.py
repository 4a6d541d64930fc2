"""Prompt ingestion: read prompt datasets in the formats people have, normalize them to canonical
OpenAI-shaped prompts with stable ids, quarantine bad rows with reason codes, dedupe, and combine.

No Dagster imports here; the wiring lives in eagle3_dagster/defs/.
"""

from .canonical import canonical_json, prompt_id_of, shard_of
from .counts import CombineCounts, SourceCounts
from .errors import REJECT_REASONS, IngestFileError, RowReject, SourceSpecError
from .normalize import FORMAT_ALIASES, GENERATE_KEY, PROMPT_RULES, build_conversation, build_prompt, normalize_tools
from .pipeline import combine_sources, ingest_source
from .spec import SourceSpec, load_source_spec, load_source_specs

__all__ = [
    "FORMAT_ALIASES",
    "GENERATE_KEY",
    "PROMPT_RULES",
    "REJECT_REASONS",
    "CombineCounts",
    "IngestFileError",
    "RowReject",
    "SourceCounts",
    "SourceSpec",
    "SourceSpecError",
    "build_conversation",
    "build_prompt",
    "canonical_json",
    "combine_sources",
    "ingest_source",
    "load_source_spec",
    "load_source_specs",
    "normalize_tools",
    "prompt_id_of",
    "shard_of",
]
