"""Generation wiring: `generations[shard]` through SGLang's native /generate, and its gate.

The tokenized shard is never loaded whole: generate_shard streams it from its folder (local or
object storage) in batches, and the later steps read only what they need, streamed the same way
(generate.inputs.prompt_view: ids, template hashes, prompt lengths and the last 24 ids of each prompt,
which is all the echo feature and the sample preview look at), in one more pass over the shard.
"""

import contextlib
import logging

import dagster as dg
import polars as pl

from ..config import COMPACT_ENV, generation_env, settings  # noqa: F401 - COMPACT_ENV re-exported
from ..generate import (
    AuthError,
    GenerationConfig,
    ModelRevisionError,
    NoEndpointError,
    generate_shard,
    read_generations,
    sample_key,
)
from ..generate.endpoints import EndpointRefusedError
from ..generate.inputs import prompt_view
from ..generate.report import progress_line, result_line
from ..quality import generation_features, histograms_markdown, run_gate, sample_preview_markdown
from ..quality.reports import PREVIEW_PROMPT_TAIL
from ..schemas import TOKENIZED_PROMPTS
from ..stopping import StopRequested
from ..storage import as_data_path, parse_shard_key, shard_dir, write_frame_atomic
from .gates import HeadlineCheck, gate_check_results, gate_check_specs, store_gate_result
from .metadata import to_metadata
from .partitions import shard_partitions
from .resources import PipelineSettings, SGLangFleet, cached_renderer

GROUP = "generate"
ACTIVE_FILE = "active.parquet"
ECHO_WINDOW = 8  # generation_features' echo check compares the output's head with the prompt's last ids


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


def active_sample_ids(tokenized: pl.DataFrame, model_revision: str, sampling_hash: str, regen_seed) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "sample_id": [
                sample_key(r["prompt_id"], model_revision, r["template_hash"] or "", sampling_hash, regen_seed)
                for r in tokenized.select("prompt_id", "template_hash").iter_rows(named=True)
            ],
            "prompt_id": tokenized["prompt_id"].to_list(),
        },
        schema={"sample_id": pl.String, "prompt_id": pl.String},
    )


GENERATION_HEADLINES = (
    HeadlineCheck(
        "think_end_present",
        "think_end_present",
        "The profile's think-end id (163607 `</think>` for Kimi-K2.5) appears in output_ids. A systematic miss is "
        "the stripped-</think> bug this product exists to catch.",
    ),
)


@dg.asset(
    name="generations",
    group_name=GROUP,
    deps=["tokenized_prompts"],
    partitions_def=shard_partitions,
    pool="sglang",  # limits how many shard steps hit the fleet at once (instance concurrency pools)
    retry_policy=dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL),
    check_specs=gate_check_specs("generations", "generations", GENERATION_HEADLINES),
    description="Raw output_ids from SGLang POST /generate with input_ids (never the OpenAI chat endpoint), stored "
    "as received with finish_reason and meta_info. Resumable and incremental: only new cache keys hit the server.",
    kinds={"parquet"},
    tags={"eagle3/stage": "generate"},
)
def generations(
    context: dg.AssetExecutionContext, pipeline: PipelineSettings, sglang: SGLangFleet
) -> dg.MaterializeResult:
    shard = parse_shard_key(context.partition_key)
    data = pipeline.data_path
    profile = pipeline.profile()
    tokenized = tokenized_source(data, shard)  # a folder, streamed: never the whole shard in memory
    overrides = {"compact_after_chunks": compact_after_chunks_from_env(), **generation_env()}
    if pipeline.max_new_tokens:
        overrides["max_new_tokens"] = pipeline.max_new_tokens
    if sglang.max_in_flight:
        overrides["max_in_flight"] = sglang.max_in_flight
    if sglang.model_revision:
        overrides["model_revision"] = sglang.model_revision
    if sglang.regen_seed is not None:
        overrides["regen_seed"] = sglang.regen_seed
    if sglang.read_timeout_s is not None:
        overrides["read_timeout_s"] = sglang.read_timeout_s
    if sglang.max_retries is not None:
        overrides["max_retries"] = sglang.max_retries
    for name in ("wait_for_endpoint_s", "stream", "stall_timeout_s"):
        if getattr(sglang, name) is not None:
            overrides[name] = getattr(sglang, name)
    config = GenerationConfig.from_profile(profile, sglang.endpoints(), **overrides)
    out = shard_dir(data, "generations", shard)
    key = f"{shard:04d}"

    def progress(p) -> None:
        context.log.info(progress_line(key, p))

    try:
        with client_logs_to(context):
            report = generate_shard(tokenized, out, config, progress=progress, lock_dir=pipeline.work_path / "locks")
    except (NoEndpointError, EndpointRefusedError, ModelRevisionError, AuthError, StopRequested) as e:
        # The wait for an endpoint was already bounded (and logged): a step retry would only repeat it.
        # A stop request (Ctrl-C / SIGTERM) must not be retried either.
        raise dg.Failure(description=f"generations shard {key}: {type(e).__name__}: {e}", allow_retries=False) from e
    context.log.info(result_line(key, report))
    if report.failed and not (report.succeeded or report.skipped_cached):
        # Nothing usable came back: a green step with an empty table would hide it.
        raise dg.Failure(
            description=f"generations shard {key}: every one of the {report.failed} samples failed "
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
    active = active_sample_ids(prompts, report.model_revision, report.sampling_hash, config.regen_seed)
    write_frame_atomic(active, out / ACTIVE_FILE)
    gens = read_generations(out).join(active.select("sample_id"), on="sample_id", how="semi")
    renderer = cached_renderer(profile)
    features = generation_features(gens, prompts, profile, tokenizer=renderer.tokenizer, echo_window=ECHO_WINDOW)
    gate = run_gate(
        "generations",
        features,
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
        profile=profile,
        keep_validations=pipeline.gx_keep_validations,
    )
    report_meta = store_gate_result(context, pipeline, "generations", shard, gate, profile.name)
    write_frame_atomic(gate.row_failures, out / "quarantine.parquet")
    return dg.MaterializeResult(
        metadata={
            **to_metadata(report),
            "stored_samples": gens.height,
            "quarantined": gate.row_failures.height,
            "sample_preview": dg.MetadataValue.md(
                sample_preview_markdown(gens, prompts, renderer.tokenizer, profile, n=3)
            ),
            "histograms": dg.MetadataValue.md(
                histograms_markdown(features, ["reasoning_len", "answer_len", "think_end_pos", "output_len"])
            ),
            "path": dg.MetadataValue.path(str(out)),
            **report_meta,
        },
        check_results=gate_check_results("generations", gate, GENERATION_HEADLINES),
    )
