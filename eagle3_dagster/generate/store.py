"""The shard's append-only store: small atomic Parquet chunks, resumable, never duplicated.

Layout of data/generations/shard=NNNN/:
  part-<ns>-<rand>.parquet   generated samples (schemas.GENERATIONS), one file a flush
  part-<ns>-<rand>.compacted.parquet
                             the shard's chunks merged into one (compact()), see below
  errors.parquet             this run's failed samples (schemas.GENERATION_ERRORS), rewritten atomically
  .lock                      flock held by the one process writing the shard (local data only)

Why this is safe: a chunk appears under its final name only via rename (local) or when its single
upload completes (object storage), so a SIGKILL leaves either the whole chunk or nothing; the rerun
reads the stored sample_ids and skips them; the lock stops two processes from generating the same
shard at once (the only way to duplicate).

On object storage there is no shared lock: the flock is taken on a local file under the work dir
(`lock_dir`), which guards one machine only. Across machines the guard is Dagster running one run
per partition at a time (a backfill launches one run per shard; docs/scale-out.md shows the
`dagster/partition` run-queue limit that enforces it). Even if two writers did race, each chunk is
whole and readers keep one row per sample_id (`read_generations`): duplicates cost requests, not
correctness.

Compaction (`ShardStore.compact`, at the end of a successful shard run once more than K chunks
exist): one new chunk holding every stored row, deduplicated exactly as `read_generations` does
(first row per sample_id in name order, same row order), then the old chunks are deleted. It is
crash-safe without any rename:
- the compacted chunk is written like any chunk (`write_table_atomic`: tmp + rename locally, one
  PUT on object storage), so a crash before it is complete leaves nothing under a final name;
- its name sorts after every chunk it replaces, and it holds exactly their winning rows, so while
  both exist readers still pick the same row per sample_id (the old chunk's, identical);
- the old chunks are deleted newest first, so every intermediate state also reads identically
  (whatever remains of them is a name-ordered prefix, whose winners are the compacted rows);
- its Parquet footer lists the chunks it replaces (`eagle3.compacted_from`): the next open of
  the store deletes any that a crash left behind ("the next run finishes the job").
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa

from .. import schemas
from ..storage import (
    DataPath,
    ParquetSink,
    as_data_path,
    describe_owner,
    owner_record,
    parquet_file,
    parquet_num_rows,
    read_owner,
    read_parquet,
    scan_parquet,
    write_table_atomic,
)

log = logging.getLogger(__name__)

PART_GLOB = "part-*.parquet"
COMPACTED_GLOB = "part-*.compacted.parquet"
COMPACTED_FROM = b"eagle3.compacted_from"  # footer key: JSON list of the chunk names a compacted chunk replaces
ERRORS_FILE = "errors.parquet"
SUPERSEDED_PREFIX = "superseded-"  # stored rows replaced by a retry (requeue.py): kept, never read as samples
COUNT_BATCH_ROWS = 2048  # rows decoded at a time by count_current_samples
_PART_NS = re.compile(r"^part-([0-9]{20})-")


class ShardBusyError(RuntimeError):
    """Another process holds this shard's lock."""


class StoreWriteError(RuntimeError):
    """A chunk could not be written after retries; nothing was half-written, the run stops."""


StoreDir = Path | str | DataPath


def chunk_files(out_dir: StoreDir) -> list[DataPath]:
    """The shard's chunk files in write order (their names sort by time)."""
    return as_data_path(out_dir).glob(PART_GLOB)


def stored_sample_ids(out_dir: StoreDir) -> pl.Series:
    files = chunk_files(out_dir)
    if not files:
        return pl.Series("sample_id", [], dtype=pl.String)
    return scan_parquet(files, columns=["sample_id"]).collect().get_column("sample_id").unique()


def read_generations(out_dir: StoreDir) -> pl.DataFrame:
    """All stored samples of a shard, one row per sample_id (defensive: the writer never duplicates)."""
    files = chunk_files(out_dir)
    if not files:
        return cast(pl.DataFrame, pl.from_arrow(schemas.GENERATIONS.empty_table()))
    df = read_parquet(files)
    return df.unique(subset="sample_id", keep="first", maintain_order=True)


