"""Publishing: `training_dataset` snapshots + exports.

The nightly schedule, the sensors and the jobs that run this asset live in defs/automation.py.
"""

from typing import Any

import dagster as dg
from pydantic import Field

from ..config import Settings
from ..ingest import load_source_specs
from ..orchestration.asset_names import ASSET_GROUP, STAGE_TAG, AssetName
from ..orchestration.resources import PipelineSettings, SGLangFleet
from ..publish.card import CARD_FILE, card_config
from ..publish.export import SPECFORGE_FILE, exporters_for
from ..publish.snapshot import GATES, PublishLockOptions, PublishPolicy, SnapshotContent, SnapshotResult, build_snapshot
from ..publish.snapshot_gates import SnapshotFacts, SnapshotVerdict, drift_line, judge_snapshot
from ..quality import read_gate_result
from ..stopping import StopRequested
from ..storage import DataDirLocked
from ..train.summary import Summary, headline

STAGE = "publish"


def _tokenizer(profile):
    """The profile's tokenizer, for the text-level export (loaded only when a new snapshot is built)."""
    from ..tokenize import load_tokenizer

    return load_tokenizer(profile.tokenizer, trust_remote_code=profile.trust_remote_code)


PUBLISH_CHECK = "publish_gate"
DRIFT_CHECK = "drift_gate"


class PublishConfig(dg.Config):
    """The publish run's config (the launchpad, `eagle3 demo|backfill --allow-partial`)."""

    allow_partial: bool = Field(
        default=False,
        description="Publish a partial snapshot: shards that did not pass are left out, and the manifest and the "
        "data card name each and why. Off: a snapshot is published only when every shard passed.",
    )


def training_dataset_asset(s: Settings) -> dg.AssetsDefinition:
    """`training_dataset`: the snapshot of shards 0 .. n_shards-1 (the partitions of the same definitions), with
    the served-model pin and the snapshot retention of `s`."""
    n_shards, served_model_pin, keep = s.shards.n_shards, s.model.served_model, s.stages.snapshot_retention

    @dg.asset(
        name=AssetName.TRAINING_DATASET,
        group_name=ASSET_GROUP,
        deps=[AssetName.TRAINING_SAMPLES],
        description="A versioned snapshot of every gated shard (copied, with a manifest: content identity, rows, sha256 "
        "per file, shards included/excluded and why, gate results, distribution summary, drift against the previous "
        "snapshot, config), plus exports: specforge_prompts.jsonl (SpecForge online, vllm speculators), "
        "specforge_preformatted.jsonl (SpecForge offline) and conversations.jsonl (re-rendering trainers; not "
        "token-exact). Published (LATEST moves) only when the publish gate passes (expectations/publish.json) and the "
        "drift policy allows (expectations/drift.json).",
        kinds={"parquet", "json"},
        tags={STAGE_TAG: STAGE},
        check_specs=[
            dg.AssetCheckSpec(
                PUBLISH_CHECK,
                asset=AssetName.TRAINING_DATASET,
                blocking=True,
                description="expectations/publish.json: not empty, some shard included, not a sudden drop "
                "against the previous snapshot; a failure means nothing is published and LATEST stays.",
            ),
            dg.AssetCheckSpec(
                DRIFT_CHECK,
                asset=AssetName.TRAINING_DATASET,
                blocking=True,
                description="expectations/drift.json: the snapshot's distribution summary against the "
                "previous published snapshot's (reasoning/output/answer lengths, rates, model revision).",
            ),
        ],
    )
    def training_dataset(
        context: dg.AssetExecutionContext, config: PublishConfig, pipeline: PipelineSettings, sglang: SGLangFleet
    ):
        snap = build_and_judge(
            context,
            pipeline,
            snapshot_config(pipeline, sglang, n_shards, served_model_pin),
            n_shards,
            keep=keep,
            allow_partial=config.allow_partial,
        )
        log_snapshot(context, snap)
        checks = snapshot_check_results(snap, snap.verdict)
        if not snap.published:
            yield from checks
            raise not_published(context, snap)
        yield dg.MaterializeResult(metadata=published_metadata(snap), data_version=dg.DataVersion(snap.version))
        yield from checks

    return training_dataset


