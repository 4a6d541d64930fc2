"""Training wiring: `training_samples[shard]`, consuming only shards whose gates passed."""

import json

import dagster as dg
import polars as pl

from ..generate import read_generations
from ..quality import read_gate_result, run_gate, training_features
from ..quality.features import available_source_shares
from ..schemas import TOKENIZED_PROMPTS, TRAINING_SAMPLES
from ..storage import parquet_num_rows, parse_shard_key, read_parquet, read_parquet_dir, shard_dir, write_frame_atomic
from ..train import build_training_samples
from ..train.conversations import parse_generations
from ..train.summary import SUMMARY_FILE, headline, summarize_samples
from .gates import gate_check_results, gate_check_specs, store_gate_result
from .generate import ACTIVE_FILE
from .metadata import to_metadata
from .partitions import shard_partitions
from .resources import PipelineSettings, cached_renderer

GROUP = "train"
MAX_TRAIN_LEN = 65536


def _require_passed_gates(data, shard: int) -> dict:
    """Cross-run gating: a shard whose gate failed (in any earlier run) is never consumed."""
    gates = {}
    for gate in ("prompts", "generations"):
        res = read_gate_result(data, gate, shard)
        if res is None:
            raise dg.Failure(
                f"shard {shard:04d}: no stored `{gate}` gate result; materialize the upstream assets first"
            )
        if not res.success:
            failed = [o.name for o in res.outcomes if not o.success and o.severity == "critical"]
            raise dg.Failure(
                description=f"shard {shard:04d}: the `{gate}` gate failed ({', '.join(failed)}); refusing to build "
                "training samples from it",
                metadata={"failed_expectations": dg.MetadataValue.json(failed)},
            )
        gates[gate] = res
    return gates


@dg.asset(
    name="training_samples",
    group_name=GROUP,
    deps=["generations", "tokenized_prompts"],
    partitions_def=shard_partitions,
    check_specs=gate_check_specs("training_samples", "training_samples", ()),
    description="input_ids = prompt ids + output ids (exactly as generated), loss_mask 0 over the prompt and 1 over "
    "the output; only rows that passed every critical gate expectation; lineage on every row; text_exact = false "
    "flags rows whose text re-encodes to other ids (kept: non-canonical tokenization is valid model output).",
    kinds={"parquet"},
    tags={"eagle3/stage": "train"},
)
def training_samples(context: dg.AssetExecutionContext, pipeline: PipelineSettings) -> dg.MaterializeResult:
    shard = parse_shard_key(context.partition_key)
    data = pipeline.data_path
    profile = pipeline.profile()
    gates = _require_passed_gates(data, shard)
    tokenized = read_parquet_dir(shard_dir(data, "tokenized_prompts", shard), schema=TOKENIZED_PROMPTS)
    gen_dir = shard_dir(data, "generations", shard)
    active_path = gen_dir / ACTIVE_FILE
    if not active_path.exists():
        raise dg.Failure(f"shard {shard:04d}: {active_path} is missing; materialize `generations` first")
    # only the samples of the latest generations materialization (the current cache keys)
    gens = read_generations(gen_dir).join(read_parquet(active_path, columns=["sample_id"]), on="sample_id", how="semi")
    bad_prompts = set(gates["prompts"].row_failures["row_id"].to_list())
    bad_samples = set(gates["generations"].row_failures["row_id"].to_list())
    errors_path = shard_dir(data, "generations", shard) / "errors.parquet"
    prompts = read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == shard)
    tokenizer = cached_renderer(profile).tokenizer
    candidates = gens.filter(
        ~pl.col("sample_id").is_in(list(bad_samples)) & ~pl.col("prompt_id").is_in(list(bad_prompts))
    )
    conversations, parse_failures, parse_counts = parse_generations(candidates, prompts, profile, tokenizer)
    samples, counts = build_training_samples(
        gens,
        tokenized,
        exclude_sample_ids=bad_samples | set(parse_failures["row_id"].to_list()),
        exclude_prompt_ids=bad_prompts,
        conversations=conversations,
    )
    out = shard_dir(data, "training_samples", shard)
    write_frame_atomic(parse_failures, out / "quarantine.parquet")
    path = write_frame_atomic(samples, out / "part-0000.parquet", schema=TRAINING_SAMPLES)
    rt_rate = parse_counts["round_trip_ok"] / parse_counts["parsed"] if parse_counts["parsed"] else 1.0
    features = training_features(
        samples, profile, max_total_len=MAX_TRAIN_LEN, available_shares=available_source_shares(tokenized)
    )
    # the shard's distribution summary, for the report's per-shard charts (train/summary.py)
    summary = summarize_samples(samples, profile)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str))
    gate = run_gate(
        "training_samples",
        features,
        expectations_dir=pipeline.expectations_path,
        context_dir=pipeline.gx_context_dir,
        profile=profile,
        keep_validations=pipeline.gx_keep_validations,
    )
    report_meta = store_gate_result(context, pipeline, "training_samples", shard, gate, profile.name)
    context.log.info(
        f"training_samples shard {shard:04d}: "
        + " · ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in dict(counts).items())
    )
    if parse_counts["text_exact_false"]:
        context.log.warning(
            f"shard {shard}: {parse_counts['text_exact_false']} of {counts['samples']} rows are not text-exact "
            "(non-canonical tokenization: their text re-encodes to other ids); kept in training_samples and "
            "specforge_prompts.jsonl, flagged in conversations.jsonl, left out of specforge_preformatted.jsonl"
        )
    return dg.MaterializeResult(
        metadata={
            **to_metadata(counts),
            **to_metadata(parse_counts),
            "round_trip_rate": rt_rate,
            "text_exact_rows": int(samples["text_exact"].sum() or 0) if samples.height else 0,
            "generation_errors": parquet_num_rows(errors_path) if errors_path.exists() else 0,
            "supervised_tokens": int(samples["output_len"].sum() or 0) if samples.height else 0,
            **{f"summary/{k}": v for k, v in headline(summary).items() if k != "rows"},
            "path": dg.MetadataValue.path(str(path)),
            **report_meta,
        },
        check_results=gate_check_results("training_samples", gate, ()),
    )
