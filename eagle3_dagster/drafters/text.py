"""A stored comparison as people read it: the table `eagle3 drafters compare` prints, and the Markdown table of
the asset's metadata. Both read the comparison document (run.Outcome.doc), nothing else."""

from __future__ import annotations

from typing import Any

from ..generate.drafter import redact_draft_path
from ..markdown import code_span


def _f(v: Any, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(float(v), fmt)


def _interval(r: dict[str, Any]) -> str:
    lo, hi = r.get("interval") or (None, None)
    return f"[{_f(lo, '+.3f')}, {_f(hi, '+.3f')}]"


def identity_line(role: str, ident: dict[str, Any] | None) -> str:
    if not ident:
        return f"{role:<11}unknown"
    path = redact_draft_path(ident.get("spec_draft_model_path"))  # a comparison stored before paths were redacted
    model = f"{path or '?'}@{ident.get('spec_draft_model_revision') or 'default'}"
    budget = (
        f", steps {ident.get('spec_num_steps')}, topk {ident.get('spec_eagle_topk')}, "
        f"draft tokens {ident.get('spec_num_draft_tokens')}"
        if ident.get("spec_algorithm")
        else ""
    )
    trained = (ident.get("trained_on") or {}).get("snapshot")
    lineage = f"; trained on snapshot {trained}" if trained else "; snapshot unknown"
    return f"{role:<11}{ident.get('drafter_id')} ({ident.get('spec_algorithm') or '?'} {model}{budget}){lineage}"


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(doc.get("sources") or []), *([doc["overall"]] if doc.get("overall") else [])]


def comparison_table(doc: dict[str, Any]) -> str:
    """The plain-text table: identities, the headline, one line per source and overall, the decision."""
    out = [identity_line("candidate", doc.get("candidate")), identity_line("production", doc.get("production"))]
    if doc.get("headline"):
        out.append(doc["headline"])
    rows = _rows(doc)
    if rows:
        conf = rows[-1].get("confidence", 0.95)
        head = f"{'source':<24}{'prompts':>8}{'production':>12}{'candidate':>11}{'difference':>12}  {f'{conf:.0%} interval':<20}verdict"
        out += ["", head]
        for r in rows:
            out.append(
                f"{r['source']:<24}{r['prompts']:>8}{_f(r['production_accept_length']):>12}"
                f"{_f(r['candidate_accept_length']):>11}{_f(r['difference'], '+.3f'):>12}  {_interval(r):<20}{r['verdict']}"
            )
        out.append("(accept length: completion tokens per verify step, summed over the prompts)")
    out += ["", f"decision: {str(doc['decision']).upper()}"]
    out += [f"  - {x}" for x in doc.get("reasons") or []]
    if doc.get("notes"):
        out += ["notes:", *(f"  - {x}" for x in doc["notes"])]
    return "\n".join(out)


def sources_markdown(doc: dict[str, Any]) -> str:
    """The per-source table as Markdown (the asset's metadata)."""
    rows = _rows(doc)
    if not rows:
        return f"**{doc['decision']}**: {code_span(str(doc.get('refused') or ''))}"
    lines = [
        "| source | prompts | production | candidate | difference | interval | verdict | rates |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        rates = (
            f"{_f(r['production_accept_rate'])} → {_f(r['candidate_accept_rate'])}"
            if r.get("rate_difference") is not None
            else "not compared"
        )
        lines.append(
            f"| {code_span(r['source'])} | {r['prompts']} | {_f(r['production_accept_length'])} | "
            f"{_f(r['candidate_accept_length'])} | {_f(r['difference'], '+.3f')} | {_interval(r)} | {r['verdict']} | {rates} |"
        )
    return "\n".join(lines)