def snapshot_config(
    pipeline: PipelineSettings, sglang: SGLangFleet, n_shards: int, served_model_pin: str | None
) -> dict[str, Any]:
    """What a snapshot records as its config (and the data card's model and sources: train/card.py)."""
    profile = pipeline.profile()
    return {
        "profile": profile.name,
        "profile_fingerprint": profile.fingerprint(),
        "max_new_tokens": profile.max_new_tokens_for(pipeline.max_new_tokens),
        "regen_seed": sglang.regen_seed,
        "n_shards": n_shards,
        # the data card's model and sources (publish/card.py): tokenizer, sampling, licences and origins
        **card_config(profile, load_source_specs(pipeline.sources_path), served_model_pin),
    }


def build_and_judge(
    context: dg.AssetExecutionContext,
    pipeline: PipelineSettings,
    config: dict[str, Any],
    n_shards: int,
    *,
    keep: int,
    allow_partial: bool = False,
) -> SnapshotResult:
    """Build the snapshot of every gated shard, judged by the publish and drift gates (LATEST moves if they
    pass; the newest `keep` snapshots are kept); a shard left out refuses it unless `allow_partial`."""
    data = pipeline.data_path
    profile = pipeline.profile()

    def judge(facts: SnapshotFacts) -> SnapshotVerdict:
        return judge_snapshot(facts, expectations_dir=pipeline.expectations_path, context_dir=pipeline.gx_context_dir)

    try:
        return build_snapshot(
            data,
            range(n_shards),
            lambda g, k: read_gate_result(data, g, k),
            SnapshotContent(
                config=config, exporters=exporters_for(profile.name, lambda: _tokenizer(profile)), profile=profile
            ),
            policy=PublishPolicy(keep=keep, judge=judge, allow_partial=allow_partial),
            lock=PublishLockOptions(
                run_id=context.run_id,
                local_lock_dir=pipeline.work_path
                / "locks",  # object storage: the lock is a local file (this host only)
                on_wait=context.log.warning,  # another publisher holds the lock / a host-only lock / dead staging removed
            ),
        )
    except DataDirLocked as e:  # another publisher on this data dir still holds the lock: one line naming it
        raise dg.Failure(description=f"training_dataset: {e}", metadata={"lock": str(e.lock_path)}) from None
    except StopRequested as e:  # Ctrl-C / SIGTERM before the LATEST switch: honoured, not retried
        raise dg.Failure(description=f"training_dataset: {e}", allow_retries=False) from None


def excluded_shards(snap: SnapshotResult) -> dict[Any, str]:
    return {d.shard: d.reason for d in snap.shards if not d.included}


def log_snapshot(context: dg.AssetExecutionContext, snap: SnapshotResult) -> None:
    """The snapshot in the step's log: its rows, the shards left out, the data card's warnings, the drift."""
    excluded = excluded_shards(snap)
    context.log.info(f"snapshot {snap.version}: {snap.rows} rows, excluded {excluded or 'none'}")
    # a shard that never ran (no gate result at all) is not news; one that ran and is left out is a warning
    never_ran = sorted(k for k, r in excluded.items() if r == f"no {GATES[0]} gate result")
    if never_ran:
        context.log.info(f"shards never run, not in snapshot {snap.version}: {', '.join(never_ran)}")
    left_out = {k: r for k, r in excluded.items() if k not in never_ran}
    if left_out:
        context.log.warning(f"shards left out of snapshot {snap.version}: {left_out}")
    for problem in (snap.manifest.get("card") or {}).get("warnings", []):  # e.g. a source without a licence
        context.log.warning(f"data card of snapshot {snap.version}: {problem}")
    if snap.verdict is None:
        context.log.info(
            f"snapshot {snap.version} is already LATEST (same content): nothing new to judge; unchanged since "
            f"{snap.manifest.get('published_at')}"
        )
    else:
        drift = snap.verdict.drift
        (context.log.warning if drift is not None and drift.status != "ok" else context.log.info)(drift_line(drift))


