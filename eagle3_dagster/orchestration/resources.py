"""Resource types: where the pipeline reads and writes, which model profile, which SGLang fleet.

Every field has a concrete default: the setting's declared default (config.py) or the GenerationConfig
field's, or a None that is a value of its own (no tokenizer override: the profile's; no max_in_flight: from
/server_info; no regen seed). The definitions bind them ONCE, from the settings they are built from
(`resources_from_settings`, called by eagle3_dagster/defs/common/resources.py): each resource is an
instance of a class whose field defaults ARE those values (`bound`), so the launchpad shows the
deployment's values, a run's config can override any field, and the fields it does not name keep the
deployment's values (Dagster 1.13 rebuilds an overridden resource from its class defaults, not from the
bound instance: tests/pipeline/test_run_config_overrides.py proves each field). Nothing here reads the
settings at run time. The SGLang API key is never a field: the settings module reads SGLANG_API_KEY and
the definitions hand it to GenerationConfig as a masked Secret, so it cannot leak into run config or
metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import dagster as dg
import pydantic

from ..config import WORK_DIR_ENV, ModelSettings, Settings, StorageSettings, work_dir_for
from ..generate.config import GenerationConfig, fleet_run_fields
from ..profiles import ModelProfile, resolve_profile
from ..quality.request_failures import DEFAULT_MAX_FAILED_RATE
from ..storage import DataPath, data_root
from ..urls import Endpoints, has_credentials, parse_endpoint_urls

_STORAGE = StorageSettings()
_MODEL = ModelSettings()


def _generation_default(name: str) -> Any:
    """GenerationConfig's default of `name` (the settings' declared default where a setting declares one)."""
    return GenerationConfig.__dataclass_fields__[name].default


class PipelineSettings(dg.ConfigurableResource):
    # A local path or a URI: file://, s3://bucket/prefix?endpoint_override=...&region=..., gs://, or any
    # fsspec protocol. Never put credentials here (they are refused): they come from the environment.
    data_dir: str = str(_STORAGE.data_dir.local_path)
    # Local scratch for the GX file context / Data Docs and shard locks; None: follows the data dir
    # (config.work_dir_for).
    work_dir: str | None = None
    assets_dir: str = str(_STORAGE.assets_dir)
    expectations_dir: str = str(_STORAGE.expectations_dir)
    model: str = _MODEL.name
    tokenizer: str | None = None  # None: the profile's own tokenizer
    max_new_tokens: int | None = None  # None: the profile's
    # A generations shard whose permanently failed requests exceed this fraction of its requests fails its
    # request_failure_budget check (and is left out of snapshots); any failure within it is a warning.
    max_failed_rate: float = DEFAULT_MAX_FAILED_RATE

    @property
    def data_path(self) -> DataPath:
        if "://" in self.data_dir:
            return data_root(self.data_dir)
        return data_root(Path(self.data_dir).expanduser().resolve())

    @property
    def work_path(self) -> Path:
        return work_dir_for(self.data_path, Path(self.work_dir).expanduser().resolve() if self.work_dir else None)

    @property
    def gx_context_dir(self) -> Path:
        """The GX file context (suites, validation results, Data Docs): always local."""
        return self.work_path / "gx"

    @property
    def assets_path(self) -> Path:
        return Path(self.assets_dir).expanduser().resolve()

    @property
    def sources_path(self) -> Path:
        """The prompt-source YAMLs of these definitions (<assets_dir>/sources): the ones ingest read."""
        return self.assets_path / "sources"

    @property
    def expectations_path(self) -> Path:
        return Path(self.expectations_dir).expanduser().resolve()

    def profile(self) -> ModelProfile:
        return resolve_profile(self.model, self.assets_path / "models", self.tokenizer)


class SGLangFleet(dg.ConfigurableResource):
    """The SGLang endpoints (or one sglang-router) that serve the target model."""

    # comma-separated; None: the endpoints the definitions were handed (EAGLE3_SGLANG_URL when it carries a
    # user:password, which is never put in run config)
    urls: str | None = None
    max_in_flight: int | None = None  # None: from /server_info
    model_revision: str | None = None  # None: from /model_info
    regen_seed: int | None = None  # bump to regenerate every sample
    probe_seed: int | None = None  # bump to regenerate the probe sets only (role: probe, docs/probes.md)
    # Client read timeout per request: a disconnect aborts the GPU work, so it should only fire on a server
    # that is truly stuck (long reasoning answers take minutes).
    read_timeout_s: float = _generation_default("read_timeout_s")
    max_retries: int = _generation_default("max_retries")  # per request, on 5xx/reset/timeout
    # One bounded wait for a routable endpoint per graph run, not per shard (generate/run_wait.py).
    wait_for_endpoint_s: float = _generation_default("wait_for_endpoint_s")
    stream: bool = _generation_default("stream")  # SSE with stall detection
    stall_timeout_s: float = _generation_default("stall_timeout_s")  # silence between chunks = stall
    # a prompt whose prompt + max_new_tokens exceeds the server's context: "fit" or "skip"
    context_overflow: str = _generation_default("context_overflow")

    def endpoints(self, handed: Endpoints) -> Endpoints:
        """The run's URLs: its `urls` text parsed (once, here), else `handed`: the endpoints the definitions were
        built with (settings' `fleet.urls`)."""
        if self.urls:
            return parse_endpoint_urls(self.urls, source="sglang resource `urls`")
        return handed

    def generation_fields(self) -> dict[str, Any]:
        """The GenerationConfig fields this resource sets (same names; None: the field's own None)."""
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


R = TypeVar("R", bound=dg.ConfigurableResource)


def bound(resource: type[R], **values: Any) -> R:
    """A `resource` whose field defaults are `values`: a subclass of the same name with those defaults, instantiated.

    Dagster rebuilds a resource whose run config names some of its fields from the CLASS defaults of the others,
    not from the values an instance was bound with; binding the values as the class defaults keeps the fields a
    run config does not name at the deployment's values (and shows them in the launchpad)."""
    unknown = sorted(set(values) - set(resource.model_fields))
    if unknown:
        raise TypeError(f"{resource.__name__} has no field(s) {', '.join(unknown)}")
    defaults: dict[str, Any] = {
        name: (resource.model_fields[name].annotation, pydantic.Field(default=value)) for name, value in values.items()
    }
    cls = pydantic.create_model(
        resource.__name__, __base__=resource, __module__=resource.__module__, __doc__=resource.__doc__, **defaults
    )
    return cls()


def _data_dir_value(s: Settings) -> str:
    """EAGLE3_DATA_DIR as a resource value: the local path, or the URI as configured (with its query)."""
    data = s.storage.data_dir
    return str(data.local_path) if data.is_local else data.root.uri


def _urls_value(s: Settings) -> str | None:
    """EAGLE3_SGLANG_URL as a resource value; None (the definitions hand the step the parsed endpoints) when a URL
    carries user:password: resource values are run config, stored in the event log for anyone to read."""
    if any(has_credentials(u) for u in s.fleet.urls):
        return None
    return s.fleet.urls.as_text()


def pipeline_resource(s: Settings, **overrides: Any) -> PipelineSettings:
    """The `pipeline` resource bound with the values of `s` (then `overrides`)."""
    values: dict[str, Any] = dict(
        data_dir=_data_dir_value(s),
        # EAGLE3_WORK_DIR when set; else None: the work dir follows the data dir (a run config's too)
        work_dir=str(s.storage.work_dir) if WORK_DIR_ENV in s.configured else None,
        assets_dir=str(s.storage.assets_dir),
        expectations_dir=str(s.storage.expectations_dir),
        model=s.model.name,
        tokenizer=s.model.tokenizer_override,
    )
    return bound(PipelineSettings, **{**values, **overrides})


def sglang_resource(s: Settings, **overrides: Any) -> SGLangFleet:
    """The `sglang` resource bound with the values of `s` (then `overrides`: the demo's simulator URL, its short
    endpoint wait)."""
    return bound(SGLangFleet, **{"urls": _urls_value(s), **fleet_run_fields(s), **overrides})


def resources_from_settings(s: Settings) -> dict[str, dg.ConfigurableResource]:
    """The `pipeline` and `sglang` resources with the settings `s` bound (the one place)."""
    return {"pipeline": pipeline_resource(s), "sglang": sglang_resource(s)}


_RENDERERS: dict[str, object] = {}


def cached_renderer(profile: ModelProfile):
    """One renderer (and one 19 MB tokenizer load) per profile per process."""
    from ..tokenize import PromptRenderer

    key = f"{profile.fingerprint()}:{profile.tokenizer}"
    if key not in _RENDERERS:
        _RENDERERS[key] = PromptRenderer(profile)
    return _RENDERERS[key]
