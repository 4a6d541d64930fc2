"""Source specs: one YAML file per prompt source (assets/sources/<name>.yaml).

Fields (only `path` is required):

    name: ultrachat            # the source's name (asset source__<name>): letters, digits, '_', '-', '.'
    path: ../data/uc/*.jsonl   # a file or a glob, relative to the YAML's folder (or absolute), or a
                               #   URI: s3://bucket/uc/*.jsonl.gz?region=..., gs://, memory://, file://
                               #   (see remote.py; credentials only from the environment)
    format: auto               # the record layout; auto picks it per record (aliases: ultrachat, hermes,
                               #   no_robots = openai; glaive = sharegpt; gsm8k, magpie, math = question)
    field_map: {messages: dialog, role: speaker}   # canonical name -> the source's field name
    limit: 1000                # keep at most this many accepted prompts (reading stops there)
    sample_fraction: 0.1       # keep a stable, content-hashed fraction of prompts (with seed)
    seed: 0                    # salts sample_fraction's content hash: another seed keeps another fraction
    licence: "Apache-2.0"      # the snapshots' data card (README.md) states it: a Hub licence id (apache-2.0,
                               #   cc-by-4.0, ...) as its license, other text as other + license_details;
                               #   none: unknown, with a warning ("license" also accepted)
    language: [en]             # the prompts' languages (ISO 639 codes, e.g. en, zh, pt-BR; one or a
                               #   list): the data card's `language` (none declared: left out)
    prompt_rule: last_user_or_tool   # the prompt: the conversation up to its last user/tool message, or
                               #   first_user: the system messages before the first user message + it
    max_bytes: 200000          # a raw row larger than this is rejected as too_large
    allow_empty: false         # true: a source with no accepted prompt is a warning, not a failed asset
    max_reject_rate: 0.5       # a reject rate (rejected / read) above this warns (check + report)
    description: ""            # free text
    regenerate: final_turn     # or all_turns: every assistant turn regenerated in order, on-policy
                               #   (generate/multiturn.py); final_turn = only the last one (default)
    max_turns: 8               # all_turns only: regenerate at most this many turns per conversation
    control_text: reject       # literal control-token text (e.g. `<|im_end|>`, `</think>`) in the data:
                               #   reject (quarantined at tokenize: control_token_in_content), as_text
                               #   (encoded as ordinary text), as_served (special ids, as a server's chat
                               #   endpoint would; flagged in tokenized_prompts.control_text_in_content)
    on_tool_mismatch: end      # all_turns only: a regenerated turn whose tool calls differ from the
                               #   dataset's (count, names, arguments) ends the conversation (end) or
                               #   the dataset's tool results are used anyway (continue); counted
    role: train                # or eval: a benchmark's prompts, never tokenized or generated; every
                               #   training prompt overlapping one is quarantined (eval_overlap,
                               #   decontaminate.py); or probe: a fixed prompt set that IS tokenized and
                               #   generated (again for every drafter the fleet runs) but never trained
                               #   on; overlapping training prompts are quarantined (probe_overlap,
                               #   docs/probes.md); with regenerate: all_turns each turn is measured
    overlap_threshold: 0.5     # eval only: the 13-gram overlap share that quarantines (decontaminate.py)
    function_docs: ../bfcl/multi_turn_func_doc   # BFCL multi-turn files: BFCL's multi_turn_func_doc
                               #   folder (local, relative to the YAML's folder); each record's
                               #   involved_classes are joined to their docs (bfcl.py, docs/bfcl.md)
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import PROJECT_ROOT
from ..spelling import did_you_mean
from .errors import SourceSpecError
from .normalize import FIELD_NAMES, FORMAT_ALIASES, PROMPT_RULES
from .remote import SourceFile, file_uri_to_path, is_remote, is_uri, remote_files, validate_source_uri

REGENERATE_MODES = ("final_turn", "all_turns")
# What tokenize does with control-token text in the data (tokenize/control_text.py, same names),
# strictest first: a prompt in several sources is tokenized under the strictest (ingest/pipeline.py).
CONTROL_TEXT_POLICIES = ("reject", "as_text", "as_served")
TOOL_MISMATCH_POLICIES = ("end", "continue")
SOURCE_ROLES = ("train", "eval", "probe")
_LANG = re.compile(r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class SourceSpec:
    name: str
    path: str
    format: str = "auto"
    field_map: dict[str, str] = field(default_factory=dict)
    limit: int | None = None
    sample_fraction: float | None = None
    seed: int = 0
    licence: str = ""
    language: list[str] = field(default_factory=list)
    prompt_rule: str = "last_user_or_tool"
    max_bytes: int = 200_000
    base_dir: Path | None = None
    description: str = ""
    allow_empty: bool = False
    max_reject_rate: float = 0.5
    regenerate: str = "final_turn"
    max_turns: int | None = None
    on_tool_mismatch: str = "end"
    control_text: str = "reject"
    role: str = "train"
    overlap_threshold: float | None = None  # role: eval/probe only; None: decontaminate.DEFAULT_OVERLAP_THRESHOLD
    function_docs: str | None = None

    @property
    def all_turns(self) -> bool:
        return self.regenerate == "all_turns"

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:  # one line per problem, each naming the source
            raise SourceSpecError("\n".join(f"source {self.name!r}: {p}" for p in problems))

    def files(self) -> list[SourceFile]:
        """The data files this source reads, sorted; raises IngestFileError when none match.

        Local files come back as Paths; files named by a remote URI as storage.DataPaths (remote.py).
        """
        from .errors import IngestFileError

        if is_remote(self.path):
            return list(remote_files(self.path, self.name))
        raw = file_uri_to_path(self.path) if is_uri(self.path) else self.path
        p = Path(raw).expanduser()
        if not p.is_absolute():
            p = (self.base_dir or Path.cwd()) / p
        if any(ch in raw for ch in "*?["):
            matches: list[SourceFile] = sorted(Path(x) for x in glob.glob(str(p), recursive=True) if Path(x).is_file())
            if not matches:
                hint = self._relative_path_hint(raw)
                raise IngestFileError(f"source {self.name!r}: no file matches {self.path!r} (pattern {p}){hint}")
            return matches
        if not p.exists():
            raise IngestFileError(f"source {self.name!r}: file not found: {p}{self._relative_path_hint(raw)}")
        if p.is_dir():
            raise IngestFileError(f"source {self.name!r}: {p} is a directory; give a file or a glob")
        return [p]

    def _relative_path_hint(self, raw: str) -> str:
        """For a relative `path` that names nothing: where relative paths are read from, and what to write when
        it names a file relative to the project's folder or the working folder instead."""
        if Path(raw).expanduser().is_absolute() or self.base_dir is None:
            return ""
        for root in dict.fromkeys([PROJECT_ROOT, Path.cwd()]):
            if glob.glob(str(root / raw), recursive=True):
                rel = os.path.relpath(root / raw, self.base_dir)
                return (
                    f"; a relative path is read from the YAML's folder ({self.base_dir}), not from {root}: "
                    f"write {rel!r} (or an absolute path)"
                )
        return f"; a relative path is read from the YAML's folder ({self.base_dir})"

    def function_docs_folder(self) -> Path | None:
        """The `function_docs` folder as a local path (relative to the YAML's folder), or None."""
        if self.function_docs is None:
            return None
        raw = file_uri_to_path(self.function_docs) if is_uri(self.function_docs) else self.function_docs
        p = Path(raw).expanduser()
        return p if p.is_absolute() else (self.base_dir or Path.cwd()) / p