def count_current_samples(out_dir: StoreDir, current_ids: Iterable[str]) -> int:
    """How many of `current_ids` have a stored sample with output ids, a batch at a time.

    The same answer as filtering `read_generations` on the ids and non-null output_ids, without holding the
    shard's output ids in memory (at 100,000 samples of 1,500 tokens that read alone is over a gigabyte):
    only `sample_id` and a validity bit per row are kept, COUNT_BATCH_ROWS rows decoded at a time."""
    wanted = set(current_ids)
    found: set[str] = set()
    seen: set[str] = set()  # first row per sample_id wins, as in read_generations
    for f in chunk_files(out_dir):
        for rb in parquet_file(f).iter_batches(batch_size=COUNT_BATCH_ROWS, columns=["sample_id", "output_ids"]):
            valid = rb.column(1).is_valid().to_pylist()
            for sid, ok in zip(rb.column(0).to_pylist(), valid, strict=True):
                if sid in seen:
                    continue
                seen.add(sid)
                if ok and sid in wanted:
                    found.add(sid)
    return len(found)


def read_generation_errors(out_dir: StoreDir) -> pl.DataFrame:
    p = as_data_path(out_dir) / ERRORS_FILE
    if not p.exists():
        return cast(pl.DataFrame, pl.from_arrow(schemas.GENERATION_ERRORS.empty_table()))
    return read_parquet(p)


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is; cheap next to a Parquet write.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def lock_path_for(out_dir: DataPath, lock_dir: Path | None) -> Path:
    """The shard's flock file: beside the chunks when local, else under `lock_dir` (a local work dir,
    e.g. Settings.work_dir / "locks", passed by the caller: there is no global fallback)."""
    if out_dir.is_local:
        return out_dir.local_path / ".lock"
    if lock_dir is None:
        raise ValueError(
            f"{out_dir} is not local: its shard lock needs a local lock_dir (the work dir's locks/ folder); pass one"
        )
    digest = hashlib.sha256(str(out_dir).encode()).hexdigest()[:16]
    table = out_dir.parent.name if "/" in out_dir.rel else "data"
    return Path(lock_dir) / f"{table}-{out_dir.name}-{digest}.lock"


