"""The shard's prompts, read in batches twice, so memory per sample stays at ~10 bytes.

Pass 1 reads only prompt_id/template_hash, computes every sample_id and keeps its 128-bit key
(two uint64), then decides with one vectorised numpy sort which rows to send: first occurrence of the
key in the input and not already stored. Pass 2 re-reads the batches (with input_ids) and yields
the rows to send; each row's key is checked against pass 1, so a changed input fails loudly.
A DataFrame input is sliced the same way; a Path or DataPath (a Parquet file or a folder of
part-*.parquet, local or in object storage) is never fully loaded, which is what keeps a 1M-sample
shard's RSS close to a 100k one's. Files are read page by page (a buffered Parquet stream over the
filesystem's random-access file: ranged GETs on object storage), so even a file written as one big
row group is never held whole, compressed or not.

`prompt_view` and `prompts_by_id` give the later steps of the `generations` asset what they need
from the tokenized shard (ids, template hashes, prompt tails; full rows for a few previewed
prompts) by the same streaming, instead of the whole shard with every prompt's input_ids.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from .. import schemas
from ..storage import DataPath, as_data_path, parquet_schema, scan_parquet, shard_dir
from .config import sample_key
from .items import WorkItem
from .probes import ProbeKeys

TokenizedSource = pl.DataFrame | Path | str | DataPath

_BATCH = 8192
_IDS_BATCH = 1024  # rows a batch when input_ids are read: ~4 MB for 1k-token prompts
_READ_BUFFER = 1 << 20  # bytes read ahead per column stream: page-sized reads, never a whole column chunk
_OPTIONAL = ("source", "shard", "template_hash")


class InputChangedError(RuntimeError):
    """The tokenized input changed between the two passes of one run."""


def _files(src: DataPath) -> list[DataPath]:
    if src.is_dir():
        files = src.glob("part-*.parquet") or src.glob("*.parquet")
        return [f for f in files if f.name != "rejects.parquet"]
    if src.exists():
        return [src]
    raise FileNotFoundError(f"tokenized prompts not found: {src}")


def _columns_of(src: TokenizedSource) -> list[str]:
    if isinstance(src, pl.DataFrame):
        return list(src.columns)
    files = _files(as_data_path(src))
    return list(parquet_schema(files[0]).names) if files else ["prompt_id", "input_ids"]


def _batches(src: TokenizedSource, columns: list[str]) -> Iterator[pl.DataFrame]:
    if isinstance(src, pl.DataFrame):
        yield from src.select(columns).iter_slices(_BATCH)
        return
    size = _IDS_BATCH if "input_ids" in columns else _BATCH
    for f in _files(as_data_path(src)):
        with _open(f) as pf:
            # use_threads=False: threaded decoding reads whole column chunks ahead (2-3x the batch memory)
            for b in pf.iter_batches(batch_size=size, columns=columns, use_threads=False):
                yield cast(pl.DataFrame, pl.from_arrow(b))  # a RecordBatch gives a DataFrame


def tokenized_source(data: Any, shard: int) -> TokenizedSource:
    """The tokenized shard for generate_shard: its folder (streamed), or an empty frame if it has none."""
    folder = as_data_path(shard_dir(data, "tokenized_prompts", shard))
    if not folder.glob("part-*.parquet"):
        return cast(pl.DataFrame, pl.from_arrow(schemas.TOKENIZED_PROMPTS.empty_table()))
    return folder


def iter_batches(src: TokenizedSource, columns: list[str]) -> Iterator[pl.DataFrame]:
    """The tokenized shard's `columns` in batches (of 1,024 rows when input_ids are read), streamed."""
    return _batches(src, columns)


def _open(f: DataPath) -> pq.ParquetFile:
    """A streamed Parquet reader: buffered page reads (local file or the object store's ranged reads)."""
    source: Any = f.path if f.is_local else f.open_input_file()
    return pq.ParquetFile(source, buffer_size=_READ_BUFFER, pre_buffer=False)