def _validate(spec: SourceSpec) -> list[str]:
    """Every problem of the spec, one line each (empty: valid)."""
    out: list[str] = []
    if not isinstance(spec.name, str) or not _NAME.match(spec.name):
        out.append("name must be letters, digits, '_', '-' or '.', starting with a letter or digit")
    if not isinstance(spec.path, str) or not spec.path.strip():
        out.append("path must be a non-empty string")
    elif is_uri(spec.path) and (problem := validate_source_uri(spec.path)):
        out.append(problem)
    if spec.format not in FORMAT_ALIASES:
        out.append(f"format {spec.format!r} is not one of {', '.join(sorted(FORMAT_ALIASES))}")
    if spec.prompt_rule not in PROMPT_RULES:
        out.append(f"prompt_rule {spec.prompt_rule!r} is not one of {', '.join(PROMPT_RULES)}")
    if not isinstance(spec.field_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in spec.field_map.items()
    ):
        out.append("field_map must map field names (strings) to field names (strings)")
    elif unknown := sorted(set(spec.field_map) - set(FIELD_NAMES)):
        out.append(f"field_map has unknown canonical field(s) {', '.join(unknown)}; known: {', '.join(FIELD_NAMES)}")
    if spec.limit is not None and (not _is_int(spec.limit) or spec.limit < 1):
        out.append(f"limit must be a positive integer, got {spec.limit!r}")
    if spec.sample_fraction is not None and (
        isinstance(spec.sample_fraction, bool)
        or not isinstance(spec.sample_fraction, (int, float))
        or not 0 < spec.sample_fraction <= 1
    ):
        out.append(f"sample_fraction must be a number in (0, 1], got {spec.sample_fraction!r}")
    if not _is_int(spec.seed):
        out.append(f"seed must be an integer, got {spec.seed!r}")
    if not _is_int(spec.max_bytes) or spec.max_bytes < 2:
        out.append(f"max_bytes must be a positive integer, got {spec.max_bytes!r}")
    if not isinstance(spec.allow_empty, bool):
        out.append(f"allow_empty must be true or false, got {spec.allow_empty!r}")
    if (
        isinstance(spec.max_reject_rate, bool)
        or not isinstance(spec.max_reject_rate, (int, float))
        or not 0 <= spec.max_reject_rate <= 1
    ):
        out.append(f"max_reject_rate must be a number in [0, 1], got {spec.max_reject_rate!r}")
    if not isinstance(spec.licence, str) or not isinstance(spec.description, str):
        out.append("licence and description must be strings")
    if not isinstance(spec.language, list) or not all(isinstance(x, str) and _LANG.match(x) for x in spec.language):
        out.append(
            f"field 'language': must be an ISO 639 code (en, zh, pt-BR) or a list of them, got {spec.language!r}"
        )
    return out + _turn_and_role_problems(spec)


