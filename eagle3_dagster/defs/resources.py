"""Resources: where the pipeline reads and writes, which model profile, which SGLang fleet.

Every field is optional and falls back to the environment (see config.py), so the same
definitions serve `make demo`, `dagster dev` and a production deployment; the launchpad can
override any of them per run. The SGLang API key is never a field: the client reads it from
SGLANG_API_KEY, so it cannot leak into run config or metadata.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from ..config import settings, work_dir_for
from ..profiles import ModelProfile, load_profile
from ..storage import DataPath, data_root


class PipelineSettings(dg.ConfigurableResource):
    # A local path or a URI: file://, s3://bucket/prefix?endpoint_override=...&region=..., gs://, or any
    # fsspec protocol. Never put credentials here (they are refused): they come from the environment.
    data_dir: str | None = None
    # Local scratch for the GX file context / Data Docs and shard locks (default: see config.work_dir_for).
    work_dir: str | None = None
    assets_dir: str | None = None
    expectations_dir: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    max_new_tokens: int | None = None

    @property
    def data_path(self) -> DataPath:
        if not self.data_dir:
            return settings().data_dir
        if "://" in self.data_dir:
            return data_root(self.data_dir)
        return data_root(Path(self.data_dir).expanduser().resolve())

    @property
    def work_path(self) -> Path:
        if self.work_dir:
            return Path(self.work_dir).expanduser().resolve()
        return work_dir_for(self.data_path)

    @property
    def gx_context_dir(self) -> Path:
        """The GX file context (suites, validation results, Data Docs): always local."""
        return self.work_path / "gx"

    @property
    def gx_keep_validations(self) -> int:
        """GX validation results kept per suite (EAGLE3_GX_KEEP_VALIDATIONS, config.py); 0 keeps all."""
        return settings().gx_keep_validations

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

    urls: str | None = None  # comma-separated; default EAGLE3_SGLANG_URL
    max_in_flight: int | None = None  # default: from /server_info
    model_revision: str | None = None  # default: from /model_info
    regen_seed: int | None = None  # bump to regenerate every sample
    # Client read timeout per request. Default 3600 s: a disconnect aborts the GPU work, so it
    # should only fire on a server that is truly stuck (long reasoning answers take minutes).
    read_timeout_s: float | None = None
    max_retries: int | None = None  # per request, on 5xx/reset/timeout (default 6)
    # One bounded wait for a routable endpoint per step (default EAGLE3_ENDPOINT_WAIT_S, else 600 s).
    wait_for_endpoint_s: float | None = None
    stream: bool | None = None  # SSE with stall detection (default EAGLE3_STREAM, else on)
    stall_timeout_s: float | None = None  # silence between chunks = stall (default EAGLE3_STALL_TIMEOUT_S, else 300)

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