def prompt_view(src: TokenizedSource, *, tail: int = 8) -> pl.DataFrame:
    """One row per input row: prompt_id, template_hash, source, prompt_len and the LAST `tail` input_ids.

    Streamed in batches: memory is ~`tail` ids a prompt, not the prompt. Enough for the sample ids
    (prompt_id + template_hash) and for generation_features' echo check (the prompt tail, whose
    default window is 8).
    """
    cols = _columns_of(src)
    th = pl.col("template_hash") if "template_hash" in cols else pl.lit(None, pl.String).alias("template_hash")
    so = pl.col("source") if "source" in cols else pl.lit(None, pl.String).alias("source")
    want = ["prompt_id", "input_ids", *[c for c in ("template_hash", "source") if c in cols]]
    parts = [
        b.select(
            pl.col("prompt_id").cast(pl.String),
            th.cast(pl.String),
            so.cast(pl.String),
            pl.col("input_ids").list.len().cast(pl.Int32).alias("prompt_len"),
            pl.col("input_ids").list.tail(tail).alias("input_ids"),
        )
        for b in _batches(src, want)
    ]
    if not parts:
        return pl.DataFrame(
            schema={
                "prompt_id": pl.String,
                "template_hash": pl.String,
                "source": pl.String,
                "prompt_len": pl.Int32,
                "input_ids": pl.List(pl.Int32),
            }
        )
    return pl.concat(parts, how="vertical").rechunk()


def prompts_by_id(src: TokenizedSource, prompt_ids: Any) -> pl.DataFrame:
    """The full rows (every column) of the given prompt ids, streamed: for a preview of a few samples."""
    wanted = pl.Series("prompt_id", list(prompt_ids), dtype=pl.String)
    cols = _columns_of(src)
    parts = [b.filter(pl.col("prompt_id").is_in(wanted)) for b in _batches(src, cols)] if wanted.len() else []
    parts = [p for p in parts if p.height]
    if parts:
        return pl.concat(parts, how="vertical")
    if isinstance(src, pl.DataFrame):
        return src.clear()
    return cast(pl.DataFrame, pl.from_arrow(schemas.TOKENIZED_PROMPTS.empty_table()))


def _split(sid: str) -> tuple[int, int]:
    return int(sid[:16], 16), int(sid[16:32], 16)


def stored_keys(out_dir: Path | DataPath) -> tuple[np.ndarray, np.ndarray]:
    """128-bit keys of the stored sample_ids, vectorised (no Python string per stored sample)."""
    files = as_data_path(out_dir).glob("part-*.parquet")
    if not files:
        return np.empty(0, np.uint64), np.empty(0, np.uint64)
    sid = pl.col("sample_id")
    df = (
        scan_parquet(files, columns=["sample_id"])
        .select(
            hi=sid.str.slice(0, 16).str.to_integer(base=16, dtype=pl.UInt64),
            lo=sid.str.slice(16, 16).str.to_integer(base=16, dtype=pl.UInt64),
        )
        .collect()
    )
    return df.get_column("hi").to_numpy(), df.get_column("lo").to_numpy()


@dataclass
class Plan:
    rows: int  # input rows
    requested: int  # distinct sample_ids
    skipped_cached: int  # of those, already stored
    pending: int  # to generate now
    send: np.ndarray  # bool, one per input row: generate this row now
    hi: np.ndarray  # pass-1 keys (high 64 bits), to detect an input that changed under us
    carried_ids: list[str]  # not stored, failed permanently before (e.g. a 400): not sent again
    excluded: int = 0  # rows of all_turns conversations (generate/multiturn.py sends their turns)


