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
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import polars as pl

from ..config import COMPACT_ENV, generation_env, settings  # noqa: F401 - COMPACT_ENV re-exported
from ..generate import (
    AuthError,
    GenerationConfig,
    ModelRevisionError,
    NoEndpointError,
    generate_shard,
)
from ..generate.active import active_sample_ids, run_config, write_active_samples
from ..generate.context_fit import ContextBudget
from ..generate.endpoints import EndpointRefusedError
from ..generate.inputs import prompt_view
from ..generate.multiturn import (
    active_turn_ids,
    current_turns,
    load_multiturn,
    turn_generations,
    turn_prompt_view,
    turns_summary,
    write_turns_summary,
)
from ..generate.probe_results import new_training_rows, record_probe_results
from ..generate.probes import ProbeKeys
from ..generate.report import progress_line, result_line
from ..generate.run_wait import endpoint_wait_record
from ..generate.store import iter_generations
from ..ingest.spec import probe_source_names
from ..orchestration.gates import HeadlineCheck, gate_check_specs
from ..orchestration.metadata import to_metadata
from ..orchestration.partitions import shard_partitions
from ..orchestration.resources import PipelineSettings, SGLangFleet, cached_renderer
from ..orchestration.run import graph_run_key
from ..orchestration.stage import gated_result, streamed_features
from ..quality import generation_features
from ..quality.acceptance import acceptance_metadata, shard_acceptance
from ..quality.acceptance_drift import AcceptanceNight, judge_night, night_entry
from ..quality.report.previews import PREVIEW_PROMPT_TAIL, histograms_markdown, sample_preview_markdown
from ..quality.request_failures import FAILURE_BUDGET_KEY, context_fit_outcome, failure_budget_outcome
from ..schemas import TOKENIZED_PROMPTS
from ..secret import RedactingFilter
from ..stopping import StopRequested
from ..storage import as_data_path, parse_shard_key, shard_dir
from .common import ASSET_GROUP, STAGE_TAG

STAGE = "generate"
ECHO_WINDOW = 8  # generation_features' echo check compares the output's head with the prompt's last ids
GENERATION_BATCH_ROWS = 512  # generations read and featurized at a time (the step never holds the shard)


def compact_after_chunks_from_env() -> int | None:
    """EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS: merge a shard's chunks once more than this many exist (0: never)."""
    n = settings().generation_compact_after_chunks  # validated in config.py
    if n is None:
        return GenerationConfig.__dataclass_fields__["compact_after_chunks"].default  # type: ignore[return-value]
    return n or None


class _ToDagsterLog(logging.Handler):
    """The generation client's log lines (endpoint states, stalls, weight changes) in the step's log."""

    def __init__(self, context: dg.AssetExecutionContext) -> None:
        super().__init__(logging.INFO)
        self.context = context
        self.addFilter(RedactingFilter())  # the client redacts server text where it enters; this catches the rest

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


def tokenized_source(data, shard: int):
    """The tokenized shard for generate_shard: its folder (streamed), or an empty frame if it has none."""
    folder = as_data_path(shard_dir(data, "tokenized_prompts", shard))
    if not folder.glob("part-*.parquet"):
        return pl.from_arrow(TOKENIZED_PROMPTS.empty_table())
    return folder


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
        "Requests that failed for good (errors.parquet, by reason) are at most `pipeline.max_failed_rate` of the "
        "shard's requests (default 1%): over it the check fails (ERROR) with the rate and the top reason and the "
        "shard is left out of snapshots; any failure within it is a WARN.",
    ),
)


def probes_and_acceptance(
    context: dg.AssetExecutionContext,
    pipeline: PipelineSettings,
    shard: int,
    out: Any,
    active: pl.DataFrame,
    prompts: pl.DataFrame,
    probes: ProbeKeys,
    drafter_key: str,
    started: datetime,
) -> AcceptanceNight:
    """Keep each drafter version's probe results, then judge tonight's acceptance (logged, named changes)."""
    data = pipeline.data_path
    # every drafter version's acceptance on the probe prompts, kept beside the data (generate/probe_results.py)
    record_probe_results(data, shard, out, active, prompts, probes)
    night = judge_night(
        data,
        shard,
        night_entry(
            new_training_rows(out, active, prompts, probes.sources, started),
            run_at=started,
            run_key=graph_run_key(context.run.tags, context.run_id),
            drafter_key=drafter_key,
        ),
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
        keep_validations=pipeline.gx_keep_validations,
    )
    if night.change_line:
        context.log.warning(night.change_line)
    (context.log.warning if night.status in ("warned", "failed") else context.log.info)(night.line)
    return night


