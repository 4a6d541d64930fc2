"""What a run will do, counted before it runs: prompts, prompt tokens, requests already cached.

Every number comes from the pipeline's own functions, so the plan and the run agree by construction:

- prompts: `ingest_source` per source YAML and `combine_sources` (the `source__*` and `prompts`
  assets), written to a scratch folder that is deleted afterwards;
- prompt tokens: `tokenize_prompts` with the real tokenizer (the `tokenized_prompts` asset), a
  slice of PLAN_SLICE_ROWS prompts at a time (ids are summed, never held);
- cached requests: the generate step's cache key of every tokenized prompt (built by its own
  `generate.inputs.SampleKeys`: a probe set's prompts hold the fleet's drafter and the probe seed),
  classified against the shard's stored sample ids with `generate.inputs.classify` (the same
  decision `plan_shard` makes), and the earlier permanent failures it does not resend.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl

from ..generate.inputs import SampleKeys, classify, stored_keys
from ..generate.probes import NO_DRAFTER, ProbeKeys
from ..generate.rows import is_permanent_reason
from ..generate.store import read_generation_errors
from ..ingest import SourceSpec, combine_sources, ingest_source
from ..storage import DataPath, parquet_file, shard_dir
from ..tokenize import PromptRenderer, tokenize_prompts

PLAN_SLICE_ROWS = 4096  # prompts tokenized at a time, as the tokenized_prompts step does


@dataclass
class PromptCounts:
    """The ingest stage's totals (CombineCounts) plus the sources that would fail the run (no prompt)."""

    read: int
    prompts: int
    rejected: int
    duplicates: int
    sampled_out: int
    prompts_by_source: dict[str, int]
    empty_sources: list[str] = field(default_factory=list)  # no accepted prompt and no allow_empty


@dataclass
class TokenizedRows:
    """One row per prompt that tokenizes: what the cache key and the estimates need (no input_ids)."""

    frame: pl.DataFrame  # prompt_id, source, shard, template_hash, prompt_len
    rejects_by_reason: dict[str, int]
    probe_ids: list[list[int]]  # input_ids of the first few prompts, for a throughput probe
    tokenizer_fingerprint: str
    template_hash: str

    @property
    def prompt_tokens(self) -> int:
        return int(self.frame["prompt_len"].sum()) if self.frame.height else 0


@dataclass
class CacheCounts:
    """Per the generate step: requested = distinct cache keys; cached + failed_before + to_send == requested."""

    requested: int
    cached: int
    failed_before: int  # failed permanently in an earlier run (a 400, a bad prompt): not sent again
    to_send: int
    send: pl.DataFrame  # prompt_id, source, shard, prompt_len of the requests to send


def count_prompts(specs: Sequence[SourceSpec], *, n_shards: int, scratch: Path) -> tuple[PromptCounts, Path]:
    """Run the ingest stage into `scratch` (sources/<name>, prompts/); returns the counts and prompts.parquet."""
    dirs = []
    empty = []
    for spec in specs:
        out = scratch / "sources" / spec.name
        counts = ingest_source(spec, out, n_shards=n_shards)
        if counts.accepted == 0 and not spec.allow_empty:
            empty.append(spec.name)
        dirs.append(out)
    combined = combine_sources(
        dirs, scratch / "prompts", n_shards=n_shards, control_text={s.name: s.control_text for s in specs}
    )
    return (
        PromptCounts(
            read=combined.read,
            prompts=combined.prompts,
            rejected=combined.rejects,
            duplicates=combined.source_duplicates + combined.cross_source_duplicates,
            sampled_out=combined.sampled_out,
            prompts_by_source=dict(combined.prompts_by_source),
            empty_sources=empty,
        ),
        scratch / "prompts" / "prompts.parquet",
    )


def scratch_dir(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="plan-", dir=parent))


