"""Shared test fixtures: the read-only ../shared folder, profiles bound to its tokenizers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.profiles import ModelProfile, load_profile

SHARED = (PROJECT_ROOT.parent / "shared").resolve()
KIMI_TOKENIZER_DIR = SHARED / "tokenizers" / "kimi-k2.5"
QWEN_TOKENIZER_DIR = SHARED / "tokenizers" / "qwen3"
DATASETS_DIR = SHARED / "datasets"
MODELS_DIR = PROJECT_ROOT / "assets" / "models"

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Like the Makefile: the default (Kimi) profile's tokenizer is the offline copy in ../shared,
# for this process and every process a test starts (simulator, Dagster).
os.environ.setdefault("EAGLE3_TOKENIZER", str(KIMI_TOKENIZER_DIR))


def pytest_configure(config: pytest.Config) -> None:
    if not KIMI_TOKENIZER_DIR.exists():
        raise pytest.UsageError(f"the tests need ../shared beside the project; not found: {SHARED}")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return SHARED


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    return DATASETS_DIR


@pytest.fixture(scope="session")
def kimi_profile() -> ModelProfile:
    return load_profile("kimi-k2.5", MODELS_DIR).with_tokenizer(str(KIMI_TOKENIZER_DIR))


@pytest.fixture(scope="session")
def qwen_profile() -> ModelProfile:
    return load_profile("qwen3", MODELS_DIR).with_tokenizer(str(QWEN_TOKENIZER_DIR))


@pytest.fixture(scope="session")
def kimi_tokenizer(kimi_profile: ModelProfile):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(KIMI_TOKENIZER_DIR))
