"""The rows a generation request leaves: a stored sample (generations) or a failure (errors.parquet)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from ..secret import printable, redact, redacted_json_text
from .answer_checks import LATENCY_INVALID
from .client import Outcome
from .drafter import spec_row_fields
from .endpoint_info import Served
from .request_errors import is_permanent_reason as is_permanent_reason  # re-exported


def result_row(
    o: Outcome,
    item: dict[str, Any],
    *,
    model_revision: str,
    s_hash: str,
    violations: list[str],
    served: Served | None = None,
) -> dict[str, Any]:
    """The stored sample of an answer that answer_checks.check_answer accepted (`violations`: its flags);
    `served`: the server that generated it, its release and drafter (EndpointPool.served)."""
    served = served or Served(None, None, None)
    data = o.response or {}
    meta = data.get("meta_info") or {}
    fr = meta.get("finish_reason")
    ids = data.get("output_ids")
    return {
        "sample_id": item["sample_id"],
        "prompt_id": item["prompt_id"],
        "source": item.get("source"),
        "shard": item.get("shard"),
        "rid": o.rid,
        "output_ids": ids,  # exactly as received
        "text": data.get("text"),
        "finish_reason": fr.get("type") if isinstance(fr, dict) else None,
        "finish_matched": json.dumps(fr["matched"]) if isinstance(fr, dict) and "matched" in fr else None,
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        # null when flagged (answer_checks: NaN, negative, no float64, longer than the request): a lie is not a
        # latency, and one no float64 holds would crash the chunk write; meta_info keeps what was sent
        "e2e_latency": None if any(v.startswith(LATENCY_INVALID) for v in violations) else meta.get("e2e_latency"),
        # as received, but a secret a server put in it (a gateway echoing the Authorization header) is redacted
        "meta_info": redacted_json_text(meta),
        "endpoint": o.endpoint,
        "worker": served.worker,
        "sglang_version": served.version,
        "model_revision": model_revision,
        "template_hash": item.get("template_hash"),
        "sampling_hash": item.get("sampling_hash") or s_hash,  # a context-fitted row's: its lowered budget
        "integrity_violations": violations,
        "generated_at": datetime.now(UTC),
        **spec_row_fields(meta, served.drafter, violations),
    }


def error_row(item: dict[str, Any], reason: str, status: int | None, detail: str) -> dict[str, Any]:
    return {
        "sample_id": item["sample_id"],
        "prompt_id": item["prompt_id"],
        "shard": item.get("shard"),
        "reason": reason,
        "status": status,
        # our own texts quote server values too: never a secret, never a control character in a message
        "detail": printable(redact(detail))[:2000],
    }
