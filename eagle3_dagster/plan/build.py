"""The plan of one run, assembled: exact counts (counts.py), estimates (estimate.py), the fleet.

`build_plan(...)` returns a `Plan`; `plan_table(plan)` is the short human table and
`plan.as_dict()` the JSON written to data/plan/plan.json (PLAN_FILE) and wherever `--json` says.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..generate.config import GenerationConfig, sampling_hash, sampling_params
from ..generate.context_fit import ContextBudget
from ..generate.fleet_capacity import EndpointCapacity, probe_fleet, served_model_problems, served_model_warnings
from ..generate.probe_results import stored_drafter_key
from ..generate.probes import fleet_drafter_key
from ..ingest import SourceSpec
from ..profiles import ModelProfile
from ..storage import DataPath
from ..tokenize import PromptRenderer
from .counts import (
    CacheCounts,
    PlanKeys,
    PromptCounts,
    TokenizedRows,
    count_cached,
    count_prompts,
    remove_scratch,
    scratch_dir,
    stored_revision,
    tokenize_for_plan,
)
from .estimate import (
    DiskEstimate,
    FleetEstimate,
    OutputExpectation,
    as_jsonable,
    disk_estimate,
    fleet_estimate,
    human_bytes,
    human_duration,
    output_expectation,
)
from .probe import EndpointProbe, ProbeSize, ServedModelError, probe_endpoints, tokens_per_s_per_server

PLAN_FILE = "plan/plan.json"  # under the data dir


@dataclass
class Fleet:
    """What the plan is told or measures about the fleet."""

    tokens_per_s_per_server: float | None = None  # declared; None: probe the endpoints
    servers: int | None = None  # None: the number of endpoints
    gpus_per_server: int = 8
    probe_requests: int = 8
    probe_max_new_tokens: int = 128
    throughput_basis: str = "declared (--tokens-per-s-per-server)"  # what a given throughput comes from


@dataclass
class Plan:
    created_at: str
    profile: str
    tokenizer_fingerprint: str
    template_hash: str
    max_new_tokens: int
    n_shards: int
    sources: int
    records_read: int
    prompts: int  # after rejects, dedupe and sampling (= the prompts asset's rows)
    rejected: int
    duplicates: int
    sampled_out: int
    prompts_by_source: dict[str, int]
    tokenized: int  # prompts that tokenize (= tokenized_prompts rows)
    tokenize_rejects: dict[str, int]
    prompt_tokens: int  # exact: sum of prompt_len over tokenized_prompts
    requests: int  # distinct cache keys
    requests_cached: int  # already generated with this revision, template and sampling
    requests_failed_before: int  # failed permanently in an earlier run: not sent again
    requests_to_send: int
    prompt_tokens_to_send: int
    model_revision: str | None
    revision_basis: str
    expected_output_tokens: float  # of the requests to send
    expected_output_tokens_all: float  # of every request (the training tables hold them all)
    output_basis: str
    output_mean_per_request: float
    fleet: dict[str, Any]
    disk: dict[str, Any]
    probe: list[dict[str, Any]] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # the probed endpoints' /server_info context_length (None: not probed or not reported) and, of the
    # requests to send, those over it: prompt + max_new_tokens > it (fitted: sent with max_new_tokens lowered,
    # or skipped: context_overflow, per EAGLE3_CONTEXT_OVERFLOW), the prompt alone >= it (not sent)
    server_context_length: int | None = None
    requests_context_fitted: int = 0
    requests_context_skipped: int = 0
    requests_too_long_for_server: int = 0
    # the fleet's drafter a probe prompt's cache key holds (generate/probes.py), where it comes from, and the
    # `role: probe` sources whose prompts carry it (none: every key is a training key)
    drafter_key: str | None = None
    drafter_basis: str = "no probe source"
    probe_sources: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return as_jsonable(asdict(self))


@dataclass(frozen=True)
class PlanModel:
    """The model a planned run generates with: its profile, the renderer of its chat template, the generation
    config (endpoints, max_new_tokens, context policy), the revision given (None: probed or stored)."""

    profile: ModelProfile
    renderer: PromptRenderer
    config: GenerationConfig
    model_revision: str | None = None


@dataclass(frozen=True)
class PlanDirs:
    """Where a plan reads the store (`data`: what is already answered) and keeps its scratch (`work_dir`)."""

    data: DataPath
    work_dir: Path


def build_plan(
    specs: Sequence[SourceSpec],
    *,
    dirs: PlanDirs,
    model: PlanModel,
    n_shards: int,
    control_text: Mapping[str, str],
    fleet: Fleet,
    now: dt.datetime | None = None,
) -> Plan:
    """Count and estimate one run from the declared sources; nothing is generated (except the probe's
    few requests when no throughput is declared)."""
    data, config, profile = dirs.data, model.config, model.profile
    max_new = int(config.max_new_tokens)
    assumptions: list[str] = []
    scratch = scratch_dir(dirs.work_dir / "plan")
    try:
        prompt_counts, prompts_path = count_prompts(specs, n_shards=n_shards, scratch=scratch)
        rows = tokenize_for_plan(prompts_path, model.renderer, max_new_tokens=max_new, control_text=control_text)
    finally:
        remove_scratch(scratch)
    warnings = [
        f"source {name!r} yields no prompt: its source__{name} step will fail the run"
        for name in prompt_counts.empty_sources
    ]
    capacity, probes = _probe_fleet(config, fleet, rows)
    warnings += served_model_warnings(capacity, config.served_model_expectation())
    revision, revision_basis = _revision(model.model_revision, config, probes, data, n_shards)
    if revision is None:
        assumptions.append(
            "no model revision known (none given, no endpoint probed, nothing stored): every request counts as "
            "to be sent"
        )
    known = [p.context_length for p in probes]
    server_ctx = min(c for c in known if c is not None) if known and None not in known else None
    budget = ContextBudget.of(config, server_ctx)
    keys, drafter_basis = _plan_keys(
        specs, config, revision, capacity, data, budget if server_ctx is not None else None
    )
    assumptions += _drafter_assumptions(keys, drafter_basis)
    cache = count_cached(rows.frame, data, keys, retry_permanent_errors=config.retry_permanent_errors)
    expect = output_expectation(data, max_new)
    assumptions.append(_output_assumption(expect, max_new))
    fit = fit_to_context(cache.send, expect, server_ctx=server_ctx, fit_mode=budget.mode == "fit", max_new=max_new)
    assumptions += fit.assumptions
    all_out = expect.expected(rows.frame["source"])
    fleet_fields, estimate_assumptions = _fleet_estimate(fleet, capacity, probes, config, fit.new_output_tokens)
    assumptions += estimate_assumptions
    return Plan(
        created_at=(now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"),
        profile=profile.name,
        max_new_tokens=max_new,
        n_shards=n_shards,
        sources=len(specs),
        **_count_fields(prompt_counts, rows, cache),
        model_revision=revision,
        revision_basis=revision_basis,
        expected_output_tokens=fit.new_output_tokens,
        expected_output_tokens_all=all_out,
        output_basis=expect.basis,
        output_mean_per_request=expect.overall_mean,
        fleet=fleet_fields,
        disk=_disk_fields(data, rows.prompt_tokens, fit.new_output_tokens, all_out),
        probe=[{**asdict(p), "tokens_per_s": p.tokens_per_s} for p in probes],
        assumptions=assumptions,
        warnings=warnings,
        server_context_length=server_ctx,
        requests_context_fitted=fit.fitted,
        requests_context_skipped=fit.skipped,
        requests_too_long_for_server=fit.too_long,
        drafter_key=keys.drafter_key,
        drafter_basis=drafter_basis,
        probe_sources=sorted(keys.probe_sources),
    )


def _fleet_estimate(
    fleet: Fleet,
    capacity: list[EndpointCapacity],
    probes: list[EndpointProbe],
    config: GenerationConfig,
    new_output_tokens: float,
) -> tuple[dict[str, Any], list[str]]:
    """The plan's fleet (time) estimate, and what it assumes."""
    tps, basis, throughput_assumptions = _throughput(fleet, probes)
    servers, server_assumptions = _servers(fleet, capacity, config)
    est: FleetEstimate = fleet_estimate(new_output_tokens, tps, servers, fleet.gpus_per_server, basis)
    assumptions = [
        *throughput_assumptions,
        *server_assumptions,
        "time counts output tokens only (prefill is inside the measured or declared tokens/s)",
    ]
    return {**asdict(est), "eta": human_duration(est.eta_s)}, assumptions


