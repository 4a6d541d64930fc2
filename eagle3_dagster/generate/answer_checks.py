"""Checks that a 200 result is the answer to the request it came back on, before it becomes a sample.

SGLang echoes the request's `rid` as `meta_info.id` (tokenizer_manager: `"id": rid`). An answer that
names another rid holds another request's tokens: a proxy or cache between us and the server mixed
answers up (a cache keyed on the URL, a desynchronised keep-alive connection). Stored, it would pair
this prompt with another prompt's output, a training sample that looks perfect. It fails instead,
`answer_rid_mismatch` (not permanent: the next run sends it again). An answer without `meta_info.id`
(an older or non-SGLang server) is not judged.
"""

from __future__ import annotations

import logging

from .client import Outcome

log = logging.getLogger(__name__)

RID_MISMATCH = "answer_rid_mismatch"


def answered_rid(o: Outcome) -> str | None:
    """The rid the answer says it is for (`meta_info.id`), or None when it does not say."""
    meta = (o.response or {}).get("meta_info")
    rid = meta.get("id") if isinstance(meta, dict) else None
    return None if rid is None else str(rid)


def reject_foreign_answer(o: Outcome, *, shard: str, seen: int) -> Outcome:
    """`o`, or a failure `answer_rid_mismatch` when its answer is for another request.

    `seen`: how many this run already rejected; the first three are logged as errors (one per answer
    would flood the log when a proxy mixes every answer up; the report counts them all)."""
    got = answered_rid(o) if o.response is not None else None
    if got is None or got == o.rid:
        return o
    detail = (
        f"sent rid {o.rid}, the answer's meta_info.id is {got}: another request's answer (a proxy or cache "
        "between the client and the server mixed answers up); not stored"
    )
    if seen < 3:
        log.error("shard %s: %s: %s", shard, RID_MISMATCH, detail)
    return Outcome(
        None, o.endpoint, o.rid, o.latency_s, reason=RID_MISMATCH, status=200, detail=detail, attempts=o.attempts
    )
