"""One shard's tokenize step: its prompts, a slice at a time, into tokenized_prompts/shard=NNNN/.

The step never holds the shard: each slice of prompts is rendered and encoded (pipeline.tokenize_prompts)
and written to part-0000.parquet as it comes; kept for the whole shard are its rejects (rejects.parquet)
and the gate's per-row features (scalars). Every prompt in is tokenized or rejected: the counts reconcile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import polars as pl

from ..schemas import TOKENIZE_REJECTS, TOKENIZED_PROMPTS
from ..storage import (
    ONE_ROW_GROUP_BYTES,
    ParquetSink,
    PathLike,
    arrow_batch,
    as_data_path,
    detached,
    write_frame_atomic,
)
from .pipeline import tokenize_prompts

TOKENIZED_FILE = "part-0000.parquet"
REJECTS_FILE = "rejects.parquet"


@dataclass
class TokenizedShard:
    """What tokenizing a shard produced: the counts, its rejects and the per-row gate features."""

    prompts_in: int
    tokenized: int
    rejects: pl.DataFrame
    features: pl.DataFrame


def tokenize_shard(
    prompts: Iterable[pl.DataFrame],
    renderer: Any,
    out: PathLike,
    *,
    max_new_tokens: int,
    control_text: Mapping[str, str],
    features: Callable[[pl.DataFrame], pl.DataFrame],
) -> TokenizedShard:
    """Tokenize the shard's `prompts` (PROMPTS slices) into `out`/part-0000.parquet; write the rejects to
    `out`/rejects.parquet. `control_text`: source name -> its policy (sources not named: reject);
    `features`: the gate's per-row features of a tokenized slice (quality.prompt_features)."""
    out = as_data_path(out)
    n_in = n_ok = 0
    rejected: list[pl.DataFrame] = []
    feats: list[pl.DataFrame] = []
    sink = ParquetSink(out / TOKENIZED_FILE, TOKENIZED_PROMPTS, buffer_bytes=ONE_ROW_GROUP_BYTES)
    try:
        for batch in prompts:
            tokenized, rejects = tokenize_prompts(
                batch, renderer, max_new_tokens=max_new_tokens, control_text=dict(control_text)
            )
            sink.write_table(arrow_batch(tokenized, TOKENIZED_PROMPTS))
            n_in, n_ok = n_in + batch.height, n_ok + tokenized.height
            rejected.append(detached(rejects))  # kept for the shard: must not pin the slice (storage/frames.py)
            feats.append(detached(features(tokenized)))
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    rejects = pl.concat(rejected) if rejected else cast(pl.DataFrame, pl.from_arrow(TOKENIZE_REJECTS.empty_table()))
    write_frame_atomic(rejects, out / REJECTS_FILE, schema=TOKENIZE_REJECTS)
    if n_in != n_ok + rejects.height:  # tokenize_prompts reconciles each slice; the sum must too
        raise RuntimeError(f"{out}: {n_in} prompts in, {n_ok} tokenized + {rejects.height} rejected out")
    if not feats:
        feats = [features(cast(pl.DataFrame, pl.from_arrow(TOKENIZED_PROMPTS.empty_table())))]
    return TokenizedShard(n_in, n_ok, rejects, pl.concat(feats))