class ShardStore:
    def __init__(
        self,
        out_dir: StoreDir,
        *,
        write_retries: int = 3,
        lock_dir: Path | None = None,
        schema: pa.Schema = schemas.GENERATIONS,
    ) -> None:
        self.out_dir = as_data_path(out_dir)
        self.schema = schema  # GENERATIONS, or TURN_GENERATIONS for the turns of all_turns conversations
        self.lock_path = lock_path_for(self.out_dir, lock_dir)
        self.write_retries = write_retries
        self._lock_fd: int | None = None
        self.chunks_written = 0
        self.write_retries_used = 0  # failed write attempts that were retried (disk full, I/O error)
        self.rows_written = 0
        self.compaction_leftovers_removed = 0

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        self.out_dir.mkdir()
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = describe_owner(read_owner(self.lock_path))
            raise ShardBusyError(
                f"{self.out_dir} is being generated by another process: {owner} (lock {self.lock_path})"
            ) from None
        self._lock_fd = fd
        # who holds it, for the one line a second writer fails with (storage/locks.py)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner_record("generation")) + "\n").encode(), 0)
        # Temp files of a killed writer are garbage (never visible under a final name); we hold the lock.
        # (Object storage never gets temp objects; the listing then finds nothing.)
        for tmp in self.out_dir.glob(".*.tmp"):
            try:
                tmp.unlink()
            except OSError:
                pass
        # A compaction killed between writing its chunk and deleting the old ones: finish it.
        try:
            self.compaction_leftovers_removed = self.finish_compaction()
        except Exception as e:  # housekeeping: the data reads the same either way
            log.warning("%s: could not finish an interrupted compaction: %s", self.out_dir, e)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)  # no owner named while nobody holds it
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- writes ----------------------------------------------------------------------------
    def _write(self, table: pa.Table, path: DataPath) -> None:
        """Atomic write with retries to the SAME final name, so a retry can never add a second copy."""
        self._write_with(lambda: write_table_atomic(table, path, schema=None), path)

    def _write_with(self, write: Any, path: DataPath) -> Any:
        """Run `write` (an atomic write of `path`) with retries; fsync the folder once it is there."""
        last: BaseException | None = None
        for attempt in range(self.write_retries + 1):
            try:
                result = write()
                if path.is_local:
                    _fsync_dir(path.parent.local_path)
                return result
            except Exception as e:  # disk full, I/O error, ...
                last = e
                if attempt < self.write_retries:
                    self.write_retries_used += 1
                log.warning("writing %s failed (attempt %d/%d): %s", path.name, attempt + 1, self.write_retries + 1, e)
                time.sleep(min(0.05 * 2**attempt, 1.0))
        raise StoreWriteError(f"could not write {path} after {self.write_retries + 1} attempts: {last}") from last

    def write_chunk(self, rows: list[dict[str, Any]]) -> DataPath | None:
        if not rows:
            return None
        table = pa.Table.from_pylist(rows, schema=self.schema)
        # Time-ordered unique names: chunks of several runs never collide, sorted order = write order.
        path = self.out_dir / f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        self._write(table, path)
        self.chunks_written += 1
        self.rows_written += len(rows)
        return path

    def write_errors(self, rows: list[dict[str, Any]]) -> None:
        table = pa.Table.from_pylist(rows, schema=schemas.GENERATION_ERRORS)
        self._write(table, self.out_dir / ERRORS_FILE)

    # -- compaction ------------------------------------------------------------------------
    def compact(self, min_chunks: int) -> int:
        """Merge the shard's chunks into one when more than `min_chunks` exist; returns how many were replaced.

        Call with the lock held and no chunk being written (the end of a successful run). See the
        module docstring for why every crash point reads the same data.
        """
        files = chunk_files(self.out_dir)
        if len(files) <= min_chunks:
            return 0
        names = [f.name for f in files]
        # Sorts after every chunk it replaces, even if the clock stepped back since they were written.
        ns = max([time.time_ns(), *[int(m.group(1)) + 1 for n in names if (m := _PART_NS.match(n))]])
        path = self.out_dir / f"part-{ns:020d}-{uuid.uuid4().hex[:8]}.compacted.parquet"
        # streamed chunk by chunk: memory stays one chunk, whatever the shard's size
        rows = self._write_with(lambda: write_compacted(files, path, self.schema), path)
        if parquet_num_rows(path) != rows:  # never delete data we cannot see in the new file
            raise StoreWriteError(f"compacted chunk {path} does not hold the {rows} rows written")
        self._delete_chunks(files)
        log.info("%s: compacted %d chunks into %s (%d rows)", self.out_dir, len(files), path.name, rows)
        return len(files)

    def supersede(self, sample_ids: Iterable[str]) -> int:
        """Take the stored rows of `sample_ids` out of the shard; returns how many rows were taken out.

        Call with the lock held, before planning a run: those samples then count as not stored and are sent
        again. The rows are first written whole to superseded-<ns>.parquet (kept beside the chunks, never
        read as samples), then every chunk is rewritten without them as one compacted chunk (the same
        crash-safe steps as compact(): a crash in between leaves either the old chunks, which the next
        open removes, or the new one)."""
        wanted = pl.Series("sample_id", sorted(set(sample_ids)), dtype=pl.String)
        files = chunk_files(self.out_dir)
        if not files or wanted.len() == 0:
            return 0
        old = [f.select(self.schema.names).to_arrow() for f in iter_generations(self.out_dir, only=wanted)]
        n_old = sum(t.num_rows for t in old)
        if n_old == 0:
            return 0
        archive = self.out_dir / f"{SUPERSEDED_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        self._write(pa.concat_tables([t.cast(self.schema) for t in old]), archive)
        names = [f.name for f in files]
        ns = max([time.time_ns(), *[int(m.group(1)) + 1 for n in names if (m := _PART_NS.match(n))]])
        path = self.out_dir / f"part-{ns:020d}-{uuid.uuid4().hex[:8]}.compacted.parquet"
        rows = self._write_with(lambda: write_compacted(files, path, self.schema, exclude=wanted), path)
        if parquet_num_rows(path) != rows:
            raise StoreWriteError(f"rewritten chunk {path} does not hold the {rows} rows written")
        self._delete_chunks(files)
        log.info(
            "%s: %d stored row(s) superseded (kept in %s), to be generated again", self.out_dir, n_old, archive.name
        )
        return n_old

    def finish_compaction(self) -> int:
        """Delete chunks a compacted chunk replaced but a crash left behind; returns how many."""
        present = {f.name: f for f in chunk_files(self.out_dir)}
        leftovers: dict[str, DataPath] = {}
        for c in self.out_dir.glob(COMPACTED_GLOB):
            for name in compacted_from(c):
                # only older names: the compacted chunk must sort after what it replaces
                if name in present and name < c.name and name != c.name:
                    leftovers[name] = present[name]
        if leftovers:
            self._delete_chunks(list(leftovers.values()))
            log.info("%s: removed %d chunk(s) an interrupted compaction left behind", self.out_dir, len(leftovers))
        return len(leftovers)

    def _delete_chunks(self, files: list[DataPath]) -> None:
        # Newest first: what is left of the replaced chunks is always a name-ordered prefix, so
        # readers keep picking the same row per sample_id at every step.
        for f in sorted(files, key=lambda p: p.name, reverse=True):
            f.unlink(missing_ok=True)
        if self.out_dir.is_local:
            _fsync_dir(self.out_dir.local_path)


