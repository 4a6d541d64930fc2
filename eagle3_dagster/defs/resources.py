"""Resources: where the pipeline reads and writes, which model profile, which SGLang fleet.

Every field is optional and falls back to the environment (see config.py), so the same
definitions serve `make demo`, `dagster dev` and a production deployment; the launchpad can
override any of them per run. The SGLang API key is never a field: the client reads it from
SGLANG_API_KEY, so it cannot leak into run config or metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import dagster as dg

from ..config import settings
from ..profiles import ModelProfile, load_profile


class PipelineSettings(dg.ConfigurableResource):
    data_dir: Optional[str] = None
    assets_dir: Optional[str] = None
    expectations_dir: Optional[str] = None
    model: Optional[str] = None
    tokenizer: Optional[str] = None
    max_new_tokens: Optional[int] = None

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).resolve() if self.data_dir else settings().data_dir

    @property
    def assets_path(self) -> Path:
        return Path(self.assets_dir).resolve() if self.assets_dir else settings().assets_dir

    @property
    def expectations_path(self) -> Path:
        return Path(self.expectations_dir).resolve() if self.expectations_dir else settings().expectations_dir

    def profile(self) -> ModelProfile:
        s = settings()
        prof = load_profile(self.model or s.model, self.assets_path / "models")
        tok = self.tokenizer or s.tokenizer_override
        return prof.with_tokenizer(tok) if tok else prof


class SGLangFleet(dg.ConfigurableResource):
    """The SGLang endpoints (or one sglang-router) that serve the target model."""

    urls: Optional[str] = None  # comma-separated; default EAGLE3_SGLANG_URL
    max_in_flight: Optional[int] = None  # default: from /server_info
    model_revision: Optional[str] = None  # default: from /model_info
    regen_seed: Optional[int] = None  # bump to regenerate every sample

    def endpoints(self) -> tuple[str, ...]:
        if self.urls:
            return tuple(u.strip().rstrip("/") for u in self.urls.split(",") if u.strip())
        return settings().sglang_urls


_RENDERERS: dict[str, object] = {}


def cached_renderer(profile: ModelProfile):
    """One renderer (and one 19 MB tokenizer load) per profile per process."""
    from ..tokenize import PromptRenderer

    key = f"{profile.fingerprint()}:{profile.tokenizer}"
    if key not in _RENDERERS:
        _RENDERERS[key] = PromptRenderer(profile)
    return _RENDERERS[key]
