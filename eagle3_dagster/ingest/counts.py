"""What ingesting a source and combining the sources counted; both reconcile (see `reconciles`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .decontaminate import REASON as EVAL_OVERLAP

PROBE_OVERLAP = "probe_overlap"


@dataclass
class SourceCounts:
    read: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    sampled_out: int = 0  # only with sample_fraction; 0 otherwise

    def reconciles(self) -> bool:
        return self.read == self.accepted + self.rejected + self.duplicates + self.sampled_out and self.rejected == sum(
            self.rejects_by_reason.values()
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CombineCounts:
    """Totals over the training sources (eval sources: only eval_sources / eval_prompts). Two identities hold:
    input_accepted == prompts + cross_source_duplicates + eval_overlap, and
    read == prompts + cross_source_duplicates + rejects + source_duplicates + sampled_out
    (rejects holds the eval_overlap rows)."""

    sources: int = 0
    read: int = 0  # records read by the sources (from their counts.json)
    source_duplicates: int = 0  # duplicates removed inside each source
    sampled_out: int = 0
    input_accepted: int = 0  # rows read from the sources' accepted.parquet
    prompts: int = 0  # rows written to prompts.parquet
    cross_source_duplicates: int = 0  # input_accepted == prompts + cross_source_duplicates
    rejects: int = 0  # rows written to prompt_rejects.parquet (sum of the sources')
    prompts_by_source: dict[str, int] = field(default_factory=dict)
    duplicates_by_source: dict[str, int] = field(default_factory=dict)
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    eval_sources: int = 0
    eval_prompts: int = 0  # accepted rows of the eval sources: the reference
    eval_overlap: int = 0  # training prompts quarantined as eval_overlap (also in rejects)
    eval_overlap_by_source: dict[str, int] = field(default_factory=dict)  # training source -> removed
    probe_sources: int = 0  # role: probe sources among `sources` (their prompts are in `prompts`)
    probe_overlap: int = 0  # training prompts quarantined as probe_overlap (also in rejects)
    probe_overlap_by_source: dict[str, int] = field(default_factory=dict)  # training source -> removed

    def reconciles(self) -> bool:
        return (
            self.input_accepted == self.prompts + self.cross_source_duplicates + self.eval_overlap + self.probe_overlap
            and self.read
            == self.prompts + self.cross_source_duplicates + self.rejects + self.source_duplicates + self.sampled_out
            and self.rejects == sum(self.rejects_by_reason.values())
            and self.eval_overlap == self.rejects_by_reason.get(EVAL_OVERLAP, 0)
            and self.probe_overlap == self.rejects_by_reason.get(PROBE_OVERLAP, 0)
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
