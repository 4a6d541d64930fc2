"""What became of the requests an earlier run lost: sent again by this run, did they come back?

errors.parquet holds one run's failed requests. A failure that is not permanent (retries exhausted, a
stall, a reset) is sent again by the next run, because that sample is still not stored. Before this
run rewrites errors.parquet, `PreviousFailures.read` keeps those sample ids with their reasons; after
it, `outcome` says per reason how many came back (now stored), failed again, or were not sent (the
prompt left the shard's input, or the run stopped first). The result goes in the step's metadata and
in `retried.json` beside the shard's generations, which the quality report reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from ..storage import DataPath, as_data_path

RETRIED_FILE = "retried.json"


@dataclass(frozen=True)
class PreviousFailures:
    """Sample id -> reason of the earlier run's failures that this run sends again."""

    reasons: Mapping[str, str]

    @classmethod
    def from_errors(cls, prior: pl.DataFrame, carried_ids: Iterable[str]) -> PreviousFailures:
        """The prior errors.parquet rows minus the ones carried over unsent (permanent failures)."""
        carried = set(carried_ids)
        if prior.height == 0:
            return cls({})
        rows = prior.select("sample_id", "reason").iter_rows()
        return cls({str(s): str(r or "unknown") for s, r in rows if s not in carried})

    def outcome(self, stored_ids: Iterable[str], failed_ids: Iterable[str]) -> dict[str, dict[str, int]]:
        """Reason -> {retried, came_back, failed_again, not_sent}; empty when nothing was retried."""
        if not self.reasons:
            return {}
        stored = {s for s in stored_ids if s in self.reasons}
        failed = {s for s in failed_ids if s in self.reasons and s not in stored}
        out: dict[str, Counter[str]] = {}
        for sid, reason in self.reasons.items():
            c = out.setdefault(reason, Counter())
            c["retried"] += 1
            c["came_back" if sid in stored else "failed_again" if sid in failed else "not_sent"] += 1
        keys = ("retried", "came_back", "failed_again", "not_sent")
        return {
            r: {k: int(c[k]) for k in keys} for r, c in sorted(out.items(), key=lambda kv: (-kv[1]["retried"], kv[0]))
        }


def retried_line(outcome: Mapping[str, Mapping[str, int]]) -> str:
    """`retried 958 failed before (retries_exhausted=958): 950 came back, 8 failed again, 0 not sent`"""
    if not outcome:
        return ""
    total = Counter[str]()
    for c in outcome.values():
        total.update(c)
    reasons = ", ".join(f"{r}={c['retried']:,}" for r, c in outcome.items())
    return (
        f"retried {total['retried']:,} failed before ({reasons}): {total['came_back']:,} came back, "
        f"{total['failed_again']:,} failed again, {total['not_sent']:,} not sent"
    )


def write_retried(out_dir: DataPath | Any, run_at: str, outcome: Mapping[str, Mapping[str, int]]) -> None:
    """retried.json: this run's outcome for the earlier failures (removed when there were none)."""
    p = as_data_path(out_dir) / RETRIED_FILE
    if outcome:
        p.write_json({"run_at": run_at, "by_reason": outcome}, indent=1, sort_keys=True)
    elif p.exists():
        p.unlink()


def read_retried(out_dir: DataPath | Any) -> dict[str, Any]:
    """The shard's retried.json ({} when absent or unreadable: an auxiliary report row only)."""
    p = as_data_path(out_dir) / RETRIED_FILE
    if not p.exists():
        return {}
    try:
        data = p.read_json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
