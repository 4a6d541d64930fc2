"""Generation wiring: `generations[shard]` through SGLang's native /generate, and its gate.

The tokenized shard is never loaded whole: generate_shard streams it from its folder (local or
object storage) in batches, and the later steps read only what they need, streamed the same way
(generate.inputs.prompt_view: ids, template hashes, prompt lengths and the last 24 ids of each prompt,
which is all the echo feature and the sample preview look at), in one more pass over the shard.
"""

import contextlib
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import polars as pl

from ..config import Settings
from ..generate import (
    AuthError,
    GenerationConfig,
    ModelRevisionError,
    NoEndpointError,
    ShardReport,
    generate_shard,
)
from ..generate.active import active_sample_ids, write_active_samples
from ..generate.config import generation_config
from ..generate.context_fit import ContextBudget
from ..generate.endpoint_info import EndpointRefusedError, ServingChangedError
from ..generate.inputs import prompt_view, tokenized_source
from ..generate.multiturn import (
    active_turn_ids,
    current_turns,
    load_multiturn,
    turn_generations,
    turn_prompt_view,
    turns_summary,
    write_turns_summary,
)
from ..generate.probe_results import new_training_rows, record_probe_results, stored_drafter_key
from ..generate.probes import ProbeKeys
from ..generate.report import progress_line, result_line
from ..generate.run_wait import endpoint_wait_record
from ..generate.store import iter_generations
from ..ingest.spec import probe_source_names
from ..orchestration.asset_names import AssetName
from ..orchestration.gates import HeadlineCheck
from ..orchestration.metadata import JUDGED_KEY, to_metadata
from ..orchestration.partitions import shard_partitions
from ..orchestration.pools import GENERATE_POOL
from ..orchestration.resources import SGLangFleet, cached_renderer
from ..orchestration.run import graph_run_key
from ..orchestration.shard_asset import GatedShard, ShardAssetSpec, ShardStep, gated_shard_asset
from ..quality import generation_features
from ..quality.acceptance import acceptance_metadata, shard_acceptance, summary_group
from ..quality.acceptance_drift import AcceptanceNight, judge_night, night_entry
from ..quality.features import with_same_answer_counts
from ..quality.request_failures import FAILURE_BUDGET_KEY, context_fit_outcome, failure_budget_outcome
from ..report.previews import PREVIEW_PROMPT_TAIL, histograms_markdown, sample_preview_markdown
from ..secret import PrintableFilter, RedactingFilter
from ..stopping import StopRequested
from ..storage import streamed_features

STAGE = "generate"
ECHO_WINDOW = 8  # generation_features' echo check compares the output's head with the prompt's last ids
GENERATION_BATCH_ROWS = 512  # generations read and featurized at a time (the step never holds the shard)


class _ToDagsterLog(logging.Handler):
    """The generation client's log lines (endpoint states, stalls, weight changes) in the step's log."""

    def __init__(self, context: dg.AssetExecutionContext) -> None:
        super().__init__(logging.INFO)
        self.context = context
        # the client redacts and escapes server text where it enters; these catch the rest
        self.addFilter(RedactingFilter())
        self.addFilter(PrintableFilter())  # one line per record in the event log: a server cannot forge one

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.levelno >= logging.ERROR:
                self.context.log.error(msg)
            elif record.levelno >= logging.WARNING:
                self.context.log.warning(msg)
            else:
                self.context.log.info(msg)
        except Exception:
            pass


@contextlib.contextmanager
def client_logs_to(context: dg.AssetExecutionContext):
    logger = logging.getLogger("eagle3_dagster.generate")
    handler = _ToDagsterLog(context)
    old = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


GENERATION_HEADLINES = (
    HeadlineCheck(
        "think_end_present",
        "think_end_present",
        "The profile's think-end id (163607 `</think>` for Kimi-K2.5) appears in output_ids. A systematic miss is "
        "the stripped-</think> bug this product exists to catch.",
    ),
    HeadlineCheck(
        "request_failure_budget",
        FAILURE_BUDGET_KEY,
        "Requests that failed (errors.parquet, by reason; permanent ones are not sent again, retryable ones are "
        "sent by the next run) are at most `pipeline.max_failed_rate` of the "
        "shard's requests (default 1%): over it the check fails (ERROR) with the rate and the top reason and the "
        "shard is left out of snapshots; any failure within it is a WARN.",
    ),
)


@dataclass(frozen=True)
class CurrentSamples:
    """The shard's samples as this run left them: its generations folder, the current samples (`active`),
    their prompts' view, and the current turns of all_turns conversations (None: no probe turn to measure)."""

    out: Any
    active: pl.DataFrame
    prompts: pl.DataFrame
    turns: pl.DataFrame | None = None


