"""Tokenizer loading without remote code.

Three kinds of `location`:
  (a) a local folder with tokenizer.json (or vocab.json + merges.txt) and a plain config;
  (b) a folder laid out like an official remote-code release (tiktoken.model + a tokenizer_config
      with `auto_map`): converted once to a fast tokenizer and cached, never executing its code;
  (c) a Hugging Face id: only tokenizer files are downloaded, then (a) or (b) applies.

`trust_remote_code` is False unless a profile opts in explicitly.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Bump when the conversion output changes, so stale cache folders are not reused.
_CONVERTER_VERSION = "tiktoken-fast/1"

# Files a tokenizer can need; Hub downloads are restricted to these (never code or weights).
TOKENIZER_FILE_PATTERNS = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tiktoken.model",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",  # small; AutoTokenizer reads model_type from it when the tokenizer config has no class
]

_CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")

# The Kimi pre-tokenizer regex (from the official tokenizer; see RECIPE.md). `&&` is class
# intersection, supported by the Oniguruma engine the `tokenizers` library uses.
KIMI_TIKTOKEN_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# Official tiktoken releases reserve this many control-token slots after the BPE ranks.
_TIKTOKEN_CONTROL_SLOTS = 256

_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class TokenizerLoadError(RuntimeError):
    """The tokenizer cannot be loaded; the message names the location and the reason."""


def default_cache_dir() -> Path:
    """Where converted tokenizers are kept, one folder per sha256 of their inputs."""
    return Path("~/.cache/eagle3-dagster/tokenizers").expanduser()


def load_tokenizer(location: str, *, trust_remote_code: bool = False, cache_dir: Path | None = None):
    """Load a transformers fast tokenizer from a folder or a Hugging Face id (see module doc)."""
    folder = Path(location).expanduser()
    if folder.is_dir():
        return _load_folder(folder.resolve(), trust_remote_code=trust_remote_code, cache_dir=cache_dir)
    if folder.exists():
        raise TokenizerLoadError(f"tokenizer location {location!r} is a file; expected a folder or a Hugging Face id")
    if _HF_ID.match(location) and not location.startswith((".", "~")):
        downloaded = _download_tokenizer_files(location)
        return _load_folder(downloaded, trust_remote_code=trust_remote_code, cache_dir=cache_dir)
    raise TokenizerLoadError(
        f"tokenizer location {location!r} is neither an existing folder nor a Hugging Face id (owner/name)"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerLoadError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path}: expected a JSON object")
    return data


def _load_folder(folder: Path, *, trust_remote_code: bool, cache_dir: Path | None):
    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.exists() else {}
    needs_remote_code = "auto_map" in config
    if trust_remote_code:
        from transformers import AutoTokenizer

        tokenizer = _guarded(folder, lambda: AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True))
    elif needs_remote_code or (not _has_plain_tokenizer_files(folder) and _tiktoken_file(folder) is not None):
        # A remote-code release: build a plain, code-free copy (tokenizer.json + clean config) once.
        plain = _guarded(folder, lambda: _plain_copy(folder, config, cache_dir or default_cache_dir()))
        tokenizer = _guarded(folder, lambda: _from_plain_folder(plain))
    else:
        tokenizer = _guarded(folder, lambda: _from_plain_folder(folder))
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise TokenizerLoadError(f"{folder}: loaded {type(tokenizer).__name__}, which is not a fast tokenizer")
    return tokenizer


# The classes AutoTokenizer resolves a bare tokenizer.json folder to. Such a folder is loaded by that class
# directly: AutoTokenizer's model registry imports torch when it is installed (about 1.7 s of CPU in every
# process that loads a tokenizer: each step, CLI and simulator), and a plain tokenizer.json needs none of it.
_TOKENIZER_JSON_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})


def _from_plain_folder(folder: Path):
    """A code-free folder's tokenizer: its tokenizer.json class directly when it declares one of
    `_TOKENIZER_JSON_CLASSES` (and no model config that could map it elsewhere), else AutoTokenizer."""
    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.exists() else {}
    if (
        config.get("tokenizer_class") in _TOKENIZER_JSON_CLASSES
        and (folder / "tokenizer.json").exists()
        and not (folder / "config.json").exists()
    ):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _guarded(folder: Path, load):
    try:
        return load()
    except TokenizerLoadError:
        raise
    except Exception as e:  # transformers raises many types; name the folder in one clear error
        why = " ".join(str(e).split())  # a library's message may run over several lines: one line, whole
        raise TokenizerLoadError(f"{folder}: cannot load tokenizer: {type(e).__name__}: {why}") from e


def _has_plain_tokenizer_files(folder: Path) -> bool:
    return (folder / "tokenizer.json").exists() or (
        (folder / "vocab.json").exists() and (folder / "merges.txt").exists()
    )


def _tiktoken_file(folder: Path) -> Path | None:
    for candidate in [folder / "tiktoken.model", *sorted(folder.glob("*.tiktoken"))]:
        if candidate.exists():
            return candidate
    return None


def _plain_copy(folder: Path, config: dict[str, Any], cache_root: Path) -> Path:
    """A cached folder holding tokenizer.json + a plain config + the chat template, built from `folder`."""
    tiktoken_path = None if (folder / "tokenizer.json").exists() else _tiktoken_file(folder)
    source_tokenizer = folder / "tokenizer.json" if tiktoken_path is None else tiktoken_path
    if not source_tokenizer.exists():
        raise TokenizerLoadError(
            f"{folder}: needs remote code (auto_map) but has neither tokenizer.json nor a tiktoken rank file"
        )
    inputs = [source_tokenizer, folder / "tokenizer_config.json"] + [folder / n for n in _CHAT_TEMPLATE_FILES]
    digest = hashlib.sha256(_CONVERTER_VERSION.encode())
    for path in inputs:
        digest.update(path.name.encode() + b"\0")
        if path.exists():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    target = cache_root / digest.hexdigest()
    if (target / "tokenizer.json").exists() and (target / "tokenizer_config.json").exists():
        return target

    cache_root.mkdir(parents=True, exist_ok=True)
    staging = cache_root / f".{target.name}.{uuid.uuid4().hex}.tmp"
    staging.mkdir()
    try:
        if tiktoken_path is not None:
            logger.info("converting %s to a fast tokenizer (cached at %s)", tiktoken_path, target)
            convert_tiktoken(tiktoken_path, config).save(str(staging / "tokenizer.json"))
        else:
            shutil.copyfile(source_tokenizer, staging / "tokenizer.json")
        for name in _CHAT_TEMPLATE_FILES:
            if (folder / name).exists():
                shutil.copyfile(folder / name, staging / name)
        (staging / "tokenizer_config.json").write_text(
            json.dumps(_plain_config(config), indent=2, ensure_ascii=False), encoding="utf-8"
        )
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / "tokenizer.json").exists():  # lost a race to another process: fine
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _plain_config(config: dict[str, Any]) -> dict[str, Any]:
    """The remote-code config minus everything that would select or run remote code."""
    keep = (
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "additional_special_tokens",
        "added_tokens_decoder",
        "clean_up_tokenization_spaces",
        "chat_template",
    )
    plain: dict[str, Any] = {k: config[k] for k in keep if k in config}
    plain["tokenizer_class"] = "PreTrainedTokenizerFast"
    max_length = config.get("model_max_length")
    plain["model_max_length"] = max_length if isinstance(max_length, int) and max_length < 2**40 else 262144
    return plain


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Read a tiktoken rank file: one `base64(token) rank` pair per line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                token_b64, rank = line.split()
                ranks[base64.b64decode(token_b64, validate=True)] = int(rank)
            except ValueError as e:
                raise TokenizerLoadError(f"{path}:{line_no}: not a 'base64 rank' line: {e}") from None
    return ranks


def convert_tiktoken(path: Path, config: dict[str, Any], *, pattern: str = KIMI_TIKTOKEN_PATTERN):
    """Build a `tokenizers.Tokenizer` from a tiktoken rank file and a remote-code tokenizer config.

    The BPE keeps `ignore_merges=True` (tiktoken takes a whole pre-token when it is in the
    vocabulary) and the control-token slots after the ranks are filled in id order, named ones
    from `added_tokens_decoder` and `<|reserved_token_N|>` for the rest.
    """
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = read_tiktoken_ranks(path)

    class _RankFileConverter(TikTokenConverter):
        # Read the rank file ourselves instead of requiring the tiktoken package.
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tokenizer = _RankFileConverter(vocab_file=str(path), pattern=pattern, extra_special_tokens=[]).converted()
    n_ranks = len(ranks)
    if tokenizer.get_vocab_size(with_added_tokens=False) != n_ranks or set(ranks.values()) != set(range(n_ranks)):
        raise TokenizerLoadError(f"{path}: ranks are not a dense 0..{n_ranks - 1} range")
    named = {int(k): v for k, v in (config.get("added_tokens_decoder") or {}).items()}
    last_id = max([n_ranks + _TIKTOKEN_CONTROL_SLOTS - 1, *named])
    for token_id in range(n_ranks, last_id + 1):
        entry = named.get(token_id)
        if entry:
            token = AddedToken(
                entry["content"],
                single_word=entry.get("single_word", False),
                lstrip=entry.get("lstrip", False),
                rstrip=entry.get("rstrip", False),
                normalized=entry.get("normalized", False),
                special=entry.get("special", True),
            )
        else:
            token = AddedToken(f"<|reserved_token_{token_id}|>", normalized=False, special=True)
        (tokenizer.add_special_tokens if token.special else tokenizer.add_tokens)([token])
        if tokenizer.token_to_id(token.content) != token_id:
            raise TokenizerLoadError(f"{path}: control token {token.content!r} did not land on id {token_id}")
    return tokenizer


def _download_tokenizer_files(repo_id: str) -> Path:
    """Download only tokenizer files of a Hub repo (or reuse the local Hub cache)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    offline = bool(constants.HF_HUB_OFFLINE)  # what the hub client itself decided from HF_HUB_OFFLINE
    try:
        return Path(snapshot_download(repo_id, allow_patterns=TOKENIZER_FILE_PATTERNS))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as e:
        mode = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the Hub is unreachable (offline?)"
        raise TokenizerLoadError(
            f"cannot get tokenizer {repo_id!r} from Hugging Face: {mode} and it is not in the local cache "
            f"(nor is it a local folder: {Path(repo_id).resolve()} does not exist). Point the profile's tokenizer "
            f"(or EAGLE3_TOKENIZER) at a local folder instead. ({type(e).__name__})"
        ) from None
    except Exception as e:
        raise TokenizerLoadError(
            f"cannot download tokenizer {repo_id!r} from Hugging Face: {type(e).__name__}: {e}"
        ) from None