def not_published(context: dg.AssetExecutionContext, snap: SnapshotResult) -> dg.Failure:
    """The loud end of a snapshot the gates held back: an ERROR line and the step's failure, LATEST unchanged."""
    verdict = snap.verdict
    why = "; ".join(verdict.reasons if verdict is not None else ["not published"])
    context.log.error(f"snapshot {snap.version} NOT published, LATEST stays {snap.latest or '(none)'}: {why}")
    return dg.Failure(
        description=f"training_dataset: snapshot {snap.version} not published, LATEST unchanged "
        f"({snap.latest or 'none'}): {why}",
        metadata={
            "version": snap.version,
            "rows": snap.rows,
            "latest": str(snap.latest),
            "reasons": dg.MetadataValue.json(verdict.reasons if verdict is not None else []),
        },
    )


def published_metadata(snap: SnapshotResult) -> dict[str, Any]:
    summary: Summary = snap.manifest.get("summary") or Summary()
    # judged now, or (the same content as LATEST) what was decided when it was published
    drift = snap.verdict.drift_status if snap.verdict is not None else (snap.manifest.get("drift") or {}).get("status")
    return {
        "version": snap.version,
        "new_snapshot": snap.created,
        # when this content became LATEST: a rerun that publishes the same content keeps it
        "published_at": str(snap.manifest.get("published_at")),
        "rows": snap.rows,
        **{f"summary/{k}": v for k, v in headline(summary).items() if k != "rows"},
        "drift": drift or "none",
        "shards_included": dg.MetadataValue.json([d.shard for d in snap.shards if d.included]),
        "shards_excluded": dg.MetadataValue.json(excluded_shards(snap)),
        "removed_by_retention": dg.MetadataValue.json(snap.removed_by_retention),
        "exports": dg.MetadataValue.json(snap.manifest.get("exports", {})),
        # kept in token-level exports, flagged in conversations.jsonl, left out of specforge_preformatted.jsonl
        "rows_not_text_exact": int(
            snap.manifest.get("exports", {}).get(SPECFORGE_FILE, {}).get("rows_not_text_exact", 0)
        ),
        "manifest": dg.MetadataValue.path(str(snap.path / "manifest.json")),
        "card": dg.MetadataValue.path(str(snap.path / CARD_FILE)),
        "path": dg.MetadataValue.path(str(snap.path)),
    }


def snapshot_check_results(snap: SnapshotResult, verdict: SnapshotVerdict | None) -> list[dg.AssetCheckResult]:
    """The publish and drift gates as asset checks (the drift severity is the failed expectations' own)."""
    if verdict is None:  # the same content as LATEST: published before, nothing new to judge
        desc = f"snapshot {snap.version} is already LATEST (same content); nothing new to judge"
        return [
            dg.AssetCheckResult(check_name=PUBLISH_CHECK, passed=True, description=desc),
            dg.AssetCheckResult(check_name=DRIFT_CHECK, passed=True, description=desc),
        ]
    pg = verdict.publish_gate
    values = {k: v for k, v in pg.values.items() if k != "row_id" and v is not None}
    out = [
        dg.AssetCheckResult(
            check_name=PUBLISH_CHECK,
            passed=pg.success,
            severity=dg.AssetCheckSeverity.ERROR,
            description=(
                "snapshot may be published"
                if pg.success
                else "NOT published, LATEST unchanged: " + "; ".join(verdict.reasons)
            ),
            metadata={**dict(values.items()), "version": snap.version},
        )
    ]
    d = verdict.drift
    if d is None:
        out.append(dg.AssetCheckResult(check_name=DRIFT_CHECK, passed=True, description=drift_line(None)))
    else:
        held = not verdict.publish and pg.success
        numeric = {
            k: float(v) for k, v in d.gate.values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        out.append(
            dg.AssetCheckResult(
                check_name=DRIFT_CHECK,
                passed=d.status == "ok",
                severity=dg.AssetCheckSeverity.ERROR
                if (d.gate.failed_critical or held)
                else dg.AssetCheckSeverity.WARN,
                description=drift_line(d)
                + (
                    " -- held back, not published"
                    if held
                    else (" -- published, marked drifted in the manifest" if d.status != "ok" else "")
                ),
                metadata={
                    **numeric,
                    "against": str(d.against),
                    "policy": d.policy,
                    "status": d.status,
                    "failed": dg.MetadataValue.json(list(d.failed)),
                },
            )
        )
    return out


def build_defs(s: Settings) -> dg.Definitions:
    return dg.Definitions(assets=[training_dataset_asset(s)])