def probes_and_acceptance(
    step: ShardStep, current: CurrentSamples, probes: ProbeKeys, drafter_key: str, started: datetime
) -> AcceptanceNight:
    """Keep each drafter version's probe results (`current.turns`: the probe conversations are measured turn
    by turn), then judge tonight's acceptance (logged, named changes)."""
    data, pipeline, context = step.data, step.pipeline, step.context
    out, active, prompts = current.out, current.active, current.prompts
    # every drafter version's acceptance on the probe prompts, kept beside the data (generate/probe_results.py);
    # a run that asked no endpoint saw no drafter: it records neither probe results nor a drafter of its own
    if drafter_key:
        record_probe_results(data, step.shard, out, active, prompts, probes, current.turns)
    night = judge_night(
        data,
        step.shard,
        night_entry(
            new_training_rows(out, active, prompts, probes.sources, started),
            run_at=started,
            run_key=graph_run_key(context.run.tags, context.run_id),
            drafter_key=drafter_key,
        ),
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
    )
    if night.change_line:  # from no drafter to one is information; any other change a warning
        (context.log.warning if night.change_warns else context.log.info)(night.change_line)
    (context.log.warning if night.status in ("warned", "failed") else context.log.info)(night.line)
    return night


ACCEPTANCE_CHECK = "acceptance_drift"


def acceptance_checks(night: AcceptanceNight) -> tuple[dg.AssetCheckResult, ...]:
    """Tonight's acceptance against the previous night's (same drafter), and a drafter change, as a check.

    A night that was not judged (no earlier night to compare with, too few rows, another drafter, no
    speculation, no endpoint asked) claims no verdict: Dagster 1.13 lets a check of an @asset only pass or fail,
    so it passes with `judged: false` in its metadata and a description that starts "not judged" and says
    why (the demo's summary shows `not-judged`)."""
    description = "; ".join(x for x in (night.change_line, night.line) if x)
    if not night.judged:
        return (
            dg.AssetCheckResult(
                check_name=ACCEPTANCE_CHECK,
                passed=True,
                severity=dg.AssetCheckSeverity.WARN,
                description=f"not judged: {description}",
                metadata={JUDGED_KEY: False, "status": "not judged"},
            ),
        )
    severity = dg.AssetCheckSeverity.ERROR if night.status == "failed" else dg.AssetCheckSeverity.WARN
    return (
        dg.AssetCheckResult(
            check_name=ACCEPTANCE_CHECK,
            passed=night.status not in ("warned", "failed"),
            severity=severity,
            description=description,
            metadata={
                JUDGED_KEY: True,
                "status": night.status,
                **{k: float(v) for k, v in night.values.items() if v is not None},
            },
        ),
    )


ACCEPTANCE_CHECK_SPEC = dg.AssetCheckSpec(
    ACCEPTANCE_CHECK,
    asset=AssetName.GENERATIONS,
    blocking=False,
    description="Tonight's acceptance (Σ tokens / Σ verify steps, Σ accepted / Σ proposed drafts) on the "
    "shard's new training rows against its previous night with the same drafter and no flagged figures "
    "(expectations/acceptance_drift.json; warnings by default). A night with nothing to compare (the first, "
    "too few rows, a drafter change, no speculation) is not judged: the check passes with judged: false in "
    "its metadata and a description that starts 'not judged' and says why.",
)


GENERATE = ShardAssetSpec(
    name=AssetName.GENERATIONS,
    gate="generations",
    stage=STAGE,
    deps=(AssetName.TOKENIZED_PROMPTS,),
    headlines=GENERATION_HEADLINES,
    extra_checks=(ACCEPTANCE_CHECK_SPEC,),
    pool=GENERATE_POOL,  # limits how many shard steps hit the fleet at once (instance concurrency pools)
    retry_policy=dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL),
    resources=frozenset({"pipeline", "sglang"}),
    # The wait for an endpoint was already bounded (and logged): a step retry would only repeat it.
    # A stop request (Ctrl-C / SIGTERM) must not be retried either.
    # A drafter changed under the shard: stop and say so (a retry would go on quietly under the new one).
    no_retry=(NoEndpointError, EndpointRefusedError, ModelRevisionError, AuthError, ServingChangedError, StopRequested),
    description="Raw output_ids from SGLang POST /generate with input_ids (never the OpenAI chat endpoint), stored "
    "as received with finish_reason and meta_info. Resumable and incremental: only new cache keys hit the server.",
)


