"""How many shards may generate at once: the `sglang` pool's limit, sized from the fleet (docs/fleet.md).

A `generations` step keeps up to its in-flight window of requests at the servers (by default
Σ (max_running_requests + headroom) over the endpoints: one shard alone can fill every slot). What
leaves slots idle is the *tail*: the last wave of a shard, and the parts of the step that send
nothing (endpoint probe, set-up, the gate after the answers). So the pool admits as many shards as
it takes to fill the slots, plus `overlap` more whose requests cover the others' tails. The next
shard's `tokenized_prompts` step is in no pool: its run tokenizes while earlier shards generate, so
the run queue admits RUNS_PER_POOL_SLOT runs per pool slot (generating, training behind, tokenizing
ahead): with fewer, the fleet waits for the next shard's tokenization (measured: bench/fleet.py).

These are plain functions; `eagle3 check` probes the configured endpoints (generate/fleet_capacity.py:
a router counts its workers) and writes the result into the instance's `dagster.yaml`
(`concurrency.pools.default_limit`, app/instance.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GENERATE_POOL = "sglang"  # the pool of the `generations` asset (defs/generate.py)
DEFAULT_OVERLAP = 1  # extra shards in the pool, whose queued requests fill the others' tails
RUNS_PER_POOL_SLOT = 3  # runs per generating shard: itself, one training behind, one tokenizing ahead


@dataclass(frozen=True)
class PoolSizing:
    """The pool limit and the run-queue limit, with what they were computed from (printed by `eagle3 check`)."""

    pool_limit: int
    max_concurrent_runs: int
    fleet_slots: int | None  # Σ max_running_requests (a router: of its workers); None: not known (no endpoint answered)
    endpoints: int
    unknown: tuple[str, ...]  # endpoints whose capacity could not be read
    shard_window: int | None  # requests one shard keeps in flight (None: the default window, which covers the fleet)

    def describe(self) -> str:
        if self.fleet_slots is None:
            basis = (
                f"capacity of {self.endpoints} endpoint(s) unknown ({', '.join(self.unknown)}): "
                "assumed one shard fills the fleet"
            )
        else:
            basis = f"{self.endpoints} endpoint(s), {self.fleet_slots} slots"
            if self.unknown:
                basis += f"; capacity unknown for {', '.join(self.unknown)}"
        window = f", {self.shard_window} requests per shard" if self.shard_window else ""
        return (
            f"pool {GENERATE_POOL}: {self.pool_limit} shard(s) generating at once, "
            f"{self.max_concurrent_runs} runs at once ({basis}{window})"
        )


def generate_pool_limit(
    slots_per_endpoint: Sequence[int],
    *,
    shard_window: int | None = None,
    shard_requests: int | None = None,
    overlap: int = DEFAULT_OVERLAP,
) -> int:
    """Shards whose `generations` steps may run at once to keep every slot of the fleet busy.

    slots_per_endpoint: max_running_requests of each server (a router: of each worker).
    shard_window: the requests one step keeps in flight (`max_in_flight`); None is the default
        window, Σ (max_running_requests + headroom), which alone covers the fleet.
    shard_requests: the requests of one shard (its prompts), when known: a shard smaller than the
        fleet cannot fill it, however large its window.
    overlap: shards beyond those that fill the slots, to cover the tails (>= 0).

    ceil(slots / min(window, requests)) + overlap; at least 1.
    """
    if overlap < 0:
        raise ValueError(f"overlap must be >= 0, got {overlap}")
    bad = [s for s in slots_per_endpoint if s < 1]
    if not slots_per_endpoint or bad:
        raise ValueError(f"every endpoint needs max_running_requests >= 1, got {list(slots_per_endpoint)}")
    for name, v in (("shard_window", shard_window), ("shard_requests", shard_requests)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    slots = sum(slots_per_endpoint)
    per_shard = min(v for v in (shard_window, shard_requests, slots) if v is not None)
    return max(1, math.ceil(slots / per_shard) + overlap)


def size_pools(
    capacity: Mapping[str, int | None],
    *,
    shard_window: int | None = None,
    shard_requests: int | None = None,
    overlap: int = DEFAULT_OVERLAP,
) -> PoolSizing:
    """The pool and run-queue limits from each endpoint's max_running_requests (None: unknown).

    Endpoints of unknown capacity are left out of the sum; with none known, one shard is assumed to
    fill the fleet (the default window covers every slot), so the limit is 1 + overlap.
    """
    known = [v for v in capacity.values() if v]
    unknown = tuple(k for k, v in capacity.items() if not v)
    if known:
        limit = generate_pool_limit(known, shard_window=shard_window, shard_requests=shard_requests, overlap=overlap)
    else:
        limit = 1 + overlap
    return PoolSizing(
        pool_limit=limit,
        max_concurrent_runs=limit * RUNS_PER_POOL_SLOT,
        fleet_slots=sum(known) if known else None,
        endpoints=len(capacity),
        unknown=unknown,
        shard_window=shard_window,
    )
