"""What `eagle3 check` finds wrong before anything runs: every problem, one line each, none hidden behind another.

Source YAMLs (every bad field of every file), the source files they name (local ones: a missing file fails
the ingest otherwise), the data and work dirs (writable), and the configured SGLang endpoints (they answer,
as SGLang, to our key). Plain functions: the command prints what they return.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from .generate.fleet_capacity import endpoint_problems
from .ingest.errors import IngestFileError
from .ingest.remote import is_remote
from .ingest.spec import SourceSpec, read_source_specs

if TYPE_CHECKING:
    from .config import Settings


def source_problems(sources_dir: Path) -> tuple[list[SourceSpec], list[str]]:
    """The valid specs, and a line per problem: each bad field of each YAML, each local source file missing."""
    loaded, problems = read_source_specs(sources_dir)
    for yaml_file, spec in loaded:
        if is_remote(spec.path):
            continue  # listing a bucket needs its credentials and the network: the ingest names a missing one
        try:
            spec.files()
        except IngestFileError as e:
            problems.append(f"{yaml_file}: field 'path': {str(e).removeprefix(f'source {spec.name!r}: ')}")
    return [spec for _, spec in loaded], problems


def writable_dir_problem(setting: str, folder: Path) -> str | None:
    """None when the run can write in `folder`, else the line that says why not. Nothing is created: a
    missing folder is judged by the nearest existing one above it; an existing one by writing a probe file."""
    fix = f"point {setting} at a folder you can write to"
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{setting} {folder}: {existing} is a file, not a folder; {fix}"
    if existing != folder:
        if os.access(existing, os.W_OK | os.X_OK):
            return None
        return f"{setting} {folder}: cannot be created in {existing} (not writable); {fix}"
    probe = folder / f".eagle3-check-{uuid.uuid4().hex}"
    try:
        with open(probe, "wb") as f:
            f.write(b"eagle3 check\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return f"{setting} {folder}: not writable ({e.strerror or type(e).__name__}); {fix}"
    finally:
        probe.unlink(missing_ok=True)
    return None


def dead_endpoint_lines(s: Settings) -> list[str]:
    """At the start of an interactive run: a line per configured endpoint that does not answer as SGLang
    (3 s a probe), so a wrong EAGLE3_SGLANG_URL is named before ingest and tokenize have run."""
    from .generate.fleet_capacity import probe_fleet

    if not s.sglang_url_configured:
        return []
    headers = {"Authorization": f"Bearer {s.sglang_api_key.reveal()}"} if s.sglang_api_key else None
    return endpoint_problems(probe_fleet(s.sglang_urls, headers=headers))