def _disk_fields(
    data: DataPath, prompt_tokens: int, new_output_tokens: float, all_output_tokens: float
) -> dict[str, Any]:
    """The plan's disk estimate."""
    disk: DiskEstimate = disk_estimate(
        data, prompt_tokens=prompt_tokens, new_output_tokens=new_output_tokens, all_output_tokens=all_output_tokens
    )
    return {
        "bytes": disk.bytes,
        "total_bytes": disk.total,
        "bytes_per_token": disk.bytes_per_token,
        "basis": disk.basis,
    }


def _count_fields(prompt_counts: PromptCounts, rows: TokenizedRows, cache: CacheCounts) -> dict[str, Any]:
    """The plan's exact counts: the prompts read, tokenized and already answered."""
    return {
        "tokenizer_fingerprint": rows.tokenizer_fingerprint,
        "template_hash": rows.template_hash,
        "records_read": prompt_counts.read,
        "prompts": prompt_counts.prompts,
        "rejected": prompt_counts.rejected,
        "duplicates": prompt_counts.duplicates,
        "sampled_out": prompt_counts.sampled_out,
        "prompts_by_source": prompt_counts.prompts_by_source,
        "tokenized": rows.frame.height,
        "tokenize_rejects": rows.rejects_by_reason,
        "prompt_tokens": rows.prompt_tokens,
        "requests": cache.requested,
        "requests_cached": cache.cached,
        "requests_failed_before": cache.failed_before,
        "requests_to_send": cache.to_send,
        "prompt_tokens_to_send": int(cache.send["prompt_len"].sum()) if cache.to_send else 0,
    }


