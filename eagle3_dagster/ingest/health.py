"""Is a source healthy? No accepted prompt fails it; a high reject rate warns. Plain functions, no Dagster.

    assess(spec, counts) -> SourceHealth

A source that yields no accepted prompt (empty file, binary file, one oversized row, a format that
matches nothing, ...) is an error naming the source and its reject counts, unless its YAML says
`allow_empty: true` (then a warning). A reject rate (rejected / read) above the source's
`max_reject_rate` (default 0.5) is a warning: the source still feeds the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .counts import SourceCounts
from .spec import SourceSpec


def describe_counts(counts: SourceCounts) -> str:
    """`read 763: accepted 0, rejected 763 (invalid_utf8 700, not_json 63), duplicates 0`."""
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(counts.rejects_by_reason.items(), key=lambda kv: (-kv[1], kv[0])))
    extra = f", sampled out {counts.sampled_out}" if counts.sampled_out else ""
    return (
        f"read {counts.read}: accepted {counts.accepted}, rejected {counts.rejected}"
        + (f" ({reasons})" if reasons else "")
        + f", duplicates {counts.duplicates}{extra}"
    )


def reject_rate(counts: SourceCounts) -> float:
    return counts.rejected / counts.read if counts.read else 0.0


@dataclass
class SourceHealth:
    source: str
    empty: bool  # no accepted prompt
    allow_empty: bool
    reject_rate: float
    max_reject_rate: float
    counts_text: str
    problems: list[str] = field(default_factory=list)  # warnings (and the error, if failed)

    @property
    def failed(self) -> bool:
        return self.empty and not self.allow_empty

    @property
    def rate_exceeded(self) -> bool:
        return self.reject_rate > self.max_reject_rate


def empty_source_message(spec: SourceSpec, counts: SourceCounts) -> str:
    return (
        f"source {spec.name!r} yielded no accepted prompt ({describe_counts(counts)}); "
        "fix the file or the source YAML (format, field_map, max_bytes), "
        "or set `allow_empty: true` in the source YAML to make this a warning"
    )


def assess(spec: SourceSpec, counts: SourceCounts) -> SourceHealth:
    h = SourceHealth(
        source=spec.name,
        empty=counts.accepted == 0,
        allow_empty=spec.allow_empty,
        reject_rate=reject_rate(counts),
        max_reject_rate=float(spec.max_reject_rate),
        counts_text=describe_counts(counts),
    )
    if h.empty:
        h.problems.append(
            empty_source_message(spec, counts)
            if not spec.allow_empty
            else f"source {spec.name!r} yielded no accepted prompt (allowed: allow_empty: true); {h.counts_text}"
        )
    if h.rate_exceeded:
        h.problems.append(
            f"source {spec.name!r}: reject rate {h.reject_rate:.1%} is above max_reject_rate "
            f"{h.max_reject_rate:.0%} ({h.counts_text})"
        )
    return h
