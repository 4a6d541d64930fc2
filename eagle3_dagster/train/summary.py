"""What a training set looks like, as numbers: distribution summaries and the content identity.

`sample_stats(samples, profile)` computes one row of scalar statistics per training sample with the
same definitions as the generations gate (eagle3_dagster.quality.features.output_lengths, the lengths
generation_features reports, on the output part of `input_ids`): reasoning = tokens before the profile's think-end id, answer = tokens after it
up to a tool call or the end-of-turn id, tool call = the profile's call-begin id present.
`summarize(stats)` turns them into the JSON stored with every snapshot (manifest `summary`) and
beside every shard's training table (`training_samples/shard=NNNN/summary.json`):

    rows, sources {name: rows}, source_mix {name: share}, model_revisions / sampling_hashes {value: rows},
    model_revision / sampling_hash (the most common one), finish_reasons {reason: rows},
    think_end_rate, length_finish_rate, tool_call_rate,
    lengths {prompt_len|output_len|reasoning_len|answer_len: {n, mean, min, p5, p25, p50, p75, p95, max}},
    histograms {same columns: {edges, counts}}  (20 equal bins over [0, max])

`ContentHasher` is the snapshot identity: a sha256 over exactly what a trainer consumes, per row in
sample_id order: sample_id, input_ids, loss_mask, model_revision, template_hash, sampling_hash.
Nothing else enters it (not `generated_at`, not the server `endpoint`, not the Parquet encoding),
so regenerating identical tokens on another machine, port or day gives the same version.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ..profiles import ModelProfile

SUMMARY_FILE = "summary.json"  # beside training_samples/shard=NNNN/part-0000.parquet
LENGTHS = ("prompt_len", "output_len", "reasoning_len", "answer_len")
QUANTILES = {"p5": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95}
HIST_BINS = 20
# the training_samples columns a summary needs
STAT_COLUMNS = (
    "sample_id",
    "prompt_id",
    "source",
    "input_ids",
    "prompt_len",
    "output_len",
    "finish_reason",
    "model_revision",
    "sampling_hash",
)
IDENTITY_COLUMNS = ("sample_id", "input_ids", "loss_mask", "model_revision", "template_hash", "sampling_hash")
IDENTITY_SCHEME = "sha256 over sample_id, input_ids, loss_mask, model_revision, template_hash, sampling_hash (v1)"


def sample_stats(samples: pl.DataFrame, profile: ModelProfile) -> pl.DataFrame:
    """One row per training sample: source, finish_reason, model_revision, sampling_hash, the four
    lengths (reasoning/answer null when the output has no think-end), think_end, has_tool_call."""
    from ..quality.features import output_lengths

    cols = {
        "source": pl.String,
        "finish_reason": pl.String,
        "model_revision": pl.String,
        "sampling_hash": pl.String,
        "prompt_len": pl.Int32,
        "output_len": pl.Int32,
        "reasoning_len": pl.Int32,
        "answer_len": pl.Int32,
        "think_end": pl.Boolean,
        "has_tool_call": pl.Boolean,
    }
    if samples.height == 0:
        return pl.DataFrame(schema=cols)
    out_ids = pl.col("input_ids").list.slice(pl.col("prompt_len"))
    return samples.select(
        pl.col("source").cast(pl.String),
        pl.col("finish_reason").cast(pl.String),
        pl.col("model_revision").cast(pl.String),
        pl.col("sampling_hash").cast(pl.String),
        pl.col("prompt_len").cast(pl.Int32),
        *output_lengths(out_ids, profile),
    ).cast(cols)  # type: ignore[arg-type]


def _counts(s: pl.Series) -> dict[str, int]:
    vc = s.fill_null("(none)").value_counts(sort=True)
    return {str(k): int(v) for k, v in vc.iter_rows()}


def _rate(s: pl.Series, n: int) -> float | None:
    return round(float(s.sum()) / n, 6) if n else None


def _histogram(values: np.ndarray) -> dict[str, Any]:
    if values.size == 0:
        return {"edges": [], "counts": []}
    top = int(values.max())
    width = max(1, math.ceil((top + 1) / HIST_BINS))
    edges = [i * width for i in range(HIST_BINS + 1)]
    counts, _ = np.histogram(values, bins=edges)
    return {"edges": edges, "counts": [int(c) for c in counts]}


def length_stats(s: pl.Series) -> dict[str, Any]:
    v = s.drop_nulls().cast(pl.Float64).to_numpy()
    if len(v) == 0:
        return {"n": 0}
    out: dict[str, Any] = {"n": len(v), "mean": round(float(v.mean()), 3), "min": int(v.min())}
    for name, q in QUANTILES.items():
        out[name] = float(np.quantile(v, q))  # linear interpolation, as polars' "linear"
    out["max"] = int(v.max())
    return out


def summarize(stats: pl.DataFrame) -> dict[str, Any]:
    """The distribution summary of a stats frame (see the module docstring for its fields)."""
    n = stats.height
    sources = _counts(stats["source"]) if n else {}
    revisions = _counts(stats["model_revision"]) if n else {}
    samplings = _counts(stats["sampling_hash"]) if n else {}
    return {
        "rows": n,
        "sources": sources,
        "source_mix": {k: round(v / n, 6) for k, v in sources.items()},
        "model_revisions": revisions,
        "model_revision": next(iter(revisions), None),
        "sampling_hashes": samplings,
        "sampling_hash": next(iter(samplings), None),
        "finish_reasons": _counts(stats["finish_reason"]) if n else {},
        "think_end_rate": _rate(stats["think_end"], n),
        "length_finish_rate": _rate(stats["finish_reason"] == "length", n),
        "tool_call_rate": _rate(stats["has_tool_call"], n),
        "lengths": {c: length_stats(stats[c]) for c in LENGTHS},
        "histograms": {c: _histogram(stats[c].drop_nulls().to_numpy()) for c in LENGTHS},
    }


def summarize_samples(samples: pl.DataFrame, profile: ModelProfile) -> dict[str, Any]:
    return summarize(sample_stats(samples, profile))


def headline(summary: dict[str, Any]) -> dict[str, float]:
    """The numbers worth a trend line across nights (numeric Dagster metadata)."""
    out: dict[str, float] = {"rows": float(summary.get("rows") or 0)}
    for c in LENGTHS:
        st = (summary.get("lengths") or {}).get(c) or {}
        for q in ("p50", "p95"):
            if st.get(q) is not None:
                out[f"{c}_{q}"] = float(st[q])
    for r in ("think_end_rate", "length_finish_rate", "tool_call_rate"):
        if summary.get(r) is not None:
            out[r] = float(summary[r])
    return out


SCALAR_IDENTITY = ("sample_id", "model_revision", "template_hash", "sampling_hash")
LIST_IDENTITY = (("input_ids", np.int32), ("loss_mask", np.int8))


def _list_lengths(col: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _flat(col: pa.Array, dtype: Any) -> np.ndarray:
    return pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(dtype)


class ContentHasher:
    """Feed each included shard's training table (any row order); `hexdigest()` is the identity.

    Rows are hashed in sample_id order within each shard, shards in the order given (shard order is
    deterministic: a prompt's shard is a hash of its id). Each field is length-prefixed, so no two
    different tables serialize to the same bytes.
    """

    def __init__(self) -> None:
        self._h = hashlib.sha256(IDENTITY_SCHEME.encode())
        self.rows = 0

    def _blob(self, tag: str, data: bytes) -> None:
        self._h.update(f"{tag}:{len(data)}:".encode())
        self._h.update(data)

    def update(self, table: pa.Table) -> None:
        t = table.select(list(IDENTITY_COLUMNS))
        t = t.take(pc.sort_indices(t, sort_keys=[("sample_id", "ascending")]))
        self.rows += t.num_rows
        self._blob("rows", str(t.num_rows).encode())
        for name in SCALAR_IDENTITY:
            col = t[name].combine_chunks() if t.num_rows else pa.array([], pa.string())
            vals = ["\x00" if v is None else v for v in col.to_pylist()]
            self._blob(name, "\x1f".join(vals).encode())
        for name, dtype in LIST_IDENTITY:
            col = t[name].combine_chunks() if t.num_rows else pa.array([], pa.list_(pa.int32()))
            self._blob(f"{name}.len", _list_lengths(col).tobytes())
            self._blob(name, _flat(col, dtype).tobytes())

    def update_file(
        self,
        path: Any,
        *,
        batch_rows: int = 256,
        also_read: Sequence[str] = (),
        on_batch: Callable[[pa.RecordBatch], None] | None = None,
    ) -> None:
        """`update` with one shard table read from its Parquet file a batch at a time (the same digest).

        A table in sample_id order (as the pipeline writes them) is streamed: one pass reads the
        identity columns (and `also_read`) in batches of `batch_rows`, keeping only the per-row scalars
        and list lengths (each field's length prefix comes first), and hands each batch to `on_batch`;
        then `input_ids` and `loss_mask` are hashed from a pass of their own each. A table that is not
        in sample_id order is read whole and sorted (`update`), its batches handed to `on_batch` after."""
        from .export import in_sample_id_order, shard_batches, stream_parquet_file

        cols = list(dict.fromkeys([*IDENTITY_COLUMNS, *also_read]))
        pf = stream_parquet_file(path)
        ids = pf.read(columns=["sample_id"]).column(0)
        if not in_sample_id_order(ids):
            table = pf.read(columns=cols)
            self.update(table)
            if on_batch is not None:
                for b in table.to_batches(max_chunksize=batch_rows):
                    on_batch(b)
            return
        scalars: dict[str, list[pa.Array]] = {n: [] for n in SCALAR_IDENTITY}
        lengths: dict[str, list[np.ndarray]] = {n: [] for n, _ in LIST_IDENTITY}
        n_rows = 0
        for b in pf.iter_batches(batch_size=batch_rows, columns=cols):
            n_rows += b.num_rows
            for name in SCALAR_IDENTITY:
                scalars[name].append(b.column(name))
            for name, _ in LIST_IDENTITY:
                lengths[name].append(_list_lengths(b.column(name)))
            if on_batch is not None:
                on_batch(b)
        self.rows += n_rows
        self._blob("rows", str(n_rows).encode())
        for name in SCALAR_IDENTITY:
            vals = ["\x00" if v is None else v for a in scalars[name] for v in a.to_pylist()]
            self._blob(name, "\x1f".join(vals).encode())
        for name, dtype in LIST_IDENTITY:
            lens = np.concatenate(lengths[name]) if lengths[name] else np.zeros(0, np.int64)
            self._blob(f"{name}.len", lens.tobytes())
            total = int(lens[lens > 0].sum()) * np.dtype(dtype).itemsize
            self._h.update(f"{name}:{total}:".encode())  # the blob's header, then its data batch by batch
            for b in shard_batches(path, ["sample_id", name], batch_rows=batch_rows):
                self._h.update(_flat(b.column(name), dtype).tobytes())

    def hexdigest(self) -> str:
        return self._h.hexdigest()
