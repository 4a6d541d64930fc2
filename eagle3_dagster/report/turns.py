"""The quality report's section on `regenerate: all_turns` conversations (generate/multiturn.py).

Per shard, from generations/shard=NNNN/turns.json (written by the `generations` step): conversations,
completed, ended early by reason, turns planned / regenerated / not reached, rows per turn index.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from ..generate.multiturn import TURNS_SUMMARY_FILE
from ..storage import DataPath, read_shard_json


def collect_turns(data: DataPath, shards: Iterable[int]) -> dict[str, dict[str, Any]]:
    return read_shard_json(data, "generations", shards, TURNS_SUMMARY_FILE)


def turns_section(turns: dict[str, dict[str, Any]]) -> list[str]:
    if not turns:
        return []
    e = html.escape
    h = [
        "<h2>Multi-turn conversations (regenerate: all_turns)</h2>",
        "<table><tr><th>shard</th><th>conversations</th><th>completed</th><th>ended early (by reason)</th>"
        "<th>turns planned</th><th>regenerated</th><th>not reached</th><th>rows per turn index</th></tr>",
    ]
    for shard, t in sorted(turns.items()):
        ended = ", ".join(f"{e(str(r))} {n}" for r, n in sorted((t.get("conversations_ended_early") or {}).items()))
        by_turn = ", ".join(f"{e(str(k))}: {n}" for k, n in (t.get("rows_by_turn") or {}).items())
        not_reached = sum((t.get("turns_not_reached") or {}).values())
        h.append(
            f'<tr><td>{e(shard)}</td><td class="num">{t.get("conversations", 0)}</td>'
            f'<td class="num">{t.get("conversations_completed", 0)}</td><td>{ended or "—"}</td>'
            f'<td class="num">{t.get("turns_planned", 0)}</td><td class="num">{t.get("turns_regenerated", 0)}</td>'
            f'<td class="num">{not_reached}</td><td>{by_turn}</td></tr>'
        )
    h.append("</table>")
    return h