def _probe_fleet(
    config: GenerationConfig, fleet: Fleet, rows: TokenizedRows
) -> tuple[list[EndpointCapacity], list[EndpointProbe]]:
    """What the plan asks the fleet: its servers unless declared (a router's workers are the servers), and a
    few timed requests unless the throughput is declared. A fleet it asks must serve the run's model (each
    server's, or router worker's, /model_info, as the run judges it): ServedModelError before any request."""
    api_key = config.api_key.reveal() if config.api_key is not None else None
    capacity: list[EndpointCapacity] = []
    if fleet.servers is None or fleet.tokens_per_s_per_server is None:
        capacity = probe_fleet(config.endpoints, headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
    refused = served_model_problems(capacity, config.served_model_expectation())
    if refused:
        raise ServedModelError(refused)
    if fleet.tokens_per_s_per_server is not None:
        return capacity, []
    probes = probe_endpoints(
        config.endpoints,
        rows.probe_ids,
        sampling_params(config),
        size=ProbeSize(requests=fleet.probe_requests, max_new_tokens=fleet.probe_max_new_tokens),
        api_key=api_key,
        servers=[c.servers for c in capacity],
    )
    return capacity, probes


def _output_assumption(expect: OutputExpectation, max_new: int) -> str:
    if expect.basis == "max_new_tokens":
        return f"no published snapshot: every answer is assumed to run to max_new_tokens ({max_new:,}), an upper bound"
    return (
        f"output tokens per request as in {expect.basis} ({expect.snapshot_rows:,} samples, mean "
        f"{expect.overall_mean:,.0f} per request; per source where the snapshot has the source)"
    )


@dataclass
class ContextFit:
    """The requests to send measured against the server's context length."""

    new_output_tokens: float
    fitted: int = 0  # sent with max_new_tokens lowered to fit
    skipped: int = 0  # not sent: prompt + max_new_tokens overflow and the budget does not fit
    too_long: int = 0  # not sent: the prompt alone fills the context
    assumptions: list[str] = field(default_factory=list)


def fit_to_context(
    send: pl.DataFrame, expect: OutputExpectation, *, server_ctx: int | None, fit_mode: bool, max_new: int
) -> ContextFit:
    """The output tokens the requests to send (`send`: source, prompt_len) are expected to produce, each capped
    by what the server's context leaves it (0 when it is not sent), and how many are fitted or not sent."""
    if server_ctx is None:
        return ContextFit(
            expect.expected(send["source"]),
            assumptions=[
                "the server's context length is not known (not probed): every request counts at max_new_tokens"
            ],
        )
    lens = send["prompt_len"]
    too_long = lens >= server_ctx
    over = (lens < server_ctx) & (lens + max_new > server_ctx)
    fitted = over if fit_mode else pl.repeat(False, over.len(), eager=True)
    skipped = over & ~fitted
    caps = pl.when(too_long | skipped).then(0).when(fitted).then(server_ctx - lens).otherwise(max_new).alias("cap")
    fit = ContextFit(
        expect.expected_capped(send["source"], send.select(caps)["cap"]),
        int(fitted.sum()),
        int(skipped.sum()),
        int(too_long.sum()),
    )
    if fit.fitted or fit.skipped or fit.too_long:
        fit.assumptions.append(
            f"the server's context length is {server_ctx:,} (/server_info): {fit.fitted:,} request(s) sent with "
            f"max_new_tokens lowered to fit, {fit.skipped:,} not sent (context_overflow), {fit.too_long:,} prompt(s) "
            "at least that long not sent (prompt_too_long_for_server)"
        )
    return fit


def _throughput(fleet: Fleet, probes: list[EndpointProbe]) -> tuple[float, str, list[str]]:
    """Tokens/s per server, what it comes from, and what that assumes."""
    if fleet.tokens_per_s_per_server is not None:
        return float(fleet.tokens_per_s_per_server), fleet.throughput_basis, []
    basis = (
        f"probe: {sum(p.requests for p in probes)} /generate request(s) of at most "
        f"{fleet.probe_max_new_tokens} tokens over {len(probes)} endpoint(s) "
        f"({sum(p.servers for p in probes)} server(s)), mean per server"
    )
    assumption = (
        f"throughput measured with {fleet.probe_requests} concurrent request(s) per server: a full run fills "
        "more slots, so the ETA is an upper bound"
    )
    return tokens_per_s_per_server(probes), basis, [assumption]


def _servers(fleet: Fleet, capacity: list[EndpointCapacity], config: GenerationConfig) -> tuple[int, list[str]]:
    """The number of servers the run spreads over: declared, or one per endpoint and a router's workers."""
    servers = fleet.servers or sum(c.servers for c in capacity) or len(config.endpoints)
    if fleet.servers is not None:
        return servers, []
    routers = "; ".join(c.describe() for c in capacity if c.workers is not None)
    return servers, [
        f"{servers} server(s): one per configured endpoint, a router's listed workers"
        + (f" ({routers})" if routers else "")
        + "; use --servers"
    ]


def _revision(
    given: str | None, config: GenerationConfig, probes: Sequence[EndpointProbe], data: DataPath, n_shards: int
) -> tuple[str | None, str]:
    """The model revision the cache keys use, as the generate step picks it: pinned, else what the
    endpoints serve; without either, what the last run stored (assumed unchanged)."""
    if given:
        return given, "given (--model-revision)"
    if config.model_revision:
        return config.model_revision, "pinned in the generation config"
    if probes:
        revs = sorted({p.model_revision for p in probes})
        if len(revs) > 1:
            raise ValueError(f"the endpoints serve different model revisions ({', '.join(revs)}); the run would refuse")
        return revs[0], "served by the endpoints (/model_info)"
    stored = stored_revision(data, range(n_shards))
    if stored:
        return stored, "the newest stored generations (assumed unchanged; probe or --model-revision to be sure)"
    return None, "unknown"


def _drafter(capacity: Sequence[EndpointCapacity], data: DataPath) -> tuple[str | None, str]:
    """The fleet's drafter key as the generate step makes it (probes.fleet_drafter_key over the endpoints whose
    /server_info answered); none answered (or not asked): the one the newest stored probe results hold."""
    answered = [c for c in capacity if c.drafter_known]
    if answered:
        return fleet_drafter_key(d for c in answered for d in c.drafters), "served by the endpoints (/server_info)"
    stored = stored_drafter_key(data)
    if stored is not None:
        return stored, "the newest stored probe results (assumed unchanged; probe to be sure)"
    return None, "unknown"


def _plan_keys(
    specs: Sequence[SourceSpec],
    config: GenerationConfig,
    revision: str | None,
    capacity: Sequence[EndpointCapacity],
    data: DataPath,
    budget: ContextBudget | None,
) -> tuple[PlanKeys, str]:
    """The run's cache keys as the generate step makes them: its probe sources are the `role: probe` source
    YAMLs (ingest.probe_source_names), their keys hold the fleet's drafter and the probe seed."""
    probe_sources = frozenset(s.name for s in specs if s.role == "probe")
    drafter, basis = _drafter(capacity, data) if probe_sources else (None, "no probe source")
    keys = PlanKeys(
        revision,
        sampling_hash(config),
        config.regen_seed,
        row_hash=budget.hash_for if budget is not None else None,
        probe_sources=probe_sources,
        drafter_key=drafter,
        probe_seed=config.probe_seed,
    )
    return keys, basis


def _drafter_assumptions(keys: PlanKeys, basis: str) -> list[str]:
    """What the probe prompts' keys rest on: the drafter and seed, or that no drafter is known."""
    if not keys.probe_sources:
        return []
    names = ", ".join(sorted(keys.probe_sources))
    drafter, probe_seed = keys.drafter_key, keys.probe_seed
    if drafter is None:
        return [
            f"no drafter known (no endpoint answered, no probe result stored): every prompt of the probe source(s) "
            f"{names} counts as to be sent"
        ]
    if basis.startswith("served"):
        return []
    return [f"the fleet's drafter is {drafter} ({basis}), probe seed {probe_seed}: it keys the probe source(s) {names}"]


def plan_table(plan: Plan) -> str:
    """The short human table `eagle3 plan` prints."""
    f = plan.fleet
    rows = [
        (
            "prompts",
            f"{plan.prompts:,}  (read {plan.records_read:,}; rejected {plan.rejected:,}, duplicates "
            f"{plan.duplicates:,}, sampled out {plan.sampled_out:,})",
        ),
        ("tokenized", f"{plan.tokenized:,}  (rejected {sum(plan.tokenize_rejects.values()):,})"),
        ("prompt tokens", f"{plan.prompt_tokens:,}  (exact, {plan.profile} tokenizer)"),
        (
            "requests",
            f"{plan.requests:,}  = cached {plan.requests_cached:,} + failed before "
            f"{plan.requests_failed_before:,} + to send {plan.requests_to_send:,}",
        ),
        ("model revision", f"{plan.model_revision or 'unknown'}  ({plan.revision_basis})"),
        *(
            [
                (
                    "drafter",
                    f"{plan.drafter_key or 'unknown'}  ({plan.drafter_basis}; keys {len(plan.probe_sources)} probe source(s))",
                )
            ]
            if plan.probe_sources
            else []
        ),
        *(
            [
                (
                    "over the context",
                    f"{plan.requests_context_fitted:,} fitted + {plan.requests_context_skipped:,} skipped "
                    f"(prompt + max_new_tokens > {plan.server_context_length:,}), "
                    f"{plan.requests_too_long_for_server:,} prompt(s) too long: not sent",
                )
            ]
            if plan.requests_context_fitted or plan.requests_context_skipped or plan.requests_too_long_for_server
            else []
        ),
        (
            "output tokens",
            f"{plan.expected_output_tokens:,.0f} expected for the requests to send  ({plan.output_basis})",
        ),
        ("throughput", f"{f['tokens_per_s_per_server']:,.1f} output tokens/s per server  ({f['throughput_basis']})"),
        ("fleet", f"{f['servers']} server(s) x {f['gpus_per_server']} GPU(s)"),
        ("ETA", f"{f['eta']}" + (f"  ({f['eta_s']:,.0f} s)" if f["eta_s"] >= 90 else "")),
        ("GPU-hours", f"{f['gpu_hours']:,.2f}"),
        (
            "disk",
            f"{human_bytes(plan.disk['total_bytes'])}  ("
            + ", ".join(f"{t} {human_bytes(b)}" for t, b in plan.disk["bytes"].items())
            + ")",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"assumes: {a}" for a in plan.assumptions]
    lines += [f"WARNING: {w}" for w in plan.warnings]
    return "\n".join(lines)


def write_plan(plan: Plan, data: DataPath, extra: Path | None = None) -> list[str]:
    """data/plan/plan.json (what the report and the prompts asset compare against) and `extra` if given."""
    body = json.dumps(plan.as_dict(), indent=2, sort_keys=True) + "\n"
    target = data / PLAN_FILE
    target.parent.mkdir()
    target.write_text(body)
    written = [str(target)]
    if extra is not None:
        extra.parent.mkdir(parents=True, exist_ok=True)
        extra.write_text(body)
        written.append(str(extra))
    return written


def read_plan(data: DataPath) -> dict[str, Any] | None:
    """The last plan written for this data dir, or None (none, or unreadable)."""
    p = data / PLAN_FILE
    try:
        return json.loads(p.read_text()) if p.exists() else None
    except ValueError:
        return None
