"""`drafter_comparison`: judge a candidate drafter against production's on the probe sets, from the UI.

Launch it with the candidate's URLs in the run config (the launchpad opens on it):

    ops:
      drafter_comparison:
        config: {candidate_urls: "http://candidate-0:30000,http://candidate-1:30000"}

It runs drafters.run.compare_candidate (what `eagle3 drafters compare` runs) and materializes the comparison:
the decision, the per-source table, the overall difference and its interval as floats (plotted across
materializations: the history across candidates), and the stored comparison's path. Its check
`promotion_rule` passes only on `promote`. A candidate that cannot be asked (dead, not speculating) fails
the step with the line that names it; nothing is retried.
"""

from typing import Any

import dagster as dg
from pydantic import Field

from ..config import Settings
from ..drafters.candidate import CandidateRefused
from ..drafters.compare import PROMOTE
from ..drafters.lineage import LineageError
from ..drafters.rule import RuleError, load_rule
from ..drafters.run import CANDIDATE_WAIT_S, CompareInputs, CompareRequest, Outcome, compare_candidate
from ..drafters.text import sources_markdown
from ..generate.config import generation_config
from ..generate.endpoint_info import AuthError, EndpointRefusedError, ModelRevisionError, NoEndpointError
from ..ingest.spec import probe_source_names
from ..orchestration.asset_names import ASSET_GROUP, STAGE_TAG, AssetName
from ..orchestration.resources import PipelineSettings, SGLangFleet, cached_renderer
from ..urls import parse_endpoint_urls
from .generate import client_logs_to

STAGE = "drafters"
CHECK = "promotion_rule"
REFUSALS = (CandidateRefused, LineageError, NoEndpointError, EndpointRefusedError, ModelRevisionError, AuthError)


class DrafterComparisonConfig(dg.Config):
    candidate_urls: str = Field(description="the candidate drafter's SGLang endpoint(s), comma-separated")
    baseline: str | None = Field(
        default=None, description="a drafter_id; default: the production fleet's current drafter"
    )
    trained_on: str | None = Field(
        default=None, description="the snapshot that trained the candidate (default: its checkpoint's lineage record)"
    )


def comparison_inputs(
    context: dg.AssetExecutionContext, urls: str, pipeline: PipelineSettings, sglang: SGLangFleet, s: Settings
) -> CompareInputs:
    """The comparison's inputs from the run's resources: production's sampling, regen and probe seed (the
    `sglang` resource), pointed at the candidate; the candidate's own target revision is read, not pinned.
    `s`: the settings the definitions were built from (the API key, the served-model pin, ...)."""
    try:
        rule = load_rule(pipeline.expectations_path)
        endpoints = parse_endpoint_urls(urls, source="run config `candidate_urls`")
    except (RuleError, ValueError) as e:
        raise dg.Failure(description=str(e), allow_retries=False) from None
    # no probe source: the comparison itself refuses (a stored hold naming why), as for any missing baseline
    names = probe_source_names(pipeline.sources_path)
    fields = {
        **sglang.generation_fields(),
        "max_new_tokens": pipeline.max_new_tokens,
        "model_revision": None,
        "max_in_flight": None,
        "wait_for_endpoint_s": CANDIDATE_WAIT_S,
    }
    profile = pipeline.profile()
    config = generation_config(profile, endpoints, s, fields, probe_sources=names)
    return CompareInputs(
        pipeline.data_path,
        pipeline.work_path / "locks",
        rule,
        frozenset(names),
        config,
        log=context.log.info,
        profile=profile,
        renderer=lambda: cached_renderer(profile),  # probe conversations regenerated turn by turn only
    )


def comparison_metadata(outcome: Outcome) -> dict[str, Any]:
    doc = outcome.doc
    overall = doc.get("overall") or {}
    lo, hi = overall.get("interval") or (None, None)
    floats = {"overall_difference": overall.get("difference"), "overall_interval_lo": lo, "overall_interval_hi": hi}
    ids = {f"{role}_drafter_id": (doc.get(role) or {}).get("drafter_id") for role in ("candidate", "production")}
    return {
        "decision": doc["decision"],
        **{k: str(v) for k, v in ids.items() if v},
        "headline": str(doc.get("headline") or doc.get("refused") or ""),
        "sources": dg.MetadataValue.md(sources_markdown(doc)),
        "reasons": dg.MetadataValue.json({"reasons": doc.get("reasons") or [], "notes": doc.get("notes") or []}),
        "candidate": dg.MetadataValue.json(doc.get("candidate") or {}),
        **{k: dg.MetadataValue.float(float(v)) for k, v in floats.items() if v is not None},
        "requests": dg.MetadataValue.json(outcome.requests),
        "comparison": dg.MetadataValue.path(str(outcome.path)),
    }


def promotion_check(outcome: Outcome) -> dg.AssetCheckResult:
    doc = outcome.doc
    said = "; ".join(doc.get("reasons") or [])
    diff = (doc.get("overall") or {}).get("difference")
    return dg.AssetCheckResult(
        check_name=CHECK,
        passed=doc["decision"] == PROMOTE,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{doc['decision']}: {doc.get('headline') or ''} {said}".strip()[:2000],
        metadata={
            "decision": doc["decision"],
            "reasons": dg.MetadataValue.json(doc.get("reasons") or []),
            # plotted by the check's page across executions: the difference each candidate reached
            **({"overall_difference": dg.MetadataValue.float(float(diff))} if diff is not None else {}),
        },
    )


def drafter_comparison_asset(s: Settings) -> dg.AssetsDefinition:
    """`drafter_comparison`, its steps handed the settings `s` the definitions are built from."""

    @dg.asset(
        name=AssetName.DRAFTER_COMPARISON,
        group_name=ASSET_GROUP,
        deps=[AssetName.GENERATIONS],
        kinds={"json"},
        tags={STAGE_TAG: STAGE},
        check_specs=[
            dg.AssetCheckSpec(
                CHECK,
                asset=AssetName.DRAFTER_COMPARISON,
                blocking=False,
                description="Passes only when the comparison's decision is promote (expectations/drafter_promotion.json: "
                "overall accept length better by at least the margin, no probe source worse); ERROR with the reasons on hold.",
            )
        ],
        description="A candidate drafter (run config `candidate_urls`) against production's on the probe sets: the probe "
        "prompts only, production's sampling and probe seed; per source and overall accept length, the difference with a "
        "paired bootstrap interval, a verdict, and promote or hold (docs/drafter-compare.md).",
    )
    def drafter_comparison(
        context: dg.AssetExecutionContext,
        config: DrafterComparisonConfig,
        pipeline: PipelineSettings,
        sglang: SGLangFleet,
    ) -> dg.MaterializeResult:
        inputs = comparison_inputs(context, config.candidate_urls, pipeline, sglang, s)
        request = CompareRequest(tuple(inputs.config.endpoints), config.baseline, config.trained_on)
        try:
            with client_logs_to(context):
                outcome = compare_candidate(inputs, request)
        except REFUSALS as e:
            raise dg.Failure(description=f"candidate refused: {e}", allow_retries=False) from None
        (context.log.info if outcome.decision == PROMOTE else context.log.warning)(
            f"{outcome.decision}: {outcome.doc.get('headline') or outcome.refused}"
        )
        return dg.MaterializeResult(metadata=comparison_metadata(outcome), check_results=[promotion_check(outcome)])

    return drafter_comparison


def build_defs(s: Settings) -> dg.Definitions:
    return dg.Definitions(assets=[drafter_comparison_asset(s)])
