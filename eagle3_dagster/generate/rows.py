"""The rows a generation request leaves: a stored sample (generations) or a failure (errors.parquet).

Each is a typed record while the run holds it, and becomes the table's row (a dict of its columns) only at
the write (flush.py): `SampleRow.as_row()` for schemas.GENERATIONS (a turn's: TURN_GENERATIONS),
`ErrorRow.as_row()` for schemas.GENERATION_ERRORS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..secret import printable, redact, redacted_json_text
from .answer_checks import LATENCY_INVALID
from .client import Outcome
from .drafter import spec_row_fields
from .endpoint_info import Served
from .items import Turn, WorkItem
from .request_errors import is_permanent_reason as is_permanent_reason  # re-exported


@dataclass(slots=True)
class SampleRow:
    """A stored sample: one accepted answer, its ids exactly as received, and where it came from."""

    sample_id: str
    prompt_id: str
    source: str | None
    shard: int | None
    rid: str | None
    output_ids: Any  # exactly as received
    text: Any
    finish_reason: str | None
    finish_matched: str | None
    prompt_tokens: Any
    completion_tokens: Any
    cached_tokens: Any
    e2e_latency: Any
    meta_info: str | None
    endpoint: str | None
    worker: str | None
    sglang_version: str | None
    model_revision: str
    template_hash: str | None
    sampling_hash: str
    integrity_violations: list[str]
    generated_at: datetime
    spec: Mapping[str, Any] = field(default_factory=dict)  # the drafter's columns (drafter.ROW_COLUMNS)
    turn: Turn | None = None  # a conversation's turn: its lineage and prompt are stored too
    prompt_ids: list[int] | None = None  # a turn's: exactly the ids sent

    def as_row(self) -> dict[str, Any]:
        """The row the store writes (its keys: the table's columns)."""
        row = {
            "sample_id": self.sample_id,
            "prompt_id": self.prompt_id,
            "source": self.source,
            "shard": self.shard,
            "rid": self.rid,
            "output_ids": self.output_ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "finish_matched": self.finish_matched,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "e2e_latency": self.e2e_latency,
            "meta_info": self.meta_info,
            "endpoint": self.endpoint,
            "worker": self.worker,
            "sglang_version": self.sglang_version,
            "model_revision": self.model_revision,
            "template_hash": self.template_hash,
            "sampling_hash": self.sampling_hash,
            "integrity_violations": self.integrity_violations,
            "generated_at": self.generated_at,
            **self.spec,
        }
        if self.turn is not None:
            row.update(
                conversation_id=self.turn.conversation_id,
                turn_index=self.turn.turn_index,
                prompt_ids=self.prompt_ids,
                prompt_messages=self.turn.prompt_messages,
                tools=self.turn.tools,
            )
        return row


def result_row(
    o: Outcome,
    item: WorkItem,
    *,
    model_revision: str,
    s_hash: str,
    violations: list[str],
    served: Served | None = None,
) -> SampleRow:
    """The stored sample of an answer that answer_checks.check_answer accepted (`violations`: its flags);
    `served`: the server that generated it, its release and drafter (EndpointPool.served)."""
    served = served or Served(None, None, None)
    data = o.response or {}
    meta = data.get("meta_info") or {}
    fr = meta.get("finish_reason")
    return SampleRow(
        sample_id=item.sample_id,
        prompt_id=item.prompt_id,
        source=item.source,
        shard=item.shard,
        rid=o.rid,
        output_ids=data.get("output_ids"),  # exactly as received
        text=data.get("text"),
        finish_reason=fr.get("type") if isinstance(fr, dict) else None,
        finish_matched=json.dumps(fr["matched"]) if isinstance(fr, dict) and "matched" in fr else None,
        prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=meta.get("completion_tokens"),
        cached_tokens=meta.get("cached_tokens"),
        # null when flagged (answer_checks: NaN, negative, no float64, longer than the request): a lie is not a
        # latency, and one no float64 holds would crash the chunk write; meta_info keeps what was sent
        e2e_latency=None if any(v.startswith(LATENCY_INVALID) for v in violations) else meta.get("e2e_latency"),
        # as received, but a secret a server put in it (a gateway echoing the Authorization header) is redacted
        meta_info=redacted_json_text(meta),
        endpoint=o.endpoint,
        worker=served.worker,
        sglang_version=served.version,
        model_revision=model_revision,
        template_hash=item.template_hash,
        sampling_hash=item.sampling_hash or s_hash,  # a context-fitted row's: its lowered budget
        integrity_violations=violations,
        generated_at=datetime.now(UTC),
        spec=spec_row_fields(meta, served.drafter, violations),
        turn=item.turn,
        prompt_ids=item.input_ids if item.turn is not None else None,
    )


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """A failed request (errors.parquet): which sample, why (a reason code), the HTTP status and the detail."""

    sample_id: str
    prompt_id: str
    shard: int | None
    reason: str
    status: int | None
    detail: str

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> ErrorRow:
        """A row read back from errors.parquet (an earlier run's failure, carried)."""
        return cls(
            row["sample_id"], row["prompt_id"], row.get("shard"), row["reason"], row.get("status"), row["detail"]
        )

    def as_row(self) -> dict[str, Any]:
        return {
            "sample_id": self.sample_id,
            "prompt_id": self.prompt_id,
            "shard": self.shard,
            "reason": self.reason,
            "status": self.status,
            "detail": self.detail,
        }


def error_row(item: WorkItem, reason: str, status: int | None, detail: str) -> ErrorRow:
    # our own texts quote server values too: never a secret, never a control character in a message
    return ErrorRow(item.sample_id, item.prompt_id, item.shard, reason, status, printable(redact(detail))[:2000])
