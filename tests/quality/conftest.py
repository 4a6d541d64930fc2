"""Fixtures for the quality tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from quality_helpers import EXPECTATIONS_DIR, Kimi


@pytest.fixture(scope="session")
def kimi(kimi_tokenizer, kimi_profile) -> Kimi:
    return Kimi(kimi_tokenizer, kimi_profile)


@pytest.fixture()
def gx_dirs(tmp_path: Path) -> dict[str, Path]:
    return {"expectations_dir": EXPECTATIONS_DIR, "context_dir": tmp_path / "data" / "gx"}
