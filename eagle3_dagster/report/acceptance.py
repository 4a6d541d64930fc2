"""The quality report's section on the drafter's acceptance (quality/acceptance.py, per shard acceptance.json):
by source, by turn, by output length, with and without tool calls, by drafter, the weakest sources and
prompts, and the accepted-drafts histogram, summed over the report's shards (generate/group_acceptance.py: one
definition of a group's figures); rows whose figures failed their checks are left out and said so."""

from __future__ import annotations

import html
from typing import Any

from ..generate.group_acceptance import GroupAcceptance
from ..quality.acceptance import merge_groups, summary_group

_TABLES = (
    ("by_source", "source"),
    ("by_turn", "turn (multi-turn chats and agent loops; 1: a single-turn prompt)"),
    ("by_length", "output length (tokens)"),
    ("by_tools", "tool calls"),
    ("by_drafter", "drafter_id"),
)


def _fmt(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _table(title: str, groups: dict[str, GroupAcceptance], order: list[str] | None = None) -> list[str]:
    e = html.escape
    left_out = any(g.left_out for g in groups.values())
    h = [
        f"<h3>{e(title)}</h3>",
        "<table><tr><th></th><th>rows</th><th>accept length</th><th>accept rate</th><th>verify steps</th>"
        + ("<th>left out (flagged)</th>" if left_out else "")
        + "</tr>",
    ]
    for name in order or list(groups):
        g = groups[name]
        h.append(
            f'<tr><td>{e(name)}</td><td class="num">{g.rows}</td><td class="num">{_fmt(g.accept_length)}</td>'
            f'<td class="num">{_fmt(g.accept_rate)}</td><td class="num">{g.verify_steps}</td>'
            + (f'<td class="num">{g.left_out}</td>' if left_out else "")
            + "</tr>"
        )
    h.append("</table>")
    return h


def _histogram(summaries: list[dict[str, Any]]) -> list[str]:
    total: list[int] = []
    for s in summaries:
        for k, n in enumerate(s.get("histogram") or []):
            total += [0] * (k + 1 - len(total))
            total[k] += int(n)
    steps = sum(total)
    if not steps:
        return []
    cells = "".join(
        f'<tr><td class="num">{k}</td><td class="num">{n}</td><td class="num">{100 * n / steps:.1f}%</td></tr>'
        for k, n in enumerate(total)
    )
    return [
        "<h3>accepted drafts per verify step (histogram)</h3>",
        f"<table><tr><th>drafts accepted</th><th>verify steps</th><th>share</th></tr>{cells}</table>",
    ]


def acceptance_section(acceptance: dict[str, dict[str, Any]], *, weakest_sources: int = 5) -> list[str]:
    summaries = [acceptance[k] for k in sorted(acceptance)]
    if not summaries:
        return []
    e = html.escape
    a = sum((summary_group(s) for s in summaries), GroupAcceptance())
    left_out = a.left_out_text()
    h = [
        "<h2>Drafter acceptance (speculative decoding)</h2>",
        f"<p>{a.rows} rows with the speculating server's figures over {len(summaries)} shard(s): "
        f"accept length {_fmt(a.accept_length)} tokens per verify step (bonus token included, Σ tokens / Σ verify "
        f"steps), accept rate {_fmt(a.accept_rate)} (Σ accepted / Σ proposed drafts). Measured at the "
        "regeneration's sampling settings; a cached row keeps the figures of the run that generated it.</p>",
        *([f'<p class="warnbox">{e(left_out)}: not in any figure below.</p>'] if left_out else []),
    ]
    for key, title in _TABLES:
        groups = merge_groups(summaries, key)
        if groups:
            h += _table(title, groups)
    by_source = merge_groups(summaries, "by_source")
    ranked = sorted(
        (n for n in by_source if by_source[n].accept_rate is not None), key=lambda n: by_source[n].accept_rate or 0.0
    )
    if len(ranked) > 1:
        h += _table("weakest sources (lowest accept rate)", by_source, ranked[:weakest_sources])
    weak = sorted((w for s in summaries for w in s.get("weakest_prompts") or []), key=lambda w: w["accept_rate"])[:10]
    if weak:
        h.append("<h3>weakest prompts (lowest accept rate)</h3>")
        h.append("<table><tr><th>sample_id</th><th>prompt_id</th><th>source</th><th>turn</th><th>accept rate</th></tr>")
        h += [
            f"<tr><td>{e(str(w['sample_id']))}</td><td>{e(str(w['prompt_id']))}</td><td>{e(str(w['source']))}</td>"
            f'<td>{e(str(w["turn"]))}</td><td class="num">{_fmt(w["accept_rate"])}</td></tr>'
            for w in weak
        ]
        h.append("</table>")
    return h + _histogram(summaries)
