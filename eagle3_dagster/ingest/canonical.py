"""Prompt identity: canonical JSON, the 128-bit prompt id and the stable shard number.

The id depends only on the canonical messages and tools, never on the source, file or row, so the
same conversation gets the same id whichever dataset or format it came from.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, raw UTF-8; NaN/Infinity refused (not JSON)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def prompt_digest(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bytes:
    """First 16 bytes (128 bits) of sha256 over canonical {"messages": ..., "tools": ...}."""
    payload = canonical_json({"messages": messages, "tools": tools}).encode("utf-8")
    return hashlib.sha256(payload).digest()[:16]


def prompt_id_of(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return prompt_digest(messages, tools).hex()


def shard_of(prompt_id: str, n_shards: int) -> int:
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    return int(prompt_id[:16], 16) % n_shards
