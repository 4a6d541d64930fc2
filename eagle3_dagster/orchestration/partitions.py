"""Shard partitions: fixed at definitions load from EAGLE3_N_SHARDS (default 4)."""

from __future__ import annotations

import dagster as dg

from ..config import settings
from ..storage import shard_key

N_SHARDS = settings().n_shards
shard_partitions = dg.StaticPartitionsDefinition([shard_key(i) for i in range(N_SHARDS)])