def compacted_from(path: DataPath) -> list[str]:
    """The chunk names a compacted chunk replaces (from its footer); [] for a plain chunk."""
    meta = parquet_file(path).schema_arrow.metadata or {}
    raw = meta.get(COMPACTED_FROM)
    return [str(n) for n in json.loads(raw)] if raw else []


def _winners(files: list[DataPath]) -> tuple[list[int], np.ndarray, pl.Series]:
    """Rows per chunk, the keep mask over their concatenation (the first row per sample_id in name order,
    keep="first") and the sample_ids it was decided from (the only column read)."""
    ids = [parquet_file(f).read(columns=["sample_id"]).column("sample_id").cast(pa.string()) for f in files]
    all_ids = pl.Series(
        "sample_id", pa.chunked_array([c for a in ids for c in a.chunks], type=pa.string()), dtype=pl.String
    )
    keep = all_ids.is_first_distinct().to_numpy()
    return [len(a) for a in ids], np.asarray(keep, dtype=bool), all_ids


def iter_generations(
    out_dir: StoreDir,
    *,
    only: pl.Series | None = None,
    batch_rows: int = 1024,
    columns: Sequence[str] | None = None,
) -> Iterator[pl.DataFrame]:
    """read_generations(out_dir) (restricted to the sample_ids in `only`) in batches of at most `batch_rows`
    rows, same rows in the same order: one record batch in memory at a time, whatever the shard's size.
    `columns`: only these are read (a step that does not use the decoded `text` does not decompress it)."""
    files = chunk_files(out_dir)
    if not files:
        return
    counts, keep, ids = _winners(files)
    if only is not None:
        keep &= ids.is_in(only.cast(pl.String).implode()).to_numpy()
    offset = 0
    for f, n in zip(files, counts):
        pos = offset
        pf = parquet_file(f)
        # a chunk written before a column was added (the spec_* columns) has it null, not an error
        have = [c for c in columns if c in pf.schema_arrow.names] if columns else None
        for rb in pf.iter_batches(batch_size=batch_rows, columns=have):
            mask = keep[pos : pos + rb.num_rows]
            pos += rb.num_rows
            if mask.any():
                df = cast(pl.DataFrame, pl.from_arrow(pa.Table.from_batches([rb]))).filter(pl.Series(mask))
                yield _with_missing(df, columns)
        if pos != offset + n:
            raise StoreWriteError(f"{f} changed while it was read")
        offset += n


def _with_missing(df: pl.DataFrame, columns: Sequence[str] | None) -> pl.DataFrame:
    missing = [c for c in columns or () if c not in df.columns]
    if not missing:
        return df
    empty = cast(pl.DataFrame, pl.from_arrow(schemas.GENERATIONS.empty_table()))
    return df.with_columns(pl.lit(None, dtype=empty.schema[c]).alias(c) for c in missing).select(list(columns or ()))


def _winning_parts(
    files: list[DataPath], schema: pa.Schema = schemas.GENERATIONS, exclude: pl.Series | None = None
) -> Iterator[pa.Table]:
    """Each chunk's winning rows (minus every row of the sample_ids in `exclude`) as a `schema` table, one
    chunk in memory at a time."""
    counts, keep, ids = _winners(files)
    if exclude is not None:
        keep &= ~ids.is_in(exclude.cast(pl.String).implode()).to_numpy()
    offset = 0
    for f, n in zip(files, counts):
        t = parquet_file(f).read()
        if t.num_rows != n:
            raise StoreWriteError(f"{f} changed while it was compacted")
        for fld in schema:
            if fld.name not in t.column_names:  # a chunk written before the column was added: null there
                t = t.append_column(fld.name, pa.nulls(t.num_rows, fld.type))
        t = t.select(schema.names).cast(schema).replace_schema_metadata(schema.metadata)
        yield t.filter(pa.array(keep[offset : offset + n]))
        offset += n


def write_compacted(
    files: list[DataPath], path: DataPath, schema: pa.Schema = schemas.GENERATIONS, exclude: pl.Series | None = None
) -> int:
    """Write the rows `read_generations` returns for these chunks, in its order, to `path` streamed (ParquetSink: appears only when complete), its footer
    naming the chunks it replaces; returns the rows written. Peak memory: one chunk, not the shard."""
    meta = dict(schema.metadata or {})
    meta[COMPACTED_FROM] = json.dumps([f.name for f in files]).encode()
    sink = ParquetSink(path, schema.with_metadata(meta))
    rows = 0
    try:
        for part in _winning_parts(files, schema, exclude):
            sink.write_table(part.replace_schema_metadata(meta))
            rows += part.num_rows
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    return rows
