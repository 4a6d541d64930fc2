"""Generation client: tokenized prompts -> SGLang native POST /generate -> stored raw output_ids.

Public API (the Dagster `generations` asset calls `generate_shard`).
"""

from .client import integrity_violations
from .config import GenerationConfig, sample_key, sampling_hash, sampling_params
from .endpoints import AuthError, ModelRevisionError, NoEndpointError
from .report import ProgressReport, ShardReport
from .shard import generate_shard, generate_shard_async
from .store import ShardBusyError, StoreWriteError, read_generation_errors, read_generations

__all__ = [
    "AuthError",
    "GenerationConfig",
    "ModelRevisionError",
    "NoEndpointError",
    "ProgressReport",
    "ShardBusyError",
    "ShardReport",
    "StoreWriteError",
    "generate_shard",
    "generate_shard_async",
    "integrity_violations",
    "read_generation_errors",
    "read_generations",
    "sample_key",
    "sampling_hash",
    "sampling_params",
]
