"""Run statistics: the live ProgressReport and the final ShardReport (Dagster metadata)."""

from __future__ import annotations

import time
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..secret import printable
from .drafter import SpecNamesWatch
from .request_errors import is_permanent_reason
from .retried import retried_line


@dataclass(frozen=True)
class ProgressReport:
    done: int  # succeeded + failed in this run
    total: int  # samples this run has to produce (requested - skipped_cached)
    succeeded: int
    failed: int
    in_flight: int
    elapsed_s: float
    samples_per_s: float
    output_tokens_per_s: float
    eta_s: float | None
    errors_by_kind: dict[str, int]
    retried_by_kind: dict[str, int]
    cached: int = 0  # samples already stored by an earlier run: not part of `total`


@dataclass
class ShardReport:
    requested: int = 0
    skipped_cached: int = 0
    succeeded: int = 0
    failed: int = 0
    retried_by_kind: dict[str, int] = field(default_factory=dict)
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    # reason -> the detail of its last failed request (retries_exhausted: the last error; http_400: the
    # server's message), so a permanent failure is named, not only counted
    failure_details: dict[str, str] = field(default_factory=dict)
    # reason -> {retried, came_back, failed_again, not_sent}: an earlier run's failures this run sent again
    previous_failures: dict[str, dict[str, int]] = field(default_factory=dict)
    # stored answers the last gate quarantined for a server fault (generate/requeue.py), taken out and sent again
    quarantined_retried: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    samples_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    latency_p50: float | None = None
    latency_p90: float | None = None
    latency_p99: float | None = None
    cached_tokens_ratio: float | None = None
    per_endpoint: dict[str, dict[str, int]] = field(default_factory=dict)
    integrity_violations: int = 0
    model_revision: str = ""
    drafter_key: str = ""  # the fleet's drafter ids (probes.fleet_drafter_key): in a probe prompt's cache key
    # False: no endpoint was asked (a shard with nothing to send, cached_only.py): drafter_key is the newest
    # stored probe results' (what keyed the stored probe samples), not what the fleet serves tonight
    drafter_asked: bool = True
    wall_s: float = 0.0
    sampling_hash: str = ""
    duplicates_in_input: int = 0
    requests_sent: int = 0
    output_tokens: int = 0
    chunks_written: int = 0
    chunk_write_retries: int = 0  # failed chunk/errors-file writes that succeeded on a later attempt
    max_in_flight: int = 0
    http_pools: int = 0  # httpx clients the workers were spread over
    carried_failed: int = 0  # permanent failures of an earlier run, not sent again (in `failed`)
    chunks_compacted: int = 0  # chunk files merged into one compacted chunk at the end of this run
    compaction_leftovers_removed: int = 0  # chunks an interrupted earlier compaction left, removed at start
    compaction_error: str | None = None  # compaction failed (data intact, the next run tries again)
    nan_finishes: int = 0  # finish_reason stop matched "NaN happened": stored, flagged (integrity violation)
    server_capped_length: int = 0  # `length` finishes shorter than max_new_tokens: the server clamped them
    streamed: bool = False  # SSE with an idle timeout between chunks (stall detection)
    in_flight_source: str = ""  # "config" or "server_info" (a router: its workers' server_info)
    # the context length the endpoints report (/server_info): prompts at least this long are not sent
    server_context_length: int | None = None
    # prompt + max_new_tokens over server_context_length (generate/context_fit.py): sent with max_new_tokens
    # lowered to what fits (stored, in `succeeded` when they came back), or not sent (in `failed`, reason
    # context_overflow); context_overflow: the mode of the run (fit | skip)
    context_overflow: str = ""
    context_fitted: int = 0
    context_overflow_skipped: int = 0
    server_versions: dict[str, str] = field(default_factory=dict)  # endpoint (a router's: each worker) -> version
    # speculating server -> its rows whose answers carried no figure under a name any release uses
    # (drafter.SpecNamesWatch: one WARNING per server): their acceptance figures are null
    spec_figures_unread: dict[str, int] = field(default_factory=dict)
    # endpoint -> what its /model_info says it serves ("model_path '...' (model_type '...')"), and the endpoints
    # refused for this run -> why (another model, an old SGLang, server-side sampling defaults)
    served_models: dict[str, str] = field(default_factory=dict)
    refused_endpoints: dict[str, str] = field(default_factory=dict)
    # endpoint -> the server's --preferred-sampling-params (recorded; one that sets a field the client
    # does not send refuses the endpoint before anything is sent)
    preferred_sampling_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    # all_turns conversations (generate/multiturn.py TurnStats.as_dict); their turns are not in the
    # requested/succeeded/failed counts above, which stay those of the final-turn prompts
    turns: dict[str, Any] | None = None
    # (sample_id, turn prompt id, conversation_id, turn_index) of every stored turn on the conversations'
    # current paths, one per sample (not metadata)
    turn_sample_ids: list[tuple[str, str, str, int]] = field(default_factory=list)

    @property
    def reconciles(self) -> bool:
        return self.requested == self.succeeded + self.failed + self.skipped_cached

    def as_metadata(self) -> dict[str, Any]:
        """Plain JSON-able values (the Dagster asset wraps them); no secrets are ever in here."""
        d = asdict(self)
        d.pop("turn_sample_ids")
        if d["turns"] is None:
            d.pop("turns")
        for k in ("samples_per_s", "output_tokens_per_s", "wall_s"):
            d[k] = round(float(d[k]), 3)
        for k in ("latency_p50", "latency_p90", "latency_p99", "cached_tokens_ratio"):
            if d[k] is not None:
                d[k] = round(float(d[k]), 4)
        d["reconciles"] = self.reconciles
        return d