ACCEPTANCE_CHECK = "acceptance_drift"


def acceptance_check(night: AcceptanceNight) -> dg.AssetCheckResult:
    """Tonight's acceptance against the previous night's (same drafter), and a drafter change, as a check."""
    severity = dg.AssetCheckSeverity.ERROR if night.status == "failed" else dg.AssetCheckSeverity.WARN
    return dg.AssetCheckResult(
        check_name=ACCEPTANCE_CHECK,
        passed=night.status not in ("warned", "failed"),
        severity=severity,
        description="; ".join(x for x in (night.change_line, night.line) if x),
        metadata={"status": night.status, **{k: float(v) for k, v in night.values.items() if v is not None}},
    )


@dg.asset(
    name="generations",
    group_name=ASSET_GROUP,
    deps=["tokenized_prompts"],
    partitions_def=shard_partitions,
    pool="sglang",  # limits how many shard steps hit the fleet at once (instance concurrency pools)
    retry_policy=dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL),
    check_specs=[
        *gate_check_specs("generations", "generations", GENERATION_HEADLINES),
        dg.AssetCheckSpec(
            ACCEPTANCE_CHECK,
            asset="generations",
            blocking=False,
            description="Tonight's mean acceptance (spec_accept_length, spec_accept_rate) on the shard's new training "
            "rows against its previous night with the same drafter (expectations/acceptance_drift.json; warnings by "
            "default); a drafter change is named instead of judged.",
        ),
    ],
    description="Raw output_ids from SGLang POST /generate with input_ids (never the OpenAI chat endpoint), stored "
    "as received with finish_reason and meta_info. Resumable and incremental: only new cache keys hit the server.",
    kinds={"parquet"},
    tags={STAGE_TAG: STAGE},
)
def generations(
    context: dg.AssetExecutionContext, pipeline: PipelineSettings, sglang: SGLangFleet
) -> dg.MaterializeResult:
    shard = parse_shard_key(context.partition_key)
    data = pipeline.data_path
    profile = pipeline.profile()
    tokenized = tokenized_source(data, shard)  # a folder, streamed: never the whole shard in memory
    run_fields = {"max_new_tokens": pipeline.max_new_tokens, **sglang.generation_fields()}
    probe_sources = probe_source_names(settings().sources_dir)
    config = run_config(profile, sglang.endpoints(), generation_env(), run_fields).with_(
        probe_sources=probe_sources,
        compact_after_chunks=compact_after_chunks_from_env(),  # None (EAGLE3_..._CHUNKS=0): never compact
        # one bounded endpoint wait for all shards of the graph run / backfill, not one per shard
        endpoint_wait=endpoint_wait_record(pipeline.work_path, graph_run_key(context.run.tags, context.run_id)),
    )
    out = shard_dir(data, "generations", shard)
    key = f"{shard:04d}"

    def progress(p) -> None:
        context.log.info(progress_line(key, p))

    renderer = cached_renderer(profile)
    # regenerate: all_turns sources: their conversations' turns run in the same shard (generate/multiturn.py)
    multiturn = load_multiturn(
        data / "prompts" / "prompts.parquet",
        shard,
        tokenized,
        renderer=renderer,
        profile=profile,
        max_new_tokens=config.max_new_tokens,
    )
    started = datetime.now(UTC)  # this run's rows are tonight's new ones (the acceptance drift check)
    try:
        with client_logs_to(context):
            report = generate_shard(
                tokenized, out, config, progress=progress, lock_dir=pipeline.work_path / "locks", multiturn=multiturn
            )
    except (NoEndpointError, EndpointRefusedError, ModelRevisionError, AuthError, StopRequested) as e:
        # The wait for an endpoint was already bounded (and logged): a step retry would only repeat it.
        # A stop request (Ctrl-C / SIGTERM) must not be retried either.
        raise dg.Failure(description=f"generations shard {key}: {type(e).__name__}: {e}", allow_retries=False) from e
    context.log.info(result_line(key, report))
    turns_failed = (report.turns or {}).get("turns_failed", 0)
    turns_ok = (report.turns or {}).get("turns_regenerated", 0)
    if (report.failed or turns_failed) and not (report.succeeded or report.skipped_cached or turns_ok):
        # Nothing usable came back: a green step with an empty table would hide it.
        raise dg.Failure(
            description=f"generations shard {key}: every one of the {report.failed + turns_failed} samples failed "
            f"({', '.join(f'{k}={v}' for k, v in sorted(report.errors_by_kind.items()))}); the reasons "
            "are in the shard's errors.parquet. Fix the server and run again (what fails for a "
            "passing reason is sent again).",
            metadata=to_metadata(report),
            allow_retries=False,
        )
    # ids, template hashes, lengths and the last few input ids a prompt: all the steps below need
    prompts = prompt_view(tokenized, tail=max(ECHO_WINDOW, PREVIEW_PROMPT_TAIL))
    # The shard folder keeps every sample ever generated (a config change never deletes work);
    # this materialization's samples are exactly the current cache keys of its prompts.
    # a prompt sent with max_new_tokens lowered to the server's context has that budget in its key
    budget = ContextBudget.of(config, report.server_context_length)
    probes = ProbeKeys(frozenset(probe_sources), report.drafter_key, config.probe_seed)
    active = active_sample_ids(
        prompts,
        report.model_revision,
        report.sampling_hash,
        config.regen_seed,
        row_hash=budget.hash_for if report.server_context_length is not None else None,
        probes=probes,
    )
    night = probes_and_acceptance(context, pipeline, shard, out, active, prompts, probes, report.drafter_key, started)
    if multiturn is not None:  # the conversations' turns on their current paths, gated like any sample
        active = pl.concat([active, active_turn_ids(report.turn_sample_ids)], how="diagonal")
    write_active_samples(out, active)
    write_turns_summary(out, report.turns)  # the quality report's conversations section
    turns = current_turns(out, active) if multiturn is not None else None
    batches: Iterator[pl.DataFrame] = iter_generations(out, only=active["sample_id"], batch_rows=GENERATION_BATCH_ROWS)
    if turns is not None and turns.height:  # the turns of all_turns conversations, gated with the shard
        batches = itertools.chain(batches, [turn_generations(turns)])
        prompts = pl.concat([prompts, turn_prompt_view(turns, tail=max(ECHO_WINDOW, PREVIEW_PROMPT_TAIL))])
    # streamed: one batch of generations at a time; the gate judges the shard's per-row features
    features, preview_rows, stored = streamed_features(
        batches,
        lambda batch: generation_features(
            batch, prompts, profile, tokenizer=renderer.tokenizer, echo_window=ECHO_WINDOW
        ),
        preview=3,
    )
    acceptance = shard_acceptance(out, active["sample_id"], features, turns)  # the drafter's figures, grouped
    _, result = gated_result(
        context,
        pipeline,
        "generations",
        shard,
        features,
        profile,
        headlines=GENERATION_HEADLINES,
        quarantine=out / "quarantine.parquet",
        extra_outcomes=(
            failure_budget_outcome(
                requested=report.requested,
                failed=report.failed,
                errors_by_kind=report.errors_by_kind,
                failure_details=report.failure_details,
                max_failed_rate=pipeline.max_failed_rate,
            ),
            # prompts over the server's context (fitted / not sent): a shard-level warning when there are any
            *(
                [
                    context_fit_outcome(
                        requested=report.requested,
                        fitted=report.context_fitted,
                        skipped=report.context_overflow_skipped,
                        context_length=report.server_context_length,
                        max_new_tokens=config.max_new_tokens,
                        mode=report.context_overflow,
                    )
                ]
                if report.context_fitted or report.context_overflow_skipped
                else []
            ),
            *night.outcomes,  # tonight's acceptance against the previous night's (warnings by default)
        ),
        metadata={
            **to_metadata(report),
            "stored_samples": stored,
            **{k: dg.MetadataValue.float(v) for k, v in acceptance_metadata(acceptance).items()},
            **({"turn_rows": dg.MetadataValue.json(turns_summary(turns))} if turns is not None else {}),
            "sample_preview": dg.MetadataValue.md(
                sample_preview_markdown(preview_rows, prompts, renderer.tokenizer, profile, n=3)
            ),
            "histograms": dg.MetadataValue.md(
                histograms_markdown(features, ["reasoning_len", "answer_len", "think_end_pos", "output_len"])
            ),
            "path": dg.MetadataValue.path(str(out)),
            "drafter_key": report.drafter_key,
            "acceptance_drift": dg.MetadataValue.json(
                {"status": night.status, "line": night.line, "drafter_change": night.change_line, **night.values}
            ),
        },
    )
    return result._replace(check_results=[*(result.check_results or []), acceptance_check(night)])


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[generations])
