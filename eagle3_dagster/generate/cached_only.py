"""A shard whose every request is already stored needs no server.

The cache key of a request holds the model revision, which normally comes from the endpoint's
/model_info. An endpoint that answers at all is asked, as always: it may serve a new model or drafter,
and then the shard is not cached after all. Only when no endpoint answers (one quick probe, no wait)
and the revision is known without asking (pinned in the config, or the one the shard's newest stored
chunk was generated with) and every prompt's key under it is stored (or failed permanently before and
is not resent), the step has nothing to send: it must not wait for the endpoint, and it says which
revision it relied on. Anything else (a prompt not stored, all_turns conversations, prompts the
server's context would have fitted) falls back to the normal path, which waits for the server. A shard
without prompts has nothing to send under any revision.

Probe prompts (`role: probe`) are keyed as `eagle3 plan` keys them when no endpoint answers: with the
drafter of the newest stored probe results (`config.stored_probe_drafter`), so a night the plan says has
nothing to send does not wait for a dead endpoint over its probe prompts. The report then says the drafter
was not asked (`drafter_asked` False): the night records no drafter of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import httpx
import polars as pl

from ..storage import DataPath, as_data_path, parquet_file
from .config import GenerationConfig, sampling_hash
from .inputs import SampleKeys, TokenizedSource, plan_shard, stored_keys
from .probes import NO_DRAFTER, ProbeKeys
from .report import ShardReport
from .rows import is_permanent_reason
from .store import StoreDir, read_generation_errors

log = logging.getLogger(__name__)


async def any_endpoint_answers(
    client: httpx.AsyncClient, headers: dict[str, str], urls: Sequence[str], timeout_s: float
) -> bool:
    """True when any endpoint answers HTTP at all (one probe each, in parallel; never waits for one to come
    up): a server that answers, even `503 starting`, is the normal path's to ask and wait for."""

    async def answers(url: str) -> bool:
        try:
            await client.get(url.rstrip("/") + "/health", headers=headers, timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return True

    return any(await asyncio.gather(*(answers(u) for u in urls)))


def stored_shard_revision(out_dir: DataPath) -> str | None:
    """The model revision of the shard's newest stored chunk (what its last run generated with)."""
    files = out_dir.glob("part-*.parquet")
    if not files:
        return None
    revs = parquet_file(files[-1]).read(columns=["model_revision"]).column("model_revision").to_pylist()
    return str(revs[-1]) if revs and revs[-1] else None


def cached_only_report(
    tokenized: TokenizedSource, out_dir: StoreDir, config: GenerationConfig, *, has_turns: bool
) -> ShardReport | None:
    """The shard's report when nothing is left to send under a revision known without the server; else None."""
    out = as_data_path(out_dir)
    revision = config.model_revision or stored_shard_revision(out)
    if has_turns:
        return None
    prior = read_generation_errors(out)
    if not config.retry_permanent_errors and prior.height:
        prior = prior.filter(pl.col("reason").map_elements(is_permanent_reason, return_dtype=pl.Boolean))
    else:
        prior = prior.clear()
    s_hash = sampling_hash(config)
    drafter_key = config.stored_probe_drafter or NO_DRAFTER  # as `eagle3 plan` keys them without an endpoint
    probes = ProbeKeys(frozenset(config.probe_sources), drafter_key, config.probe_seed)
    plan = plan_shard(
        tokenized,
        SampleKeys(revision or "", s_hash, config.regen_seed, probes=probes),
        stored=stored_keys(out),
        skip_ids=frozenset(prior.get_column("sample_id").to_list()),
    )
    if plan.pending or (not revision and plan.requested):  # no revision known: only an empty shard is done
        return None
    carried = prior.filter(pl.col("sample_id").is_in(plan.carried_ids)).unique("sample_id", keep="last")
    report = ShardReport(
        requested=plan.requested,
        skipped_cached=plan.skipped_cached,
        duplicates_in_input=plan.rows - plan.excluded - plan.requested,
        model_revision=revision or "",
        sampling_hash=s_hash,
        carried_failed=carried.height,
        failed=carried.height,
        drafter_key=drafter_key,
        drafter_asked=False,
    )
    for reason in carried.get_column("reason").to_list():
        report.errors_by_kind[reason] = report.errors_by_kind.get(reason, 0) + 1
    if not revision:
        log.info("shard %s: no prompt to send: the endpoint was not contacted", out.name)
        return report
    log.warning(
        "shard %s: no SGLang endpoint answers; all %d requests are already stored under revision %s (%s): "
        "nothing to send. A changed model or drafter is picked up on a run where the endpoint answers",
        out.name,
        plan.requested,
        revision,
        "pinned" if config.model_revision else "the shard's stored generations",
    )
    return report