def _percentile(sorted_vals: Sequence[float] | np.ndarray, q: float) -> float | None:
    if not len(sorted_vals):
        return None
    i = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return float(sorted_vals[i])


class RunStats:
    """Mutable counters shared by the workers (one event loop, so no locks needed)."""

    def __init__(self, total: int, cached: int = 0) -> None:
        self.t0 = time.monotonic()
        self.total = total
        self.cached = cached
        self.succeeded = 0
        self.failed = 0
        self.in_flight = 0
        self.requests_sent = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.integrity_violations = 0
        self.nan_finishes = 0
        self.server_capped_length = 0
        self.context_fitted = 0  # sent with max_new_tokens lowered to the server's context (context_fit.py)
        self.context_overflow_skipped = 0
        self.retried: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.spec_names = SpecNamesWatch()
        self.finish: Counter[str] = Counter()
        # array('d'): 8 bytes a sample, so a 1M-sample shard keeps its latencies in 8 MB.
        self.latencies = array("d")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def progress(self) -> ProgressReport:
        el = max(self.elapsed(), 1e-9)
        done = self.succeeded + self.failed
        rate = done / el
        remaining = self.total - done
        eta = (remaining / rate) if rate > 0 else None
        return ProgressReport(
            done=done,
            total=self.total,
            succeeded=self.succeeded,
            failed=self.failed,
            in_flight=self.in_flight,
            elapsed_s=el,
            samples_per_s=rate,
            output_tokens_per_s=self.output_tokens / el,
            eta_s=eta if remaining > 0 else 0.0,
            errors_by_kind=dict(self.errors),
            retried_by_kind=dict(self.retried),
            cached=self.cached,
        )

    def fill(self, report: ShardReport) -> ShardReport:
        el = max(self.elapsed(), 1e-9)
        # sorted in place as float64 (8 bytes a sample), not as a list of Python floats (~32 bytes a sample)
        lat = np.sort(np.frombuffer(self.latencies, dtype=np.float64)) if self.latencies else np.empty(0)
        report.succeeded = self.succeeded
        report.failed = self.failed
        report.retried_by_kind = dict(self.retried)
        report.errors_by_kind = dict(self.errors)
        report.finish_reasons = dict(self.finish)
        report.samples_per_s = self.succeeded / el
        report.output_tokens_per_s = self.output_tokens / el
        report.latency_p50 = _percentile(lat, 0.50)
        report.latency_p90 = _percentile(lat, 0.90)
        report.latency_p99 = _percentile(lat, 0.99)
        report.cached_tokens_ratio = (self.cached_tokens / self.prompt_tokens) if self.prompt_tokens else None
        report.integrity_violations = self.integrity_violations
        report.wall_s = el
        report.requests_sent = self.requests_sent
        report.output_tokens = self.output_tokens
        report.nan_finishes = self.nan_finishes
        report.server_capped_length = self.server_capped_length
        report.context_fitted = self.context_fitted
        report.context_overflow_skipped = self.context_overflow_skipped
        report.spec_figures_unread = dict(self.spec_names.rows)
        return report


def _dur(s: float | None) -> str:
    if s is None:
        return "?"
    s = round(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _kinds(d: dict[str, int]) -> str:
    return " ".join(f"{k}={v:,}" for k, v in sorted(d.items()))


def failures_by_reason(errors: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, str]]:
    """Failed requests (errors.parquet rows, permanent and retryable) per reason: (count, the last row's detail),
    most first."""
    counts: Counter[str] = Counter()
    last: dict[str, str] = {}
    for row in errors:
        reason = str(row.get("reason") or "unknown")
        counts[reason] += 1
        last[reason] = str(row.get("detail") or "")
    return {r: (n, last[r]) for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}


