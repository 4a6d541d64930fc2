"""Which snapshot trained a drafter: `--trained-on SNAPSHOT`, or the record a training run leaves beside its
checkpoint (docs/drafter-compare.md shows how to write it from a SpecForge or speculators run).

The record, `<checkpoint folder>/eagle3-lineage.json`:

    {"format": "eagle3-dagster/lineage/1",
     "snapshot": "<the snapshot version: snapshots/<version>/manifest.json `version`>",
     "content_identity": "<the manifest's identity.sha256>",   (optional)
     "export": "exports/specforge_prompts.jsonl",              (optional: which export it read)
     "trainer": "SpecForge 0.2.0",                             (optional)
     "trained_at": "2026-06-12T08:00:00Z"}                     (optional)

It is read when the drafter's draft model path (its /server_info `speculative_draft_model_path`) is a
folder this machine can read and holds the file; a record that is there but wrong is an error naming
the file and the field, never skipped. Production's lineage is its own record, else what the comparison
that promoted it said (stored comparisons, newest first).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LINEAGE_FILE = "eagle3-lineage.json"
LINEAGE_FORMAT = "eagle3-dagster/lineage/1"
_OPTIONAL = ("content_identity", "export", "trainer", "trained_at")


class LineageError(ValueError):
    """A lineage record that cannot be used: names the file and what is wrong."""


@dataclass(frozen=True)
class Lineage:
    snapshot: str
    basis: str  # where it was read: "--trained-on", the record's path, or an earlier comparison
    record: Mapping[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot,
            "basis": self.basis,
            **({"record": dict(self.record)} if self.record else {}),
        }


def parse_record(raw: Any, *, source: str) -> Lineage:
    """A parsed record, validated: LineageError naming `source` and the field."""
    if not isinstance(raw, dict):
        raise LineageError(f"{source}: must be a JSON object, got {type(raw).__name__}")
    problems = []
    if raw.get("format") != LINEAGE_FORMAT:
        problems.append(f"field 'format' must be {LINEAGE_FORMAT!r}, got {raw.get('format')!r}")
    snap = raw.get("snapshot")
    if not isinstance(snap, str) or not snap.strip():
        problems.append(f"field 'snapshot' must be the snapshot version (a non-empty string), got {snap!r}")
    problems += [
        f"field {k!r} must be a string, got {raw[k]!r}" for k in _OPTIONAL if k in raw and not isinstance(raw[k], str)
    ]
    if problems:
        raise LineageError("\n".join(f"{source}: {p}" for p in problems))
    return Lineage(str(snap).strip(), source, {k: raw[k] for k in ("format", "snapshot", *_OPTIONAL) if k in raw})


def read_record(checkpoint: str | None) -> Lineage | None:
    """The record beside a checkpoint folder (`checkpoint`: a draft model path), or None when the path is not a
    local folder or holds no record (a Hugging Face id, a folder on another machine)."""
    if not checkpoint:
        return None
    try:
        path = Path(checkpoint).expanduser() / LINEAGE_FILE
        if not path.is_file():
            return None
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise LineageError(f"{path}: not valid JSON: {e}") from None
    return parse_record(raw, source=str(path))


def candidate_lineage(trained_on: str | None, draft_model_path: str | None) -> Lineage | None:
    """`--trained-on` when given, else the record beside the candidate's checkpoint (None: neither)."""
    if trained_on is not None and trained_on.strip():
        return Lineage(trained_on.strip(), "--trained-on")
    return read_record(draft_model_path)


def production_lineage(
    drafter_id: str, draft_model_path: str | None, history: Iterable[Mapping[str, Any]]
) -> Lineage | None:
    """Production's drafter: its own record, else the newest stored comparison in which it was the candidate
    and said its snapshot (`history`: stored comparisons, newest first)."""
    own = read_record(draft_model_path)
    if own is not None:
        return own
    for c in history:
        cand = c.get("candidate") or {}
        trained = cand.get("trained_on") or {}
        if cand.get("drafter_id") == drafter_id and trained.get("snapshot"):
            return Lineage(str(trained["snapshot"]), f"the comparison of {c.get('compared_at', '?')}")
    return None


def trained_text(lineage: Lineage | Mapping[str, Any] | None) -> str:
    snap = lineage.snapshot if isinstance(lineage, Lineage) else (lineage or {}).get("snapshot")
    return f"trained on snapshot {snap}" if snap else "trained on an unknown snapshot"


def headline(cand: Lineage | Mapping[str, Any] | None, prod: Lineage | Mapping[str, Any] | None, diff_text: str) -> str:
    """ "drafter trained on snapshot N vs production (trained on snapshot M): +X [lo, hi]"."""
    return f"drafter {trained_text(cand)} vs production ({trained_text(prod)}): {diff_text}"
