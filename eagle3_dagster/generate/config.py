"""What a generation run sends, and the keys that make reruns incremental.

`sampling_params` is the single source of the request's sampling dict; `sampling_hash` hashes
exactly that dict, so anything that changes what the server generates changes the sample ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..config import FleetSettings, Settings, StageSettings
from ..profiles import ModelProfile
from ..secret import Secret
from ..urls import Endpoints, credentials_conflict, parse_endpoint_urls
from .run_wait import EndpointWaitRecord
from .served_model import ExpectedModel

# The defaults of the fields a deployment sets come from the settings' declarations (config.py): one home each.
_FLEET = FleetSettings()
_STAGES = StageSettings()


@dataclass(frozen=True)
class GenerationConfig:
    endpoints: Endpoints
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int = -1
    min_p: float = 0.0
    min_new_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    max_in_flight: int | None = (
        None  # None -> sum over endpoints of /server_info max_running_requests + headroom, else 64
    )
    read_timeout_s: float = 3600.0  # long: a client disconnect aborts the GPU work server-side
    max_retries: int = 6
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    flush_every_n: int = 256
    flush_every_s: float = 10.0
    regen_seed: int | None = None
    model_revision: str | None = None  # None -> from /model_info (model_path @ weight_version)
    # The NAME of the variable the settings layer read the key from (for messages); the key itself is
    # `api_key`, a Secret handed over by the caller (generation_config), never printed or hashed.
    api_key_env: str = "SGLANG_API_KEY"
    # --- deeper knobs (keyword-only extensions; defaults suit a real fleet) ---
    vocab_size: int | None = None  # validate prompt ids client-side: the server does not
    in_flight_headroom: int = 128  # per endpoint, on top of max_running_requests (spec §8)
    connect_timeout_s: float = 10.0
    health_timeout_s: float = 10.0
    health_interval_s: float = 5.0  # re-check routable endpoints (a draining server answers /health 503)
    probe_interval_s: float = 1.0  # how often unroutable / circuit-open endpoints are probed back in
    breaker_threshold: int = 5  # consecutive failures that take an endpoint out (request_errors.counts_against_circuit)
    breaker_cooldown_s: float = 1.0  # first open period; doubles on each re-open up to backoff_max_s
    # One bounded wait for a routable endpoint per step (Dagster step retries are not used for it; with
    # `endpoint_wait`, one per graph run):
    # every endpoint's state is logged at once and every 25 s, then the step fails naming them all.
    wait_for_endpoint_s: float = _FLEET.wait_for_endpoint_s
    # Streaming (SSE): silence between chunks longer than stall_timeout_s means the request is stuck
    # (or a proxy dropped it): it is aborted and retried with a new rid. Queued requests send nothing,
    # so the first chunk gets its own, generous limit. stream_interval: tokens per chunk (None: about
    # 4 chunks per sample, 16..2048 tokens); each cumulative chunk carries all ids so far, so fewer
    # chunks keep the client's CPU near the non-streamed path (bench/generate.py stream_cpu_ratio_8k).
    # stall_timeout_s must exceed
    # stream_interval x the slowest per-request token time of the fleet.
    stream: bool = _FLEET.stream
    stall_timeout_s: float = _FLEET.stall_timeout_s
    first_chunk_timeout_s: float = 1800.0
    stream_interval: int | None = None
    # The whole request (every attempt, its queueing, its backoff) ends by this many seconds: a server that
    # trickles a byte every few seconds and never finishes defeats every per-read and stall timeout; the
    # sample then fails with reason request_deadline (the next run sends it again). Long reasoning answers
    # take many minutes (first_chunk_timeout_s of queueing plus the decode), so the default is generous.
    request_deadline_s: float = _FLEET.request_deadline_s
    allow_old_server: bool = _FLEET.allow_old_server  # /server_info version < 0.5.9 is refused unless this is set
    write_retries: int = 3
    # a prompt whose prompt + max_new_tokens exceeds the server's context length (generate/context_fit.py):
    # "fit" sends it with max_new_tokens lowered to what fits, "skip" records a context_overflow failure
    context_overflow: str = _FLEET.context_overflow
    # role: probe sources (docs/probes.md): their samples' keys carry the fleet's drafter and probe_seed
    probe_sources: tuple[str, ...] = ()
    probe_seed: int | None = None  # bump to regenerate the probe sets only (same drafter)
    # the drafter key of the newest stored probe results (probe_results.stored_drafter_key): a run whose
    # endpoints do not answer keys the probe prompts with it, as `eagle3 plan` does (cached_only.py)
    stored_probe_drafter: str | None = field(default=None, compare=False)
    retry_permanent_errors: bool = False  # resend samples an earlier run recorded as 400 / bad prompt
    connections_per_client: int = 8  # workers per httpx pool (httpcore's pool scan is O(pool size))
    # After a successful run with more than this many chunk files in the shard folder, merge them into
    # one (store.ShardStore.compact; crash-safe). None: never compact (the setting's 0).
    compact_after_chunks: int | None = _STAGES.compact_after_chunks or None
    # The graph run's shared endpoint wait (run_wait.py): when one shard's wait ran out, the run's other
    # shards fail at once with its line. None: each shard waits on its own (a plain generate_shard call).
    endpoint_wait: EndpointWaitRecord | None = field(default=None, compare=False)
    # What every endpoint must serve (served_model.py): the profile's model (from_profile sets it), the user's
    # pin (EAGLE3_SERVED_MODEL) in served_model_pin. None and None: not judged (a config built without a profile).
    expected_model: ExpectedModel | None = None
    served_model_pin: str | None = None
    api_key: Secret | None = field(default=None, repr=False, compare=False)  # Bearer key; None: no Authorization

    def __post_init__(self) -> None:
        eps = parse_endpoint_urls(self.endpoints, source="GenerationConfig.endpoints")
        if not eps:
            raise ValueError("GenerationConfig.endpoints is empty: set EAGLE3_SGLANG_URL or pass endpoints")
        object.__setattr__(self, "endpoints", eps)
        conflict = credentials_conflict(eps, "the endpoint URLs (EAGLE3_SGLANG_URL / sglang resource `urls`)")
        if self.api_key is not None and conflict:
            raise ValueError(conflict)
        object.__setattr__(self, "stop_token_ids", tuple(int(x) for x in self.stop_token_ids))
        if self.max_new_tokens is None or int(self.max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be an explicit positive int, got {self.max_new_tokens!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.flush_every_n < 1:
            raise ValueError(f"flush_every_n must be >= 1, got {self.flush_every_n}")
        if not self.request_deadline_s > 0:
            raise ValueError(f"request_deadline_s must be > 0, got {self.request_deadline_s}")
        if self.stall_timeout_s <= 0 or self.first_chunk_timeout_s <= 0:
            raise ValueError("stall_timeout_s and first_chunk_timeout_s must be > 0")
        if self.stream_interval is not None and self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1 (or None: automatic), got {self.stream_interval}")
        if self.context_overflow not in ("fit", "skip"):
            raise ValueError(f"context_overflow must be 'fit' or 'skip', got {self.context_overflow!r}")
        if self.compact_after_chunks is not None and self.compact_after_chunks < 1:
            raise ValueError(f"compact_after_chunks must be >= 1 (or None: never), got {self.compact_after_chunks}")

    @classmethod
    def from_profile(cls, profile: ModelProfile, endpoints: Iterable[str] | str, **overrides: Any) -> GenerationConfig:
        """Sampling and stop ids from the model profile, then `overrides`; `endpoints` (Endpoints, a comma-separated
        string or URLs) as given: there is no global fallback. A run's config comes from `generation_config`."""
        eps = parse_endpoint_urls(endpoints, source="GenerationConfig endpoints")
        s = profile.sampling
        base: dict[str, Any] = dict(
            endpoints=eps,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            min_new_tokens=s.min_new_tokens,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            repetition_penalty=s.repetition_penalty,
            ignore_eos=s.ignore_eos,
            stop_token_ids=tuple(profile.stop_token_ids),
            vocab_size=profile.vocab_size,
            expected_model=ExpectedModel.of(profile),
        )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown GenerationConfig field(s): {', '.join(unknown)}")
        base.update(overrides)
        return cls(**base)

    def with_(self, **changes: Any) -> GenerationConfig:
        return replace(self, **changes)

    def effective_stream_interval(self) -> int:
        if self.stream_interval is not None:
            return int(self.stream_interval)
        return max(16, min(2048, -(-int(self.max_new_tokens) // 4)))

    def served_model_expectation(self) -> ExpectedModel | None:
        """What the endpoints must serve: the profile's model with the user's pin, or None (not judged)."""
        if self.expected_model is not None:
            return self.expected_model.with_pin(self.served_model_pin)
        if self.served_model_pin:
            return ExpectedModel("(no profile)").with_pin(self.served_model_pin)
        return None


# The GenerationConfig fields a deployment sets with no per-run resource field: the definitions hand them over.
def deployment_fields(s: Settings) -> dict[str, Any]:
    """The settings-only fields of `s` (EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS=0 is None: never compact; no key
    is no field: no Authorization header)."""
    out: dict[str, Any] = {
        "allow_old_server": s.fleet.allow_old_server,
        "served_model_pin": s.model.served_model,
        "request_deadline_s": s.fleet.request_deadline_s,
        "compact_after_chunks": s.stages.compact_after_chunks or None,
    }
    if s.fleet.api_key is not None:
        out["api_key"] = s.fleet.api_key
    return out


def fleet_run_fields(s: Settings) -> dict[str, Any]:
    """The settings' values of the fields a run's `sglang` resource sets (same names): what the definitions bind
    into the resource (orchestration/resources.sglang_resource), and what a command that runs without one
    (`eagle3 plan`, `eagle3 drafters compare`) generates with."""
    f = s.fleet
    return {
        "wait_for_endpoint_s": f.wait_for_endpoint_s,
        "stream": f.stream,
        "stall_timeout_s": f.stall_timeout_s,
        "context_overflow": f.context_overflow,
    }


def generation_config(
    profile: ModelProfile,
    endpoints: Endpoints | Iterable[str] | str,
    settings: Settings,
    run: Mapping[str, Any],
    **run_only: Any,
) -> GenerationConfig:
    """The GenerationConfig of one run, the one factory. Each field has one route:
    the profile (sampling, stop ids, vocab size); the settings the definitions were built from for the fields no
    resource has (`deployment_fields`); the run's resource values (`run`: the `sglang` / `pipeline` fields, bound
    from the same settings and overridable in the run's config; None = the field's own None: from /server_info,
    /model_info, no seed, the profile's budget), over the settings' values of the fleet's fields
    (`fleet_run_fields`: a command without a resource); `run_only` (values of this run alone: probe sources, the
    graph run's endpoint wait). A field given by two routes is a TypeError."""
    deployment = deployment_fields(settings)
    given = {**fleet_run_fields(settings), **{k: v for k, v in run.items() if v is not None}}
    routes = [set(deployment), set(run), set(run_only)]
    twice = sorted(n for i, a in enumerate(routes) for b in routes[i + 1 :] for n in a & b)
    if twice:
        raise TypeError(f"GenerationConfig field(s) given by two routes: {', '.join(twice)}")
    return GenerationConfig.from_profile(profile, endpoints, **deployment, **{**given, **run_only})


def sampling_params(config: GenerationConfig) -> dict[str, Any]:
    """The exact `sampling_params` sent with every request.

    max_new_tokens is always explicit (the native default of 128 truncates reasoning); the two
    special-token flags only affect `text`, which we keep for reference, never `output_ids`.
    Every field that changes the distribution is sent, from the profile, so the server's
    `--preferred-sampling-params` cannot change it unseen (a server default for a field not sent
    here refuses the endpoint: endpoints.DISTRIBUTION_KEYS). Only keys the sglang-router forwards
    are used, except spaces_between_special_tokens, which a router drops silently and which again
    only touches `text`. `stream_interval` is added per request when streaming (not hashed: it
    does not change what is generated).
    """
    p: dict[str, Any] = {
        "max_new_tokens": int(config.max_new_tokens),
        "temperature": float(config.temperature),
        "top_p": float(config.top_p),
        "top_k": int(config.top_k),
        "min_p": float(config.min_p),
        "min_new_tokens": int(config.min_new_tokens),
        "frequency_penalty": float(config.frequency_penalty),
        "presence_penalty": float(config.presence_penalty),
        "repetition_penalty": float(config.repetition_penalty),
        "ignore_eos": bool(config.ignore_eos),
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    if config.stop_token_ids:
        p["stop_token_ids"] = [int(x) for x in config.stop_token_ids]
    return p


def sampling_hash(config: GenerationConfig) -> str:
    return params_hash(sampling_params(config))


def params_hash(params: dict[str, Any]) -> str:
    """The sampling hash of exact `sampling_params` (a context-fitted row's has its lowered max_new_tokens)."""
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sample_key(
    prompt_id: str,
    model_revision: str,
    template_hash: str,
    sampling_hash: str,
    regen_seed: int | None,
    probe: str | None = None,
) -> str:
    """sample_id: changes exactly when the prompt, weights, template, sampling or the regen seed change,
    and for a probe prompt (`probe`: probes.ProbeKeys.tag) when the fleet's drafter or the probe seed does."""
    parts: list[object] = [prompt_id, model_revision, template_hash, sampling_hash, regen_seed]
    if probe is not None:  # absent for training prompts: their keys stay what they always were
        parts.append(probe)
    blob = json.dumps(parts, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