def _turn_and_role_problems(spec: SourceSpec) -> list[str]:
    out: list[str] = []
    if spec.regenerate not in REGENERATE_MODES:
        out.append(f"field 'regenerate': {spec.regenerate!r} is not one of {', '.join(REGENERATE_MODES)}")
    if spec.max_turns is not None and (not _is_int(spec.max_turns) or spec.max_turns < 1):
        out.append(f"field 'max_turns': must be a positive integer, got {spec.max_turns!r}")
    if spec.on_tool_mismatch not in TOOL_MISMATCH_POLICIES:
        out.append(
            f"field 'on_tool_mismatch': {spec.on_tool_mismatch!r} is not one of {', '.join(TOOL_MISMATCH_POLICIES)}"
        )
    if spec.control_text not in CONTROL_TEXT_POLICIES:
        out.append(f"field 'control_text': {spec.control_text!r} is not one of {', '.join(CONTROL_TEXT_POLICIES)}")
    if spec.function_docs is not None:
        if not isinstance(spec.function_docs, str) or not spec.function_docs.strip():
            out.append(f"field 'function_docs': must be a folder path, got {spec.function_docs!r}")
        elif is_remote(spec.function_docs):
            out.append(
                f"field 'function_docs': {spec.function_docs!r} must be a local folder (BFCL multi_turn_func_doc/)"
            )
        elif spec.format in FORMAT_ALIASES and FORMAT_ALIASES[spec.format] not in ("bfcl", "auto"):
            out.append(f"field 'function_docs': only applies with format bfcl (or auto), not {spec.format!r}")
    if spec.regenerate != "all_turns" and (spec.max_turns is not None or spec.on_tool_mismatch != "end"):
        out.append("fields 'max_turns' and 'on_tool_mismatch' only apply with 'regenerate: all_turns'")
    if spec.role not in SOURCE_ROLES:
        out.append(f"field 'role': {spec.role!r} is not one of {', '.join(SOURCE_ROLES)}")
    if spec.overlap_threshold is not None:
        t = spec.overlap_threshold
        if spec.role == "train":
            out.append("field 'overlap_threshold' only applies with 'role: eval' or 'role: probe'")
        elif isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:
            out.append(f"field 'overlap_threshold': must be a number in (0, 1], got {t!r}")
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_FIELDS = {f for f in SourceSpec.__dataclass_fields__ if f != "base_dir"}


