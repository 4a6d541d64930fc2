"""The snapshot identity: a sha256 over exactly what a trainer consumes, per row in sample_id order: sample_id,
input_ids, loss_mask, model_revision, template_hash, sampling_hash, and, where the training tables carry them
(EAGLE3_TRAIN_ACCEPTANCE), the acceptance figures the exports carry (`spec_accept_rate`, `spec_accept_length`,
null included). Nothing else enters it (not `generated_at`, not the server `endpoint`, not the Parquet
encoding), so regenerating identical tokens on another machine, port or day gives the same version, while
switching the acceptance columns on (or a figure that changes) makes a new one: the same rows published
again with the columns are new content, never "already LATEST". Tables without them hash as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..train.samples import ACCEPTANCE_COLUMNS

IDENTITY_COLUMNS = ("sample_id", "input_ids", "loss_mask", "model_revision", "template_hash", "sampling_hash")
IDENTITY_SCHEME = "sha256 over sample_id, input_ids, loss_mask, model_revision, template_hash, sampling_hash (v1)"
SCALAR_IDENTITY = ("sample_id", "model_revision", "template_hash", "sampling_hash")
LIST_IDENTITY = (("input_ids", np.int32), ("loss_mask", np.int8))
FLOAT_IDENTITY = ACCEPTANCE_COLUMNS  # hashed only when a table has them (the exports then carry them)


def _list_lengths(col: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _flat(col: pa.Array, dtype: Any) -> np.ndarray:
    return pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(dtype)


def _floats(cols: Sequence[pa.Array]) -> bytes:
    """A float column's values and validity, so a null never hashes like any number."""
    arr = pa.concat_arrays([c.cast(pa.float64()) for c in cols]) if cols else pa.array([], pa.float64())
    valid = pc.is_valid(arr).to_numpy(zero_copy_only=False).astype(np.int8)
    values = pc.fill_null(arr, 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
    return valid.tobytes() + values.tobytes()


def float_columns(names: Sequence[str]) -> list[str]:
    """The FLOAT_IDENTITY columns among a table's column names."""
    return [c for c in FLOAT_IDENTITY if c in names]


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
        floats = float_columns(table.column_names)
        t = table.select([*IDENTITY_COLUMNS, *floats])
        t = t.take(pc.sort_indices(t, sort_keys=[("sample_id", "ascending")]))
        self.rows += t.num_rows
        self._blob("rows", str(t.num_rows).encode())
        for name in SCALAR_IDENTITY:
            col = t[name].combine_chunks() if t.num_rows else pa.array([], pa.string())
            vals = ["\x00" if v is None else v for v in col.to_pylist()]
            self._blob(name, "\x1f".join(vals).encode())
        for name in floats:
            self._blob(name, _floats(t[name].chunks))
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

        pf = stream_parquet_file(path)
        floats = float_columns(pf.schema_arrow.names)
        cols = list(dict.fromkeys([*IDENTITY_COLUMNS, *floats, *also_read]))
        ids = pf.read(columns=["sample_id"]).column(0)
        if not in_sample_id_order(ids):
            table = pf.read(columns=cols)
            self.update(table)
            if on_batch is not None:
                for b in table.to_batches(max_chunksize=batch_rows):
                    on_batch(b)
            return
        scalars: dict[str, list[pa.Array]] = {n: [] for n in (*SCALAR_IDENTITY, *floats)}
        lengths: dict[str, list[np.ndarray]] = {n: [] for n, _ in LIST_IDENTITY}
        n_rows = 0
        for b in pf.iter_batches(batch_size=batch_rows, columns=cols):
            n_rows += b.num_rows
            for name in (*SCALAR_IDENTITY, *floats):
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
        for name in floats:
            self._blob(name, _floats(scalars[name]))
        for name, dtype in LIST_IDENTITY:
            lens = np.concatenate(lengths[name]) if lengths[name] else np.zeros(0, np.int64)
            self._blob(f"{name}.len", lens.tobytes())
            total = int(lens[lens > 0].sum()) * np.dtype(dtype).itemsize
            self._h.update(f"{name}:{total}:".encode())  # the blob's header, then its data batch by batch
            for b in shard_batches(path, ["sample_id", name], batch_rows=batch_rows):
                self._h.update(_flat(b.column(name), dtype).tobytes())

    def hexdigest(self) -> str:
        return self._h.hexdigest()
