"""Fixtures for the tokenize stage: one renderer per model for the whole session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.tokenize import PromptRenderer, load_tokenizer

GOLDEN_DIR_PARTS = ("tokenizers", "kimi-k2.5", "golden")


def load_golden(shared_dir: Path, name: str) -> dict[str, Any]:
    return json.loads(shared_dir.joinpath(*GOLDEN_DIR_PARTS, name).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def kimi_tok(kimi_profile: ModelProfile):
    # Loaded through our own loader (a folder with tokenizer.json), once per session.
    return load_tokenizer(kimi_profile.tokenizer)


@pytest.fixture(scope="session")
def kimi_renderer(kimi_profile: ModelProfile, kimi_tok) -> PromptRenderer:
    return PromptRenderer(kimi_profile, kimi_tok)


@pytest.fixture(scope="session")
def qwen_renderer(qwen_profile: ModelProfile) -> PromptRenderer:
    return PromptRenderer(qwen_profile)  # loads qwen_profile.tokenizer itself (vocab.json + merges.txt)