def failures_section(errors: Iterable[Mapping[str, Any]], *, examples: int = 3) -> dict[str, dict[str, Any]]:
    """Reason -> {count, last_detail, prompt_ids (the first `examples`)}: the failures part of a manifest/report."""
    out: dict[str, dict[str, Any]] = {}
    for row in errors:
        reason = str(row.get("reason") or "unknown")
        entry = out.setdefault(reason, {"count": 0, "last_detail": "", "prompt_ids": []})
        entry["count"] += 1
        entry["last_detail"] = str(row.get("detail") or "")
        if len(entry["prompt_ids"]) < examples:
            entry["prompt_ids"].append(row.get("prompt_id"))
    return dict(sorted(out.items(), key=lambda kv: (-kv[1]["count"], kv[0])))


def failures_text(by_reason: Mapping[str, tuple[int, str]], *, detail_chars: int = 160) -> str:
    """`retries_exhausted=2 (last: reset after 2 attempts: ...); http_400=1 (last: The input ...)`"""
    return "; ".join(
        f"{r}={n:,}" + (f" (last: {printable(d)[:detail_chars]})" if d else "") for r, (n, d) in by_reason.items()
    )


def failures_by_permanence(by_reason: Mapping[str, tuple[int, str]], *, detail_chars: int = 160) -> str:
    """Failed requests counted apart by whether a rerun sends them again (request_errors.is_permanent_reason):
    `1 permanent, not sent again: http_400=1 (last: ...); 2 retryable, the next run sends them again: ...`"""
    parts = []
    for permanent, what in ((True, "permanent, not sent again"), (False, "retryable, the next run sends them again")):
        part = {r: v for r, v in by_reason.items() if is_permanent_reason(r) == permanent}
        if part:
            n = sum(c for c, _ in part.values())
            parts.append(f"{n:,} {what}: {failures_text(part, detail_chars=detail_chars)}")
    return "; ".join(parts)


def progress_line(shard: str, p: ProgressReport) -> str:
    """`generations shard 0001: 6,200/9,000 (69%) · 41.2 samples/s · 256 in flight · ETA 1m08s · retried http_503=3`"""
    shard = shard.removeprefix("shard=")
    if not p.total:  # a rerun with every sample stored (or a shard without prompts): no fraction to show
        what = f"all {p.cached:,} cached, nothing to generate" if p.cached else "no prompts, nothing to generate"
        return f"generations shard {shard}: {what}"
    pct = 100 * p.done // p.total
    parts = [
        f"generations shard {shard}: {p.done:,}/{p.total:,} ({pct}%)"
        + (f" + {p.cached:,} already stored" if p.cached else ""),
        f"{p.samples_per_s:.1f} samples/s",
        f"{p.in_flight:,} in flight",
        f"ETA {_dur(p.eta_s)}",
    ]
    if p.retried_by_kind:
        parts.append(f"retried {_kinds(p.retried_by_kind)}")
    if p.errors_by_kind:
        parts.append(f"failed {_kinds(p.errors_by_kind)}")
    return " · ".join(parts)


def result_line(shard: str, r: ShardReport) -> str:
    """One line for a finished step: what was asked, what came out, what went wrong."""
    shard = shard.removeprefix("shard=")
    parts = [
        f"generations shard {shard}: {r.requested:,} requested = {r.succeeded:,} generated + "
        f"{r.skipped_cached:,} already stored + {r.failed:,} failed",
        f"{r.samples_per_s:.1f} samples/s",
        f"{_dur(r.wall_s)}",
    ]
    if r.errors_by_kind:
        by_reason = {k: (n, r.failure_details.get(k, "")) for k, n in sorted(r.errors_by_kind.items())}
        parts.append("failed " + failures_by_permanence(by_reason))
    if r.retried_by_kind:
        parts.append(f"retried {_kinds(r.retried_by_kind)}")
    if r.previous_failures:
        parts.append(retried_line(r.previous_failures))
    if r.context_fitted or r.context_overflow_skipped:
        parts.append(context_overflow_text(r))
    if r.integrity_violations:
        parts.append(f"{r.integrity_violations:,} integrity violations")
    if r.spec_figures_unread:
        parts.append(
            f"{sum(r.spec_figures_unread.values()):,} rows of a speculating server without acceptance figures "
            f"under any known name ({', '.join(sorted(r.spec_figures_unread))})"
        )
    if not r.reconciles:
        parts.append("COUNTS DO NOT RECONCILE")
    return " · ".join(parts)


def context_overflow_text(r: ShardReport) -> str:
    """The prompts whose prompt + max_new_tokens exceeded the server's context length, and what was done."""
    ctx = f"{r.server_context_length:,}" if r.server_context_length is not None else "?"
    parts = []
    if r.context_fitted:
        parts.append(f"{r.context_fitted:,} sent with max_new_tokens lowered to fit")
    if r.context_overflow_skipped:
        parts.append(f"{r.context_overflow_skipped:,} not sent (context_overflow)")
    return f"prompt + max_new_tokens > context {ctx}: " + ", ".join(parts)
