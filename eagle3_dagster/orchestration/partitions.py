"""Shard partitions: one StaticPartitionsDefinition per shard count, built when the definitions are.

Nothing here reads the settings: `definitions.build_definitions(s)` passes `s.shards.n_shards` to every asset,
sensor and run driver that needs the keys, so two definitions built from two settings in one process
(the demo's one-shard `--samples` run beside the deployment's) each have their own partitions.
"""

from __future__ import annotations

import functools

import dagster as dg

from ..config import check_n_shards
from ..storage import shard_key


@functools.cache
def shard_partitions(n_shards: int) -> dg.StaticPartitionsDefinition:
    """The partitions "0000" .. of `n_shards` shards (1 to config.MAX_N_SHARDS), one object per count."""
    return dg.StaticPartitionsDefinition([shard_key(i) for i in range(check_n_shards(n_shards))])


def shard_keys(n_shards: int) -> list[str]:
    """The partition keys of `n_shards` shards, in order."""
    return list(shard_partitions(n_shards).get_partition_keys())
