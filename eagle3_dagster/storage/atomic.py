"""The two atomic write primitives: local tmp + fsync + rename, and one whole-object upload."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs


def local_atomic(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def put_object(fs: pafs.FileSystem, path: str, data: bytes | pa.Buffer) -> None:
    """One object, fully serialized, written to its final key in a single call.

    The object becomes visible only when the upload completes (PutObject, or the completion of a
    multipart upload after every part succeeded); nothing is ever written under a temporary key.
    Arrow's S3 stream uploads parts in the background and refuses to complete an upload whose part
    failed, so a failure leaves the previous object (or none), never a partial one.
    """
    out = fs.open_output_stream(path)
    out.write(data)
    out.close()