def remove_scratch(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def tokenize_for_plan(
    prompts_path: Path | DataPath,
    renderer: PromptRenderer,
    *,
    max_new_tokens: int,
    control_text: Mapping[str, str],
    probe_prompts: int = 16,
) -> TokenizedRows:
    """Tokenize prompts.parquet exactly as the tokenized_prompts step does, keeping lengths only."""
    parts: list[pl.DataFrame] = []
    rejects: dict[str, int] = {}
    probe: list[list[int]] = []
    for rb in parquet_file(prompts_path).iter_batches(batch_size=PLAN_SLICE_ROWS):
        prompts = cast(pl.DataFrame, pl.from_arrow(rb))
        tokenized, rejected = tokenize_prompts(
            prompts, renderer, max_new_tokens=max_new_tokens, control_text=dict(control_text)
        )
        for reason, n in rejected.group_by("reason").len().iter_rows():
            rejects[reason] = rejects.get(reason, 0) + int(n)
        if len(probe) < probe_prompts and tokenized.height:
            probe.extend(tokenized["input_ids"].head(probe_prompts - len(probe)).to_list())
        parts.append(tokenized.select("prompt_id", "source", "shard", "template_hash", "prompt_len"))
    frame = (
        pl.concat(parts)
        if parts
        else pl.DataFrame(
            schema={
                "prompt_id": pl.String,
                "source": pl.String,
                "shard": pl.Int32,
                "template_hash": pl.String,
                "prompt_len": pl.Int32,
            }
        )
    )
    return TokenizedRows(frame, rejects, probe, renderer.tokenizer_fingerprint, renderer.template_hash)


def _keys(sample_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    hi = np.fromiter((int(s[:16], 16) for s in sample_ids), dtype=np.uint64, count=len(sample_ids))
    lo = np.fromiter((int(s[16:32], 16) for s in sample_ids), dtype=np.uint64, count=len(sample_ids))
    return hi, lo


@dataclass(frozen=True)
class PlanKeys:
    """The generate step's cache keys as the plan can know them (`SampleKeys` builds each one). A probe set's
    keys hold the fleet's drafter: with none known (`drafter_key` None: no endpoint answered and none
    stored) its prompts cannot match a stored key and count as to be sent (the caller states that)."""

    model_revision: str | None
    s_hash: str
    regen_seed: int | None
    row_hash: Callable[[int], str] | None = None
    probe_sources: frozenset[str] = frozenset()
    drafter_key: str | None = None
    probe_seed: int | None = None

    def sample_keys(self) -> SampleKeys | None:
        if self.model_revision is None:
            return None
        probes = ProbeKeys(self.probe_sources, self.drafter_key or NO_DRAFTER, self.probe_seed)
        return SampleKeys(self.model_revision, self.s_hash, self.regen_seed, self.row_hash, probes)

    def unknown(self, sources: Sequence[str | None]) -> np.ndarray:
        """Per row: no key can be known (no revision, or a probe prompt with no drafter known)."""
        if self.model_revision is None:
            return np.ones(len(sources), dtype=bool)
        if self.drafter_key is not None or not self.probe_sources:
            return np.zeros(len(sources), dtype=bool)
        return np.fromiter((s in self.probe_sources for s in sources), dtype=bool, count=len(sources))


def _shard_ids(part: pl.DataFrame, keys: PlanKeys) -> list[str]:
    """Each row's sample_id, built by the generate step's own SampleKeys (one place builds a key)."""
    sk = keys.sample_keys()
    if sk is None:
        return []
    return [
        sk.of(p, t, int(n), src)[0]
        for p, t, n, src in zip(part["prompt_id"], part["template_hash"], part["prompt_len"], part["source"])
    ]


def _permanent_skips(gen_dir: DataPath, sids: list[str]) -> np.ndarray:
    """Per key: an earlier permanent failure (a 400, a bad prompt) the generate step does not send again."""
    prior = read_generation_errors(gen_dir)
    permanent = {r for r, reason in prior.select("sample_id", "reason").iter_rows() if is_permanent_reason(reason)}
    if not permanent:
        return np.zeros(len(sids), dtype=bool)
    return np.fromiter((s in permanent for s in sids), dtype=bool, count=len(sids))


def count_cached(
    rows: pl.DataFrame,
    data: DataPath,
    keys: PlanKeys,
    *,
    retry_permanent_errors: bool = False,
) -> CacheCounts:
    """Which of the tokenized prompts the generate step would send, shard by shard.

    Without a model revision (no endpoint answered and nothing is stored) no key can match: every
    request counts as to be sent, and so does every probe prompt without a known drafter (the caller
    states those assumptions)."""
    requested = cached = failed_before = 0
    send_parts: list[pl.DataFrame] = []
    for (shard,), part in rows.partition_by("shard", as_dict=True, maintain_order=True).items():
        gen_dir = shard_dir(data, "generations", int(cast(Any, shard)))
        sids = _shard_ids(part, keys)
        unknown = keys.unknown(part["source"].to_list())
        if sids:
            first, in_store = classify(*_keys(sids), *stored_keys(gen_dir))
            in_store &= ~unknown
        else:
            first, in_store = np.ones(part.height, dtype=bool), np.zeros(part.height, dtype=bool)
        skip = np.zeros(part.height, dtype=bool)
        if sids and not retry_permanent_errors:
            skip = _permanent_skips(gen_dir, sids) & ~unknown
        send = first & ~in_store & ~skip
        requested += int(first.sum())
        cached += int((first & in_store).sum())
        failed_before += int((first & ~in_store & skip).sum())
        send_parts.append(part.filter(pl.Series(send)).select("prompt_id", "source", "shard", "prompt_len"))
    send_frame = (
        pl.concat(send_parts)
        if send_parts
        else pl.DataFrame(
            schema={"prompt_id": pl.String, "source": pl.String, "shard": pl.Int32, "prompt_len": pl.Int32}
        )
    )
    return CacheCounts(requested, cached, failed_before, send_frame.height, send_frame)


def stored_revision(data: DataPath, shards: Sequence[int]) -> str | None:
    """The model revision of the newest stored chunk among `shards` (what the last run generated with)."""
    newest: tuple[str, str] | None = None
    for shard in shards:
        files = shard_dir(data, "generations", shard).glob("part-*.parquet")
        if not files:
            continue
        last = files[-1]  # names sort by time
        revs = parquet_file(last).read(columns=["model_revision"]).column("model_revision").to_pylist()
        if revs and revs[-1] and (newest is None or last.name > newest[0]):
            newest = (last.name, str(revs[-1]))
    return newest[1] if newest else None
