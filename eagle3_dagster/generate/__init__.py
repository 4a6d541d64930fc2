"""Generation client: tokenized prompts -> SGLang native POST /generate -> stored raw output_ids.

The Dagster `generations` asset calls (`s`: the Settings its definitions were built from, config.py):

    cfg = generation_config(profile, sglang.endpoints(s.fleet.urls), s, sglang.generation_fields())  # values passed in
    report = generate_shard(tokenized, shard_dir(data, "generations", k), cfg, progress=log_progress)
    MaterializeResult(metadata=report.as_metadata())
    df = read_generations(shard_dir(...))                          # schemas.GENERATIONS, one row a sample

`tokenized` is a TOKENIZED_PROMPTS DataFrame or the Path of the shard's Parquet (streamed).
Modules: config (what is sent, cache keys), endpoints (health, balancing, circuit breaker),
endpoint_info (errors, endpoint state, what a server reports), client (one request with retries,
request_errors its failures, sse a streamed answer), answer_checks (every answer checked against what
was sent), inputs (which rows to send), engine (the workers' parts: next item, gate, send, record),
flush (the buffer's chunk writes), store (atomic chunks, lock, resume), report (progress and metadata),
shard (the run).
"""

from ..secret import redact_http_library_logs
from .answer_checks import integrity_violations
from .config import GenerationConfig, sample_key, sampling_hash, sampling_params
from .endpoint_info import AuthError, ModelRevisionError, NoEndpointError
from .inputs import InputChangedError, TokenizedSource
from .report import ProgressReport, ShardReport
from .shard import generate_shard, generate_shard_async
from .store import ShardBusyError, StoreWriteError, read_generation_errors, read_generations

redact_http_library_logs()  # httpx logs every request's URL, user:password@ included

__all__ = [
    "AuthError",
    "GenerationConfig",
    "InputChangedError",
    "ModelRevisionError",
    "NoEndpointError",
    "ProgressReport",
    "ShardBusyError",
    "ShardReport",
    "StoreWriteError",
    "TokenizedSource",
    "generate_shard",
    "generate_shard_async",
    "integrity_violations",
    "read_generation_errors",
    "read_generations",
    "sample_key",
    "sampling_hash",
    "sampling_params",
]