def spec_from_dict(raw: Any, *, source: str, default_name: str, base_dir: Path | None) -> SourceSpec:
    """Build a SourceSpec from parsed YAML; errors name `source` (the file) and the field."""
    if not isinstance(raw, dict):
        raise SourceSpecError(f"{source}: a source file must be a mapping of fields, got {type(raw).__name__}")
    d = dict(raw)
    if "license" in d:  # accept the American spelling too
        if "licence" in d:
            raise SourceSpecError(f"{source}: give either 'licence' or 'license', not both")
        d["licence"] = d.pop("license")
    problems: list[str] = []
    unknown = sorted(str(k) for k in set(d) - _FIELDS)
    if unknown:
        named = ", ".join(k + did_you_mean(k, _FIELDS) for k in unknown)
        problems.append(f"unknown field(s) {named}; known: {', '.join(sorted(_FIELDS))}")
        d = {k: v for k, v in d.items() if k in _FIELDS}
    if "path" not in d or d["path"] is None:
        problems.append("missing field 'path'")
        d["path"] = "?"  # the other fields are still checked
    d.setdefault("name", default_name)
    d["field_map"] = d.get("field_map") or {}
    d["licence"] = "" if d.get("licence") is None else d["licence"]
    d["language"] = [d["language"]] if isinstance(d.get("language"), str) else (d.get("language") or [])
    d["description"] = "" if d.get("description") is None else d["description"]
    for key in ("regenerate", "on_tool_mismatch", "control_text", "role"):
        if key in d and d[key] is None:
            del d[key]  # `regenerate:` with no value: the default
    try:
        spec = SourceSpec(**d, base_dir=base_dir)
    except SourceSpecError as e:
        problems += str(e).splitlines()
    if problems:
        raise SourceSpecError("\n".join(f"{source}: {p}" for p in problems))
    return spec


def load_source_spec(path: Path) -> SourceSpec:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SourceSpecError(f"{path}: cannot read: {e.strerror or e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise SourceSpecError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    return spec_from_dict(raw, source=str(path), default_name=path.stem, base_dir=path.parent.resolve())


def load_source_specs(sources_dir: Path) -> list[SourceSpec]:
    """Every *.yaml / *.yml in the folder, sorted by file name. Names must be unique.

    Every file is checked before raising: the SourceSpecError has one line per problem.
    """
    loaded, problems = read_source_specs(sources_dir)
    if problems:
        raise SourceSpecError("\n".join(problems))
    return [spec for _, spec in loaded]


def read_source_specs(sources_dir: Path) -> tuple[list[tuple[Path, SourceSpec]], list[str]]:
    """(file, spec) of every valid source YAML and one line per problem of the others (never raises)."""
    if not sources_dir.is_dir():
        return [], [f"sources folder not found: {sources_dir}"]
    files = sorted([*sources_dir.glob("*.yaml"), *sources_dir.glob("*.yml")])
    loaded: list[tuple[Path, SourceSpec]] = []
    seen: dict[str, Path] = {}
    problems: list[str] = []
    for f in files:
        try:
            spec = load_source_spec(f)
        except SourceSpecError as e:
            problems += str(e).splitlines()
            continue
        if spec.name in seen:
            problems.append(f"{f}: field 'name': source name {spec.name!r} is already used by {seen[spec.name]}")
            continue
        seen[spec.name] = f
        loaded.append((f, spec))
    return loaded, problems


def source_control_text(sources_dir: Path) -> dict[str, str]:
    """Source name -> its YAML's `control_text` policy (tokenize/control_text.py); {} without a sources folder
    (every source then gets the default, reject)."""
    if not sources_dir.is_dir():
        return {}
    return {spec.name: spec.control_text for spec in load_source_specs(sources_dir)}


def probe_source_names(sources_dir: Path) -> tuple[str, ...]:
    """The `role: probe` sources of the folder (none when it does not exist)."""
    if not sources_dir.is_dir():
        return ()
    return tuple(s.name for s in load_source_specs(sources_dir) if s.role == "probe")
