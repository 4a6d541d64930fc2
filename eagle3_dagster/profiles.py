"""Model profiles: the small registry of per-model facts the whole pipeline reads.

A profile is data (`assets/models/<name>.yaml`), in the spirit of SpecForge's template registry.
Checks, the simulator and the training-table builder read token ids from here; nothing outside
the Kimi profile file hard-codes Kimi's ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .spelling import did_you_mean


class ProfileError(ValueError):
    """A profile file is missing, unreadable or inconsistent; the message names file and field."""


@dataclass(frozen=True)
class ToolCallIds:
    section_begin: int | None = None
    section_end: int | None = None
    call_begin: int | None = None
    argument_begin: int | None = None
    call_end: int | None = None


@dataclass(frozen=True)
class SamplingDefaults:
    # max_new_tokens is always sent explicitly: SGLang's /generate default of 128 truncates reasoning.
    max_new_tokens: int = 4096
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = -1
    min_p: float = 0.0
    # Sent explicitly too (neutral values by default): SGLang merges --preferred-sampling-params under
    # every request, so a field left out could be changed by whoever started the server.
    min_new_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False


@dataclass(frozen=True)
class ModelProfile:
    name: str
    tokenizer: str  # a local folder or a Hugging Face id
    template_family: str  # how tools are declared: "kimi_ts" (tools_ts_str) or "hf" (template only)
    think_start_id: int
    think_end_id: int
    end_of_turn_id: int
    stop_token_ids: tuple[int, ...]
    vocab_size: int
    context_length: int
    max_prompt_tokens: int
    generation_prompt_ends_with_think_start: bool
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    tool_call_ids: ToolCallIds = field(default_factory=ToolCallIds)
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    # The longest training sample (prompt + output ids) the training gate accepts (feature
    # `total_len`); a limit of the drafter's training, not of what the model sees or emits.
    max_train_len: int = 65536
    # What an endpoint serving this model says in /model_info: its `model_type` (the model's Hugging Face
    # config model_type) must be one of these, and its `model_path` this one when set (generate/served_model.py).
    model_types: tuple[str, ...] = ()
    model_path: str | None = None
    trust_remote_code: bool = False
    source_file: str = ""

    def with_tokenizer(self, tokenizer: str) -> ModelProfile:
        d = asdict(self)
        d["tokenizer"] = tokenizer
        d["tool_call_ids"] = self.tool_call_ids
        d["sampling"] = self.sampling
        d["stop_token_ids"] = tuple(self.stop_token_ids)
        return ModelProfile(**d)

    def max_new_tokens_for(self, override: int | None) -> int:
        """max_new_tokens of a run: the override (resource field, CLI flag) when set, else the profile's."""
        return int(override) if override is not None else int(self.sampling.max_new_tokens)

    def fingerprint(self) -> str:
        """Hash of everything in the profile that changes what the model sees or emits."""
        d = asdict(self)
        d.pop("source_file", None)
        d.pop("max_train_len", None)  # a training-table limit: changes nothing the model sees or emits
        d.pop("model_types", None)  # which served model is accepted: checked, never sent
        d.pop("model_path", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


_REQUIRED = (
    "name",
    "tokenizer",
    "template_family",
    "think_start_id",
    "think_end_id",
    "end_of_turn_id",
    "stop_token_ids",
    "vocab_size",
    "context_length",
    "max_prompt_tokens",
    "generation_prompt_ends_with_think_start",
    "model_types",
)


def profile_from_dict(raw: dict[str, Any], *, source: str = "<dict>", base_dir: Path | None = None) -> ModelProfile:
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: a profile must be a mapping, got {type(raw).__name__}")
    known = set(ModelProfile.__dataclass_fields__)
    unknown = sorted(str(k) for k in set(raw) - known)
    missing = [k for k in _REQUIRED if k not in raw]
    if unknown or missing:  # both at once: a misspelt required field is one of each
        named = ", ".join(k + did_you_mean(k, known) for k in unknown)
        problems = [f"unknown field(s) {named}; known: {', '.join(sorted(known))}"] if unknown else []
        hint = (
            " (model_types: the model_type(s) an endpoint serving this model reports in /model_info, the model's "
            "config.json `model_type`, e.g. [kimi_k25]; an endpoint serving another model is refused)"
            if "model_types" in missing
            else ""
        )
        problems += [f"missing field(s) {', '.join(missing)}{hint}"] if missing else []
        raise ProfileError(f"{source}: {'; '.join(problems)}")
    d = dict(raw)
    tok = str(d["tokenizer"])
    # A relative local path is relative to the profile file, so a profile folder can move as a whole.
    if base_dir is not None and (tok.startswith(("./", "../"))):
        tok = str((base_dir / tok).resolve())
    d["tokenizer"] = tok
    try:
        d["tool_call_ids"] = ToolCallIds(**(d.get("tool_call_ids") or {}))
        d["sampling"] = SamplingDefaults(**(d.get("sampling") or {}))
    except TypeError as e:
        raise ProfileError(f"{source}: {e}") from None
    d["stop_token_ids"] = tuple(int(x) for x in d["stop_token_ids"])
    d["template_kwargs"] = dict(d.get("template_kwargs") or {})
    d["source_file"] = source
    if d["template_family"] not in ("kimi_ts", "hf"):
        raise ProfileError(f"{source}: template_family must be 'kimi_ts' or 'hf', got {d['template_family']!r}")
    for k in ("think_start_id", "think_end_id", "end_of_turn_id"):
        if not 0 <= int(d[k]) < int(d["vocab_size"]):
            raise ProfileError(f"{source}: {k}={d[k]} is outside the vocabulary (vocab_size={d['vocab_size']})")
    mtl = d.get("max_train_len", ModelProfile.max_train_len)
    if isinstance(mtl, bool) or not isinstance(mtl, int) or mtl < 1:
        raise ProfileError(f"{source}: max_train_len must be an integer >= 1 (default 65536), got {mtl!r}")
    d["model_types"], d["model_path"] = _served_model_fields(source, d["model_types"], d.get("model_path"))
    if d["end_of_turn_id"] not in d["stop_token_ids"]:
        raise ProfileError(f"{source}: stop_token_ids must include end_of_turn_id {d['end_of_turn_id']}")
    return ModelProfile(**d)


def _served_model_fields(source: str, types: Any, path: Any) -> tuple[tuple[str, ...], str | None]:
    """(model_types, model_path) of a profile: a non-empty list of names (one name alone is accepted), a path or
    nothing."""
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not names or not all(isinstance(t, str) and t.strip() for t in names):
        raise ProfileError(
            f"{source}: model_types must be a non-empty list of /model_info model_type names (e.g. [kimi_k25]), "
            f"got {types!r}"
        )
    if path is not None and (not isinstance(path, str) or not path.strip()):
        raise ProfileError(f"{source}: model_path must be a model path (a Hugging Face id or a folder), got {path!r}")
    return tuple(t.strip() for t in names), path.strip() if path else None


def load_profile(name_or_path: str | Path, models_dir: Path | None = None) -> ModelProfile:
    """Load a profile by name (from `models_dir`, e.g. Settings.models_dir) or by path to a YAML file.

    No global fallback: a name without `models_dir` is an error (the caller passes the folder).
    """
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml") and "/" not in str(name_or_path):
        if models_dir is None:
            raise ProfileError(
                f"model profile {str(name_or_path)!r} is a name: pass models_dir (Settings.models_dir) or a YAML path"
            )
        p = models_dir / f"{name_or_path}.yaml"
    if not p.exists():
        avail = sorted(x.stem for x in p.parent.glob("*.yaml")) if p.parent.exists() else []
        raise ProfileError(
            f"model profile {str(name_or_path)!r} not found at {p}{did_you_mean(str(name_or_path), avail)} "
            f"(available: {', '.join(avail) or 'none'})"
        )
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ProfileError(f"{p}: not valid YAML: {e}") from None
    return profile_from_dict(raw, source=str(p), base_dir=p.parent)


def resolve_profile(model: str | Path, models_dir: Path, tokenizer: str | None = None) -> ModelProfile:
    """The profile a run uses: `model` (a name in `models_dir` or a YAML path), its tokenizer replaced by
    `tokenizer` when given (EAGLE3_TOKENIZER, a resource field, a CLI flag). The assets
    (PipelineSettings.profile), `eagle3 render` and `eagle3 inspect` all resolve it here."""
    prof = load_profile(model, models_dir)
    return prof.with_tokenizer(tokenizer) if tokenizer else prof


def active_profile(model: str | Path, models_dir: Path | None, tokenizer_override: str | None = None) -> ModelProfile:
    """The profile the pipeline runs with: `model` (Settings.model, EAGLE3_MODEL) from `models_dir`, with
    `tokenizer_override` (Settings.tokenizer_override, EAGLE3_TOKENIZER) replacing its tokenizer."""
    prof = load_profile(model, models_dir)
    if tokenizer_override:
        prof = prof.with_tokenizer(tokenizer_override)
    return prof
