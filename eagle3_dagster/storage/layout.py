"""The data directory's shard layout: partition keys and traversal-safe joins."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .paths import DataPath, PathLike, as_data_path
from .uris import StorageError

_SHARD_KEY = re.compile(r"[0-9]{4}")  # ASCII only; fullmatch (a `$` would let "0000\n" through)


def shard_key(shard: int) -> str:
    return f"{shard:04d}"


def parse_shard_key(key: str) -> int:
    """Partition keys are exactly four digits; anything else (e.g. '../x') is refused."""
    if not isinstance(key, str) or not _SHARD_KEY.fullmatch(key):
        raise StorageError(f"invalid shard partition key {key!r}: expected four digits like '0003'")
    return int(key)


def safe_join(root: PathLike, *parts: str) -> Any:
    """Join under root, refusing any result that escapes it (path traversal).

    A local root is resolved, symlinks included; a DataPath root (any scheme) refuses
    '..', absolute parts, backslashes and NUL segment by segment.
    """
    if isinstance(root, DataPath):
        return root.joinpath(*parts)
    r = Path(root).resolve()
    p = r.joinpath(*parts).resolve()
    if p != r and r not in p.parents:
        raise StorageError(f"path {'/'.join(parts)!r} escapes the data directory {r}")
    return p


def shard_dir(data_dir: PathLike, table: str, shard: int) -> Any:
    return safe_join(data_dir, table, f"shard={shard_key(shard)}")


def iter_shard_dirs(data_dir: PathLike, table: str) -> Iterable[DataPath]:
    return as_data_path(data_dir).joinpath(table).glob("shard=*")


def read_shard_json(data_dir: PathLike, table: str, shards: Iterable[int], name: str) -> dict[str, dict[str, Any]]:
    """Each shard's `<table>/shard=NNNN/<name>` JSON summary by shard key; shards without one (or with an
    unreadable one: a summary is rewritten by the shard's next run) are left out."""
    out: dict[str, dict[str, Any]] = {}
    for k in shards:
        f = as_data_path(data_dir) / table / f"shard={shard_key(k)}" / name
        try:
            if f.exists():
                out[shard_key(k)] = json.loads(f.read_text())
        except ValueError:
            continue
    return out