def shard_generation_config(step: ShardStep, sglang: SGLangFleet, s: Settings) -> GenerationConfig:
    """The shard's GenerationConfig: profile, endpoints, sampling, probe sources and the graph run's one
    bounded endpoint wait; `s`: the settings the definitions were built from (the fields no resource has)."""
    run_fields = {"max_new_tokens": step.pipeline.max_new_tokens, **sglang.generation_fields()}
    run_key = graph_run_key(step.context.run.tags, step.context.run_id)
    probe_sources = probe_source_names(step.pipeline.sources_path)
    return generation_config(
        step.profile,
        sglang.endpoints(s.fleet.urls),
        s,
        run_fields,
        probe_sources=probe_sources,
        # what keyed the stored probe samples, for a run whose endpoints do not answer (as `eagle3 plan`)
        stored_probe_drafter=stored_drafter_key(step.data) if probe_sources else None,
        # one bounded endpoint wait for all shards of the graph run / backfill, not one per shard
        endpoint_wait=endpoint_wait_record(step.pipeline.work_path, run_key),
    )


def require_some_answer(key: str, report: ShardReport) -> None:
    """Fail (not retried) when every sample failed: a green step with an empty table would hide it."""
    turns_failed = (report.turns or {}).get("turns_failed", 0)
    turns_ok = (report.turns or {}).get("turns_regenerated", 0)
    if (report.failed or turns_failed) and not (report.succeeded or report.skipped_cached or turns_ok):
        raise dg.Failure(
            description=f"generations shard {key}: every one of the {report.failed + turns_failed} samples failed "
            f"({', '.join(f'{k}={v}' for k, v in sorted(report.errors_by_kind.items()))}); the reasons "
            "are in the shard's errors.parquet. Fix the server and run again (what fails for a "
            "passing reason is sent again).",
            metadata=to_metadata(report),
            allow_retries=False,
        )


def current_samples(
    config: GenerationConfig, report: ShardReport, prompts: pl.DataFrame
) -> tuple[pl.DataFrame, ProbeKeys]:
    """This materialization's samples: exactly the current cache keys of the shard's prompts (the folder keeps
    every sample ever generated: a config change never deletes work). A prompt sent with max_new_tokens lowered
    to the server's context has that budget in its key."""
    budget = ContextBudget.of(config, report.server_context_length)
    probes = ProbeKeys(frozenset(config.probe_sources), report.drafter_key, config.probe_seed)
    active = active_sample_ids(
        prompts,
        report.model_revision,
        report.sampling_hash,
        config.regen_seed,
        row_hash=budget.hash_for if report.server_context_length is not None else None,
        probes=probes,
    )
    return active, probes


@dataclass(frozen=True)
class GatedGenerations:
    """The shard's current generations as the gate sees them: per-row features, a preview, the prompts' view."""

    features: pl.DataFrame
    preview: pl.DataFrame
    stored: int
    prompts: pl.DataFrame
    turns: pl.DataFrame | None


def generation_frame(
    step: ShardStep, out: Any, active: pl.DataFrame, prompts: pl.DataFrame, multiturn: bool, renderer: Any
) -> GatedGenerations:
    """Stream the current generations (and the turns of all_turns conversations) into the gate's features."""
    turns = current_turns(out, active) if multiturn else None
    batches: Iterator[pl.DataFrame] = iter_generations(out, only=active["sample_id"], batch_rows=GENERATION_BATCH_ROWS)
    if turns is not None and turns.height:  # the turns of all_turns conversations, gated with the shard
        batches = itertools.chain(batches, [turn_generations(turns)])
        prompts = pl.concat([prompts, turn_prompt_view(turns, tail=max(ECHO_WINDOW, PREVIEW_PROMPT_TAIL))])
    features, preview, stored = streamed_features(
        batches,
        lambda batch: generation_features(
            batch, prompts, step.profile, tokenizer=renderer.tokenizer, echo_window=ECHO_WINDOW
        ),
        preview=3,
    )
    # over the whole shard, not one batch: one answer sent for many prompts (generation_features' docs)
    features = with_same_answer_counts(features)
    return GatedGenerations(features, preview, stored, prompts, turns)


def shard_outcomes(
    step: ShardStep, config: GenerationConfig, report: ShardReport, night: AcceptanceNight
) -> tuple[Any, ...]:
    """The shard-level outcomes stored with the gate: the failure budget, the context fit, tonight's acceptance."""
    budget = failure_budget_outcome(
        requested=report.requested,
        failed=report.failed,
        errors_by_kind=report.errors_by_kind,
        failure_details=report.failure_details,
        max_failed_rate=step.pipeline.max_failed_rate,
    )
    fit: tuple[Any, ...] = ()
    if report.context_fitted or report.context_overflow_skipped:  # a shard-level warning when there are any
        fit = (
            context_fit_outcome(
                requested=report.requested,
                fitted=report.context_fitted,
                skipped=report.context_overflow_skipped,
                context_length=report.server_context_length,
                max_new_tokens=config.max_new_tokens,
                mode=report.context_overflow,
            ),
        )
    return (budget, *fit, *night.outcomes)


