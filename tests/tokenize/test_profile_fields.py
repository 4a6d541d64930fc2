"""Profile fields the pipeline reads besides token ids: max_train_len (the training gate's length limit),
validated where the YAML is read; and one resolution of profile + tokenizer for assets and CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.profiles import ProfileError, load_profile, resolve_profile

MODELS_DIR = PROJECT_ROOT / "assets" / "models"
QWEN_TOKENIZER_DIR = (PROJECT_ROOT.parent / "shared" / "tokenizers" / "qwen3").resolve()


def _profile_with(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load((MODELS_DIR / "kimi-k2.5.yaml").read_text())
    raw.update(changes)
    for k, v in list(raw.items()):
        if v is None:
            del raw[k]
    p = tmp_path / "kimi-k2.5.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.mark.parametrize("name", ["kimi-k2.5", "qwen3"])
def test_shipped_profiles_allow_65536_training_tokens(name: str) -> None:
    assert load_profile(name, MODELS_DIR).max_train_len == 65536


def test_max_train_len_defaults_and_is_read(tmp_path: Path) -> None:
    assert load_profile(_profile_with(tmp_path, max_train_len=None)).max_train_len == 65536
    short = load_profile(_profile_with(tmp_path, max_train_len=4096))
    assert short.max_train_len == 4096
    # a training-table limit, not something the model sees: cache keys built on the fingerprint stay
    assert short.fingerprint() == load_profile(MODELS_DIR / "kimi-k2.5.yaml").fingerprint()


@pytest.mark.parametrize("bad", [0, -5, "65536", 1.5, True])
def test_bad_max_train_len_names_file_field_and_value(tmp_path: Path, bad) -> None:
    path = _profile_with(tmp_path, max_train_len=bad)
    with pytest.raises(ProfileError, match=r"kimi-k2\.5\.yaml: max_train_len must be an integer >= 1") as e:
        load_profile(path)
    assert repr(bad) in str(e.value)


def test_resolve_profile_applies_the_tokenizer_override() -> None:
    assert resolve_profile("kimi-k2.5", MODELS_DIR).tokenizer == "moonshotai/Kimi-K2.5"
    assert resolve_profile("kimi-k2.5", MODELS_DIR, str(QWEN_TOKENIZER_DIR)).tokenizer == str(QWEN_TOKENIZER_DIR)
    assert resolve_profile("qwen3", MODELS_DIR, None).name == "qwen3"
