"""What the prompt-source sensor compares between ticks: a fingerprint of every source YAML and the
data files it names (local or in object storage). Plain Python; defs/automation.py wires it."""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path


class SourceListingError(RuntimeError):
    """A remote prompt source could not be listed (store unreachable, access denied): skip the tick."""


def source_files_fingerprint(sources_dir: Path) -> str:
    """Hash of every prompt-source YAML and the data files it names (and its `function_docs` folder's files).

    Local files: path + size + mtime (ns). Files named by a URI (s3://, gs://, memory://, ...): the
    display URI + size + mtime from the filesystem listing (S3: LastModified, whole seconds), plus
    for fsspec filesystems the store's version fields (ETag, md5, generation, ...) when `info()` has
    them (eagle3_dagster/ingest/remote.py:file_version). A remote glob that matches nothing, or a
    remote file that is missing, adds nothing (as a local one). A remote source that cannot be
    listed raises SourceListingError: the sensor skips that tick and keeps its cursor.
    """
    h = hashlib.sha256()
    paths = set(sources_dir.rglob("*")) if sources_dir.exists() else set()
    remote_lines: list[str] = []
    try:
        from . import load_source_specs
        from .remote import file_uri_to_path, file_version, is_remote, is_uri, list_remote

        for spec in load_source_specs(sources_dir):
            if is_remote(spec.path):
                try:
                    remote_lines.extend(
                        file_version(f, info) for f, info in list_remote(spec.path, spec.name, allow_empty=True)
                    )
                except Exception as e:
                    raise SourceListingError(f"source {spec.name!r}: {e}") from None
                continue
            raw = file_uri_to_path(spec.path) if is_uri(spec.path) else spec.path
            base = spec.base_dir or sources_dir
            pattern = raw if os.path.isabs(raw) else os.path.join(base, raw)
            paths.update(Path(p) for p in glob.glob(pattern, recursive=True))
            docs = spec.function_docs_folder()  # BFCL function docs (bfcl.py): an edit there changes the prompts
            if docs is not None and docs.is_dir():
                paths.update(docs.iterdir())
    except SourceListingError:
        raise
    except Exception as e:  # a broken YAML is itself a change worth an ingest run, which reports it
        h.update(f"spec-error:{e}".encode())
    for p in sorted(paths):
        if p.is_file():
            st = p.stat()
            h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for line in sorted(remote_lines):
        h.update(f"{line}\n".encode())
    return h.hexdigest()[:32]
