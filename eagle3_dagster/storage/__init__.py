"""Where pipeline data lives: a local folder (the default) or object storage, behind one small API.

The data directory is a path or a URI (`EAGLE3_DATA_DIR`, the `pipeline.data_dir` resource):

- a local path or `file://...`: Parquet under a folder, every write to a temporary name in the same
  folder, fsynced and renamed into place, so a reader never sees half a file and a crash never leaves
  one behind under the final name;
- `s3://bucket/prefix`, `gs://bucket/prefix`, `abfs://...`, `hdfs://...`: a pyarrow filesystem
  (`pyarrow.fs.FileSystem.from_uri`), with pyarrow's URI options, e.g.
  `s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1`. Credentials
  come from the provider's standard chain (for S3: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/
  `AWS_SESSION_TOKEN`, `AWS_PROFILE`, instance roles); a URI carrying credentials is refused, because
  the URI lands in run config, metadata and logs;
- any other fsspec protocol (`memory://`, ...), wrapped as `PyFileSystem(FSSpecHandler(...))`.

On object storage there is no rename: an object appears under its final key only when its upload
completes (one PUT, or the completion of a multipart upload), so each object is fully serialized
first (in memory, or for streamed tables in a local spool file) and then written to its final key
in one call. A crash leaves either the previous object or the new one, never a partial one; an
interrupted multipart upload stays invisible (expire them with a bucket lifecycle rule).

`DataPath` is the one type the pipeline passes around: a root (filesystem + base) and a relative
key validated segment by segment, so a join can never leave the data root (`..`, absolute parts,
backslashes and NUL are refused). Functions here also accept a plain `Path` (local) and
then return a `Path`.

The package, one job per module: `uris` (schemes, validation, redaction), `atomic` (the two
write primitives), `paths` (DataRoot, DataPath), `writes` (atomic tables, streamed sinks), `reads`
(Parquet reads, listings, checksums), `layout` (shard keys and traversal-safe joins), `locks` (one owner-naming lock per data dir),
`spill` (external sort and keyed lookup in bounded memory), `frames` (batch-streamed frames). Import from
`eagle3_dagster.storage`; the modules are an implementation detail.
"""

from __future__ import annotations

from .frames import arrow_batch, detached, streamed_features
from .layout import iter_shard_dirs, parse_shard_key, read_shard_json, safe_join, shard_dir, shard_key
from .locks import DataDirLock, DataDirLocked, LockOptions, describe_owner, lock_file_for, owner_record, read_owner
from .paths import (
    DataPath,
    DataRoot,
    PathLike,
    as_data_path,
    as_given,
    data_root,
    display,
    fsspec_filesystem,
    is_local,
)
from .reads import (
    list_files,
    parquet_file,
    parquet_num_rows,
    parquet_schema,
    read_parquet,
    read_parquet_dir,
    replace_dir_contents,
    scan_parquet,
    sha256_of,
)
from .spill import BUCKET_ROWS, KeyedRows, SortedSpill
from .uris import PYARROW_SCHEMES, StorageError, check_uri, display_uri, redact_uri, uri_scheme
from .writes import ONE_ROW_GROUP_BYTES, ParquetSink, TextSink, write_frame_atomic, write_table_atomic

__all__ = [
    "BUCKET_ROWS",
    "ONE_ROW_GROUP_BYTES",
    "PYARROW_SCHEMES",
    "DataDirLock",
    "DataDirLocked",
    "DataPath",
    "DataRoot",
    "KeyedRows",
    "LockOptions",
    "ParquetSink",
    "PathLike",
    "SortedSpill",
    "StorageError",
    "TextSink",
    "arrow_batch",
    "as_data_path",
    "as_given",
    "check_uri",
    "data_root",
    "describe_owner",
    "detached",
    "display",
    "display_uri",
    "fsspec_filesystem",
    "is_local",
    "iter_shard_dirs",
    "list_files",
    "lock_file_for",
    "owner_record",
    "parquet_file",
    "parquet_num_rows",
    "parquet_schema",
    "parse_shard_key",
    "read_owner",
    "read_parquet",
    "read_parquet_dir",
    "read_shard_json",
    "redact_uri",
    "replace_dir_contents",
    "safe_join",
    "scan_parquet",
    "sha256_of",
    "shard_dir",
    "shard_key",
    "streamed_features",
    "uri_scheme",
    "write_frame_atomic",
    "write_table_atomic",
]
