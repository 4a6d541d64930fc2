"""Resource types: where the pipeline reads and writes, which model profile, which SGLang fleet.

The definitions bind them ONCE, from the validated settings (`resources_from_settings`, called by
eagle3_dagster/defs/common/resources.py), so the launchpad shows the deployment's values and a
run's config can override any field (tests/pipeline/test_run_config_overrides.py proves each one).
A field left None (a resource built in a test or script without the definitions) means the
deployment's setting (config.py). The SGLang API key is never a field: the settings module reads
SGLANG_API_KEY and hands it to GenerationConfig as a masked Secret, so it cannot leak into run
config or metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from ..config import Settings, settings, work_dir_for
from ..profiles import ModelProfile, resolve_profile
from ..quality.request_failures import DEFAULT_MAX_FAILED_RATE
from ..storage import DataPath, data_root
from ..urls import Endpoints, has_credentials, parse_endpoint_urls


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
    # A generations shard whose permanently failed requests exceed this fraction of its requests fails its
    # request_failure_budget check (and is left out of snapshots); any failure within it is a warning.
    max_failed_rate: float = DEFAULT_MAX_FAILED_RATE

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
    def sources_path(self) -> Path:
        """The prompt-source YAMLs of these definitions (<assets_dir>/sources): the ones ingest read."""
        return self.assets_path / "sources"

    @property
    def expectations_path(self) -> Path:
        return Path(self.expectations_dir).resolve() if self.expectations_dir else settings().expectations_dir

    def profile(self) -> ModelProfile:
        s = settings()
        return resolve_profile(
            self.model or s.model, self.assets_path / "models", self.tokenizer or s.tokenizer_override
        )


class SGLangFleet(dg.ConfigurableResource):
    """The SGLang endpoints (or one sglang-router) that serve the target model."""

    urls: str | None = None  # comma-separated; default EAGLE3_SGLANG_URL
    max_in_flight: int | None = None  # default: from /server_info
    model_revision: str | None = None  # default: from /model_info
    regen_seed: int | None = None  # bump to regenerate every sample
    probe_seed: int | None = None  # bump to regenerate the probe sets only (role: probe, docs/probes.md)
    # Client read timeout per request. Default 3600 s: a disconnect aborts the GPU work, so it
    # should only fire on a server that is truly stuck (long reasoning answers take minutes).
    read_timeout_s: float | None = None
    max_retries: int | None = None  # per request, on 5xx/reset/timeout (default 6)
    # One bounded wait for a routable endpoint per graph run, not per shard (generate/run_wait.py; default
    # EAGLE3_ENDPOINT_WAIT_S, else 600 s).
    wait_for_endpoint_s: float | None = None
    stream: bool | None = None  # SSE with stall detection (default EAGLE3_STREAM, else on)
    stall_timeout_s: float | None = None  # silence between chunks = stall (default EAGLE3_STALL_TIMEOUT_S, else 300)
    # prompt + max_new_tokens over the server's context: "fit" or "skip" (default EAGLE3_CONTEXT_OVERFLOW, else fit)
    context_overflow: str | None = None

    def endpoints(self) -> Endpoints:
        """The run's URLs: its `urls` text parsed (once, here), else the deployment's parsed EAGLE3_SGLANG_URL."""
        if self.urls:
            return parse_endpoint_urls(self.urls, source="sglang resource `urls`")
        return settings().sglang_urls

    def generation_fields(self) -> dict[str, Any]:
        """The GenerationConfig fields this resource sets (same names); None: the deployment's setting, else the
        profile's / GenerationConfig's default (generate.config.generation_config applies them)."""
        return {
            "max_in_flight": self.max_in_flight,
            "model_revision": self.model_revision or None,  # "" in the launchpad: from /model_info
            "regen_seed": self.regen_seed,
            "probe_seed": self.probe_seed,
            "read_timeout_s": self.read_timeout_s,
            "max_retries": self.max_retries,
            "wait_for_endpoint_s": self.wait_for_endpoint_s,
            "stream": self.stream,
            "stall_timeout_s": self.stall_timeout_s,
            "context_overflow": self.context_overflow,
        }


def _data_dir_value(s: Settings) -> str:
    """EAGLE3_DATA_DIR as a resource value: the local path, or the URI as configured (with its query)."""
    return str(s.data_dir.local_path) if s.data_dir.is_local else s.data_dir.root.uri


def _urls_value(s: Settings) -> str | None:
    """EAGLE3_SGLANG_URL as a resource value; None (the step reads the setting itself) when a URL carries
    user:password: resource values are run config, stored in the event log for anyone to read."""
    if not s.sglang_url_configured or any(has_credentials(u) for u in s.sglang_urls):
        return None
    return s.sglang_urls.as_text()


def resources_from_settings(s: Settings) -> dict[str, dg.ConfigurableResource]:
    """The `pipeline` and `sglang` resources with the deployment's settings bound (the one place).

    `sglang.urls` is bound only when EAGLE3_SGLANG_URL is set: otherwise it stays None and the run
    uses the default URL or the simulator `eagle3 demo` / `eagle3 ui` start after definitions load.
    """
    return {
        "pipeline": PipelineSettings(
            data_dir=_data_dir_value(s),
            work_dir=str(s.work_dir),
            assets_dir=str(s.assets_dir),
            expectations_dir=str(s.expectations_dir),
            model=s.model,
            tokenizer=s.tokenizer_override,
        ),
        "sglang": SGLangFleet(
            urls=_urls_value(s),
            wait_for_endpoint_s=s.endpoint_wait_s,
            stream=s.stream,
            stall_timeout_s=s.stall_timeout_s,
        ),
    }


_RENDERERS: dict[str, object] = {}


def cached_renderer(profile: ModelProfile):
    """One renderer (and one 19 MB tokenizer load) per profile per process."""
    from ..tokenize import PromptRenderer

    key = f"{profile.fingerprint()}:{profile.tokenizer}"
    if key not in _RENDERERS:
        _RENDERERS[key] = PromptRenderer(profile)
    return _RENDERERS[key]