def classify(
    hi: np.ndarray, lo: np.ndarray, stored_hi: np.ndarray, stored_lo: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(first occurrence in the input, already stored) per input row, exact on all 128 bits.

    One stable lexsort over stored + input keys: equal keys become neighbours, stored ones first,
    input rows in input order. ~50 bytes a row, transient.
    """
    m, n = len(stored_hi), len(hi)
    all_hi = np.concatenate([stored_hi, hi])
    all_lo = np.concatenate([stored_lo, lo])
    order = np.lexsort((all_lo, all_hi))  # stable: ties keep concatenation order
    hs, ls = all_hi[order], all_lo[order]
    del all_hi, all_lo
    newgrp = np.empty(m + n, dtype=bool)
    if m + n:
        newgrp[0] = True
        newgrp[1:] = (hs[1:] != hs[:-1]) | (ls[1:] != ls[:-1])
    del hs, ls
    gid = np.cumsum(newgrp) - 1
    group_has_stored = order[newgrp] < m  # a group's first member is stored iff any member is
    is_input = order >= m
    prev_stored = np.zeros(m + n, dtype=bool)
    prev_stored[1:] = order[:-1] < m
    first_sorted = is_input & (newgrp | prev_stored)
    first = np.zeros(n, dtype=bool)
    in_store = np.zeros(n, dtype=bool)
    idx = order[is_input] - m
    first[idx] = first_sorted[is_input]
    in_store[idx] = group_has_stored[gid[is_input]]
    return first, in_store


@dataclass(frozen=True)
class SampleKeys:
    """How a prompt row's sample_id is made, the same in both passes: its prompt id and template, the
    model revision, the sampling hash of what is sent for its length (`row_hash`: a context-fitted prompt
    has its own; None: `s_hash` for every prompt), the regen seed, and a probe set's drafter tag."""

    model_revision: str
    s_hash: str
    regen_seed: int | None
    row_hash: Callable[[int], str] | None = None
    probes: ProbeKeys | None = None

    def of(self, prompt_id: str, template_hash: str | None, n_ids: int, source: str | None) -> tuple[str, str]:
        """(sample_id, sampling hash) of one row."""
        h_row = self.row_hash(n_ids) if self.row_hash is not None else self.s_hash
        probe = self.probes.tag(source) if self.probes else None
        return sample_key(prompt_id, self.model_revision, template_hash or "", h_row, self.regen_seed, probe), h_row


def plan_shard(
    src: TokenizedSource,
    keys: SampleKeys,
    *,
    stored: tuple[np.ndarray, np.ndarray],
    skip_ids: frozenset[str] | set[str] = frozenset(),
    exclude_prompt_ids: frozenset[str] | set[str] = frozenset(),
) -> Plan:
    """Pass 1: which rows of `src` to send, each keyed by `keys` (`keys.row_hash`: the sampling hash of a
    prompt of that many tokens, context_fit.ContextBudget.hash_for: a prompt sent with a lowered
    max_new_tokens has its own; `keys.probes`: a probe set's prompts get the fleet's drafter in their key)."""
    row_hash, probes = keys.row_hash, keys.probes
    cols = _columns_of(src)
    if "prompt_id" not in cols or "input_ids" not in cols:
        raise ValueError(f"tokenized prompts need prompt_id and input_ids columns, got {cols}")
    has_th = "template_hash" in cols
    want = ["prompt_id", "template_hash"] if has_th else ["prompt_id"]
    if row_hash is not None:
        want.append("input_ids")  # their count (not the prompt_len column: pass 2 keys by len(input_ids) too)
    by_source = probes is not None and bool(probes.sources) and "source" in cols
    if by_source:
        want.append("source")
    hi_a, lo_a = array("Q"), array("Q")
    skipped: list[tuple[int, str]] = []
    excluded: list[int] = []
    for b in _batches(src, want):
        pids = b.get_column("prompt_id").to_list()
        ths = b.get_column("template_hash").to_list() if has_th else [""] * len(pids)
        lens = b.get_column("input_ids").list.len().to_list() if row_hash is not None else [0] * len(pids)
        names = b.get_column("source").to_list() if by_source else [None] * len(pids)
        for p, t, n_ids, name in zip(pids, ths, lens, names):
            if exclude_prompt_ids and p in exclude_prompt_ids:
                excluded.append(len(hi_a))
            sid, _ = keys.of(p, t, int(n_ids or 0), name)
            if skip_ids and sid in skip_ids:
                skipped.append((len(hi_a), sid))
            h, low = _split(sid)
            hi_a.append(h)
            lo_a.append(low)
    hi = np.frombuffer(hi_a, dtype=np.uint64)
    lo = np.frombuffer(lo_a, dtype=np.uint64)
    first, in_store = classify(hi, lo, *stored)
    if excluded:
        first[np.asarray(excluded, dtype=np.int64)] = False
    send = first & ~in_store
    carried = [sid for i, sid in skipped if send[i]]
    for i, _ in skipped:
        send[i] = False
    return Plan(
        rows=len(hi),
        requested=int(first.sum()),
        skipped_cached=int((first & in_store).sum()),
        pending=int(send.sum()),
        send=send,
        hi=hi.copy(),
        carried_ids=carried,
        excluded=len(excluded),
    )


def iter_pending(
    src: TokenizedSource,
    plan: Plan,
    keys: SampleKeys,
) -> Iterator[WorkItem]:
    """Pass 2: the items to generate, in input order, one batch of Python objects at a time (`keys`: as
    plan_shard's; the item's `sampling_hash` is the one of its key)."""
    cols = _columns_of(src)
    want = ["prompt_id", "input_ids", *[c for c in _OPTIONAL if c in cols]]
    offset = 0
    for b in _batches(src, want):
        n = b.height
        mask = plan.send[offset : offset + n]
        if mask.any():
            for i, (row, go) in enumerate(zip(b.iter_rows(named=True), mask.tolist())):
                if not go:
                    continue
                sid, h_row = keys.of(
                    row["prompt_id"], row.get("template_hash"), len(row["input_ids"] or ()), row.get("source")
                )
                if _split(sid)[0] != int(plan.hi[offset + i]):
                    raise InputChangedError("the tokenized prompts changed while the shard was generating; rerun it")
                yield WorkItem(
                    sample_id=sid,
                    prompt_id=row["prompt_id"],
                    input_ids=row["input_ids"],
                    source=row.get("source"),
                    shard=row.get("shard"),
                    template_hash=row.get("template_hash"),
                    sampling_hash=h_row,
                )
        offset += n
    if offset != plan.rows:
        raise InputChangedError(f"the tokenized prompts changed during the run ({plan.rows} rows, then {offset})")


# a prompt at least as long as the server's context length: skipped before sending (checked again each run,
# so a server with a longer context generates it)
PROMPT_TOO_LONG_FOR_SERVER = "prompt_too_long_for_server"


def input_problem(ids: Any, vocab_size: int | None, server_context: int | None) -> tuple[str | None, str]:
    """Why a prompt is not sent (a reason code, or None) and the detail for its error row."""
    detail = f"prompt of {len(ids or [])} ids rejected before sending"
    if not isinstance(ids, list) or not ids:
        return "empty_input_ids", detail  # the server would answer 400 "input_ids cannot be empty."
    if vocab_size is not None and (min(ids) < 0 or max(ids) >= vocab_size):
        return "input_id_out_of_vocab", detail  # the server does not check the range (spec §2.1)
    if server_context is not None and len(ids) >= server_context:
        # the server would refuse it with 400 "The input (N tokens) is longer than the model's context
        # length (C tokens)." (spec §4.2): not sent, counted by its own reason
        return PROMPT_TOO_LONG_FOR_SERVER, (
            f"prompt of {len(ids):,} ids >= the server's context length {server_context:,} "
            "(/server_info context_length): not sent"
        )
    return None, detail
