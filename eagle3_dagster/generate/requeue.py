"""Quarantined answers a rerun can fix: found before a run plans, taken out of the store, sent again.

The generations gate writes the rows it quarantined to the shard's quarantine.parquet. A stored row
counts as "already generated", so without this a fixed server would never be asked again and the shard
would stay failed. Before each run (lock held) the quarantined rows whose fault lies with the server
are taken out of the store (ShardStore.supersede keeps them in superseded-*.parquet) and the plan then
sends them like any sample that is not stored; the new answer is the shard's row from then on.

Retried (the answer itself says the server got it wrong; a fixed or healthy server answers differently):
- `quarantined_empty_answer`: no output ids at all (null or []);
- `quarantined_server_capped`: a `length` finish shorter than the max_new_tokens sent (the server clamped
  the budget: a truncated trace);
- `quarantined_integrity`: any other integrity violation the client recorded on the row (ids vs
  completion_tokens, "NaN happened" finishes, ids out of the vocabulary, stop id not the last id).
- `quarantined_same_answer`: the row's output ids are those of another quarantined row of another prompt
  (what the gate's `same_answer_to_different_prompts` quarantines: one answer sent for many prompts, as a
  response cache keyed on the wrong field does). A fixed server answers each prompt its own way; a group of
  genuinely identical short answers comes back identical and is quarantined again (a few short requests on
  each run).

Not retried: a quarantined row with a well-formed answer (no `</think>`, a `length` finish at our own
budget, repetition, unbalanced tool-call markers, an echoed prompt tail). That is what the model sampled
for this request; the same request with the same sampling and seed would be judged the same way, and
retrying it would resend it on every run. To draw new answers for those, change the sampling or
`regen_seed` (both are in the cache key).
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from ..storage import as_data_path, read_parquet
from .store import ShardStore, StoreDir, iter_generations

QUARANTINE_FILE = "quarantine.parquet"  # written by the generations gate (orchestration/gate_step.py)
_ROW_ID = "row_id"  # quality.features.ROW_ID: the sample_id of a generations row

EMPTY = "quarantined_empty_answer"
CAPPED = "quarantined_server_capped"
INTEGRITY = "quarantined_integrity"
SAME_ANSWER = "quarantined_same_answer"


def quarantined_sample_ids(out_dir: StoreDir) -> pl.Series:
    """Sample ids the shard's last generations gate quarantined (empty when it has not run)."""
    p = as_data_path(out_dir) / QUARANTINE_FILE
    if not p.exists():
        return pl.Series("sample_id", [], dtype=pl.String)
    df = read_parquet(p)
    if _ROW_ID not in df.columns:
        return pl.Series("sample_id", [], dtype=pl.String)
    return df.get_column(_ROW_ID).cast(pl.String).drop_nulls().unique().rename("sample_id")


def retry_reason(output_ids: list[int] | None, violations: list[str] | None) -> str | None:
    """Why a quarantined row is retried (one of the codes above), or None when a rerun would not change it."""
    if not output_ids:
        return EMPTY
    v = [str(x) for x in violations or ()]
    if any(x.startswith("length_capped_by_server") for x in v):
        return CAPPED
    return INTEGRITY if v else None


def retryable_quarantined(out_dir: StoreDir) -> Mapping[str, str]:
    """Sample id -> retry reason, for the quarantined rows still stored that a rerun could fix."""
    ids = quarantined_sample_ids(out_dir)
    if ids.len() == 0:
        return {}
    out: dict[str, str] = {}
    answers: dict[tuple[int, ...], dict[str, str]] = {}  # output ids -> {sample id: prompt id} (quarantined rows)
    columns = ["sample_id", "prompt_id", "output_ids", "integrity_violations"]
    for batch in iter_generations(out_dir, only=ids, columns=columns):
        for sid, pid, oids, viol in batch.iter_rows():
            reason = retry_reason(oids, viol)
            if reason is not None:
                out[str(sid)] = reason
            else:
                answers.setdefault(tuple(oids), {})[str(sid)] = str(pid)
    for group in answers.values():
        if len(set(group.values())) > 1:  # one answer stored for several prompts
            out.update(dict.fromkeys(group, SAME_ANSWER))
    return out


def requeue_quarantined(store: ShardStore) -> dict[str, str]:
    """Take the retryable quarantined rows out of `store` (lock held); sample id -> retry reason of each."""
    retry = dict(retryable_quarantined(store.out_dir))
    if retry:
        store.supersede(retry)
    return retry
