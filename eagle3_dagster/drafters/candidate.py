"""What a candidate endpoint serves, read before anything is sent to it, and why it may be refused.

A candidate is one or more SGLang endpoints (servers or routers) running the drafter to judge. Each is
asked, with a short timeout (a dead one is named within seconds), what drafter it runs (/server_info, a
router's workers') and which target model and weights (/model_info). It is refused, with one line naming
it, when it does not answer, does not speculate, its endpoints disagree, or (`target_problem`) it serves
another target model or weight version than production's probe results were generated on: its
acceptance would not be comparable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from ..generate.drafter import DrafterIdentity
from ..generate.endpoint_info import describe_error, display_url, model_revision_of
from ..generate.fleet_capacity import probe_fleet
from ..generate.tls import tls_context

PROBE_TIMEOUT_S = 3.0  # per request of the pre-check: a dead candidate is named in seconds


class CandidateRefused(Exception):
    """The candidate cannot be compared; str(e) is the line that says why (one per problem)."""


@dataclass(frozen=True)
class CandidateServer:
    """The candidate as its endpoints describe themselves (all of them agree)."""

    endpoints: tuple[str, ...]  # display form (no credentials)
    drafter: DrafterIdentity
    model_revision: str  # /model_info `<model_path>@<weight_version>`, as production's rows record theirs
    model_path: str | None
    weight_version: str | None


def _model_info(client: httpx.Client, url: str) -> tuple[dict[str, Any] | None, str]:
    for path in ("/model_info", "/get_model_info"):  # 0.5.23 names it /model_info; older servers and routers the other
        try:
            r = client.get(url.rstrip("/") + path)
        except httpx.HTTPError as e:
            return None, describe_error(e, path, PROBE_TIMEOUT_S)
        if r.status_code == 200:
            try:
                info = r.json()
            except ValueError:
                return None, f"{path} answered something that is not JSON"
            return (info, "") if isinstance(info, dict) else (None, f"{path} answered {type(info).__name__}")
    return None, f"/model_info answered {r.status_code}"


def _drafters(urls: Iterable[str], headers: Mapping[str, str]) -> dict[str, DrafterIdentity]:
    """Each endpoint's drafter; CandidateRefused naming every endpoint that is dead or does not speculate."""
    found: dict[str, DrafterIdentity] = {}
    problems: list[str] = []
    for cap in probe_fleet(list(urls), timeout_s=PROBE_TIMEOUT_S, headers=headers):
        if not cap.drafter_known:
            problems.append(f"candidate {cap.endpoint} does not answer as SGLang: {cap.why or 'no /server_info'}")
        elif cap.drafter is None:
            problems.append(
                f"candidate {cap.endpoint} does not speculate: its /server_info names no drafter "
                "(speculative_algorithm / speculative_draft_model_path)"
            )
        else:
            found[cap.endpoint] = cap.drafter
    if problems:
        raise CandidateRefused("\n".join(problems))
    if len(set(found.values())) > 1:
        raise CandidateRefused(
            "the candidate's endpoints run different drafters (compare one drafter at a time): "
            + "; ".join(f"{e}: {d.describe()}" for e, d in found.items())
        )
    return found


def inspect_candidate(urls: Iterable[str], *, headers: Mapping[str, str] | None = None) -> CandidateServer:
    """The candidate's drafter and target model, from each endpoint; CandidateRefused when it cannot be used."""
    urls = [u.rstrip("/") for u in urls]
    if not urls:
        raise CandidateRefused("no candidate URL given (--candidate URL[,URL...])")
    drafters = _drafters(urls, dict(headers or {}))
    revisions: dict[str, tuple[str, Any, Any]] = {}
    with httpx.Client(
        timeout=PROBE_TIMEOUT_S, headers=dict(headers or {}), trust_env=False, verify=tls_context()
    ) as client:
        for url in urls:
            info, why = _model_info(client, url)
            if info is None:
                raise CandidateRefused(f"candidate {display_url(url)}: cannot read its target model: {why}")
            revisions[display_url(url)] = (model_revision_of(info), info.get("model_path"), info.get("weight_version"))
    if len({r[0] for r in revisions.values()}) > 1:
        raise CandidateRefused(
            "the candidate's endpoints serve different target models or weights: "
            + "; ".join(f"{e}: {r[0]}" for e, r in revisions.items())
        )
    rev, path, weights = next(iter(revisions.values()))
    return CandidateServer(
        tuple(drafters),
        next(iter(drafters.values())),
        rev,
        str(path) if path is not None else None,
        str(weights) if weights is not None else None,
    )


def target_problem(candidate: CandidateServer, production_revisions: Iterable[str]) -> str | None:
    """Why the candidate's target is not production's (None: it is the same model and weights). Production's
    revisions are the `model_revision` its probe rows record (`<model_path>@<weight_version>`)."""
    known = sorted({r for r in production_revisions if r})
    if not known or candidate.model_revision in known:
        return None
    return (
        f"candidate serves {candidate.model_revision} (its /model_info model_path@weight_version), but production's "
        f"probe results were generated on {', '.join(known)}: another target model or revision, whose acceptance "
        "is not comparable; point --candidate at servers of the production target"
    )