def generation_metadata(
    step: ShardStep, report: ShardReport, gens: GatedGenerations, night: AcceptanceNight, out: Any, active: Any
) -> dict[str, Any]:
    acceptance = shard_acceptance(out, active["sample_id"], gens.features, gens.turns)  # the drafter's figures
    left_out = summary_group(acceptance).left_out_text()  # rows whose figures failed their checks: in no figure
    if left_out:
        step.log.warning(f"shard {step.key}: acceptance: {left_out}; they feed no figure, report or export")
    tokenizer = cached_renderer(step.profile).tokenizer
    return {
        **to_metadata(report),
        "stored_samples": gens.stored,
        **{k: dg.MetadataValue.float(v) for k, v in acceptance_metadata(acceptance).items()},
        **({"spec_left_out": dg.MetadataValue.text(left_out)} if left_out else {}),
        **({"turn_rows": dg.MetadataValue.json(turns_summary(gens.turns))} if gens.turns is not None else {}),
        "sample_preview": dg.MetadataValue.md(
            sample_preview_markdown(gens.preview, gens.prompts, tokenizer, step.profile, n=3)
        ),
        "histograms": dg.MetadataValue.md(
            histograms_markdown(gens.features, ["reasoning_len", "answer_len", "think_end_pos", "output_len"])
        ),
        "path": dg.MetadataValue.path(str(out)),
        "drafter_key": report.drafter_key if report.drafter_asked else "unknown: no endpoint was asked",
        "acceptance_drift": dg.MetadataValue.json(
            {
                "status": night.status,
                "judged": night.judged,
                "line": night.line,
                "drafter_change": night.change_line,
                **night.values,
            }
        ),
    }


def generate_and_gate(step: ShardStep, sglang: SGLangFleet, s: Settings) -> GatedShard:
    """Generate the shard through the fleet, record tonight's acceptance, and hand its current rows to the gate
    (`s`: the settings the definitions were built from)."""
    tokenized = tokenized_source(step.data, step.shard)  # a folder, streamed: never the whole shard in memory
    config = shard_generation_config(step, sglang, s)
    out = step.folder("generations")
    renderer = cached_renderer(step.profile)
    # regenerate: all_turns sources: their conversations' turns run in the same shard (generate/multiturn.py)
    multiturn = load_multiturn(
        step.data / "prompts" / "prompts.parquet",
        step.shard,
        tokenized,
        renderer=renderer,
        profile=step.profile,
        max_new_tokens=config.max_new_tokens,
    )
    started = datetime.now(UTC)  # this run's rows are tonight's new ones (the acceptance drift check)
    with client_logs_to(step.context):
        report = generate_shard(
            tokenized,
            out,
            config,
            progress=lambda p: step.log.info(progress_line(step.key, p)),
            lock_dir=step.pipeline.work_path / "locks",
            multiturn=multiturn,
        )
    step.log.info(result_line(step.key, report))
    require_some_answer(step.key, report)
    # ids, template hashes, lengths and the last few input ids a prompt: all the steps below need
    prompts = prompt_view(tokenized, tail=max(ECHO_WINDOW, PREVIEW_PROMPT_TAIL))
    active, probes = current_samples(config, report, prompts)
    drafter_key = report.drafter_key if report.drafter_asked else ""  # "": no endpoint asked, drafter unknown
    turn_ids = active_turn_ids(report.turn_sample_ids) if multiturn is not None else None
    probe_turns = current_turns(out, turn_ids) if turn_ids is not None and probes.sources else None
    current = CurrentSamples(out, active, prompts, probe_turns)
    night = probes_and_acceptance(step, current, probes, drafter_key, started)
    if turn_ids is not None:  # the conversations' turns on their current paths, gated like any sample
        active = pl.concat([active, turn_ids], how="diagonal")
    write_active_samples(out, active)
    write_turns_summary(out, report.turns)  # the quality report's conversations section
    gens = generation_frame(step, out, active, prompts, multiturn is not None, renderer)
    return GatedShard(
        gens.features,
        generation_metadata(step, report, gens, night, out, active),
        quarantine=out / "quarantine.parquet",
        outcomes=shard_outcomes(step, config, report, night),
        checks=acceptance_checks(night),
    )


def generations(s: Settings) -> dg.AssetsDefinition:
    """`generations` over the shard partitions of `s`, its steps handed `s`."""

    def generate_step(step: ShardStep) -> GatedShard:
        return generate_and_gate(step, step.resource("sglang"), s)

    return gated_shard_asset(GENERATE, shard_partitions(s.shards.n_shards))(generate_step)


def build_defs(s: Settings) -> dg.Definitions:
    return dg.Definitions(assets=[generations(s)])
