"""Probe sets' cache keys: a probe prompt is generated again for every drafter the fleet runs.

A `role: probe` source (docs/probes.md) is a fixed prompt set on which every drafter version is
measured. Its samples' cache key (config.sample_key's `probe` part) holds the fleet's drafter key and
the run's `probe_seed`, so a new drafter (or a bumped seed) makes new samples for exactly those prompts.
The rows of earlier drafters stay in the shard folder (it keeps every sample ever generated), so each
drafter version keeps its own results. Training prompts carry no drafter in their key: the target's
tokens do not depend on the drafter (acceptance is a by-product), so a drafter change never
regenerates them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from .drafter import DrafterIdentity

NO_DRAFTER = "none"


def fleet_drafter_key(drafters: Iterable[DrafterIdentity | None]) -> str:
    """The drafter ids the fleet's endpoints run, sorted and joined with '+' ("none": no speculation)."""
    ids = sorted({d.drafter_id if d is not None else NO_DRAFTER for d in drafters})
    return "+".join(ids) or NO_DRAFTER


@dataclass(frozen=True)
class ProbeKeys:
    """Which sources are probe sets, and the drafter/seed part their samples' keys carry in this run."""

    sources: frozenset[str] = frozenset()
    drafter_key: str = NO_DRAFTER
    seed: int | None = None

    def tag(self, source: str | None) -> str | None:
        """The `probe` part of a sample's key: None for a training prompt (its key is unchanged)."""
        if source is None or source not in self.sources:
            return None
        return self.drafter_key if self.seed is None else f"{self.drafter_key}#{self.seed}"


def probe_prompt_ids(prompts: pl.DataFrame, sources: Iterable[str]) -> pl.Series:
    """The prompt ids of `prompts` (prompt_id, source) that belong to a probe set."""
    names = list(sources)
    if not names or "source" not in prompts.columns:
        return pl.Series("prompt_id", [], dtype=pl.String)
    return prompts.filter(pl.col("source").is_in(names)).get_column("prompt_id")


def without_probes(active: pl.DataFrame, prompts: pl.DataFrame, sources: Iterable[str]) -> pl.DataFrame:
    """The active samples (sample_id, prompt_id; the turns of all_turns conversations also conversation_id)
    minus the probe prompts' and every turn of a probe conversation: a probe set is never trained on."""
    probe_ids = probe_prompt_ids(prompts, sources)
    if probe_ids.len() == 0:
        return active
    probe = pl.col("prompt_id").is_in(probe_ids.implode())
    if "conversation_id" in active.columns:
        probe = probe | pl.col("conversation_id").is_in(probe_ids.implode()).fill_null(False)
    return active.filter(~probe)
