"""Process-wide settings, read from the environment with sane defaults.

One place for every environment variable the project reads, so the README can list them and
tests can override them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The project root is the folder holding pyproject.toml; defaults are relative to it so
# `make demo` works from a fresh clone without any configuration.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _path_from_env(var: str, default: Path) -> Path:
    raw = os.environ.get(var)
    return Path(raw).expanduser().resolve() if raw else default


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    assets_dir: Path
    expectations_dir: Path
    model: str
    tokenizer_override: str | None
    sglang_urls: tuple[str, ...]
    n_shards: int

    @property
    def sources_dir(self) -> Path:
        return self.assets_dir / "sources"

    @property
    def models_dir(self) -> Path:
        return self.assets_dir / "models"


def settings() -> Settings:
    """Read settings now (not at import), so tests and Dagster runs see the current env."""
    urls = tuple(u.strip().rstrip("/") for u in os.environ.get("EAGLE3_SGLANG_URL", "").split(",") if u.strip())
    return Settings(
        data_dir=_path_from_env("EAGLE3_DATA_DIR", PROJECT_ROOT / "data"),
        assets_dir=_path_from_env("EAGLE3_ASSETS_DIR", PROJECT_ROOT / "assets"),
        expectations_dir=_path_from_env("EAGLE3_EXPECTATIONS_DIR", PROJECT_ROOT / "expectations"),
        model=os.environ.get("EAGLE3_MODEL", "kimi-k2.5"),
        tokenizer_override=os.environ.get("EAGLE3_TOKENIZER") or None,
        sglang_urls=urls or ("http://127.0.0.1:30000",),
        n_shards=int(os.environ.get("EAGLE3_N_SHARDS", "4")),
    )
