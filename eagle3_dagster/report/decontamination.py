"""The quality report's decontamination section, from data/prompts/decontamination.json
(written by ingest.pipeline.combine_sources; rule in ingest/decontaminate.py).

    collect_decontamination(data) -> dict | None    (None: the prompts stage has not run)
    decontamination_section(summary) -> list[str]   (HTML lines; [] for None)
"""

from __future__ import annotations

import html
import json
from typing import Any

from ..ingest.pipeline import DECONTAMINATION_FILE
from ..storage import DataPath


def collect_decontamination(data: DataPath) -> dict[str, Any] | None:
    f = data / "prompts" / DECONTAMINATION_FILE
    try:
        return json.loads(f.read_text()) if f.exists() else None
    except ValueError:
        return {"unreadable": str(f)}


def decontamination_section(summary: dict[str, Any] | None) -> list[str]:
    if summary is None:
        return []
    h = ["<h2>Decontamination</h2>"]
    if "unreadable" in summary:
        return [*h, f"<p>{html.escape(summary['unreadable'])} is not valid JSON; re-run the prompts stage.</p>"]
    evals = summary.get("eval_sources") or []
    if not evals:
        return [
            *h,
            "<p>No eval source declared (<code>role: eval</code> in a source YAML): the training prompts were "
            "not checked against any benchmark.</p>",
        ]
    n = int(summary.get("ngram", 13))
    checked = int(summary.get("training_prompts_checked", 0))
    h.append(
        f'<p class="small">Every training prompt (user turns) checked against every eval prompt: exact match after '
        f"normalisation (invisible format characters dropped, NFKC, lowercase, punctuation and symbols as word "
        "boundaries), or shared {n}-grams / "
        f"min(training, eval) {n}-grams at least the eval source's overlap threshold. Removed prompts are reject rows "
        "<code>eval_overlap</code> in prompts/prompt_rejects.parquet, naming the eval prompt.</p>"
    )
    h.append(
        "<table><tr><th>eval source</th><th>eval prompts</th><th>overlap threshold</th>"
        "<th>training prompts checked</th><th>removed: exact</th>"
        f"<th>removed: {n}-gram</th><th>removed</th></tr>"
    )
    for e in evals:
        exact, ngram = int(e.get("exact", 0)), int(e.get("ngram", 0))
        h.append(
            f"<tr><td><code>{html.escape(str(e.get('source')))}</code></td>"
            f'<td class="num">{int(e.get("eval_prompts", 0))}</td>'
            f'<td class="num">{float(e.get("overlap_threshold", 0)):g}</td><td class="num">{checked}</td>'
            f'<td class="num">{exact}</td><td class="num">{ngram}</td><td class="num">{exact + ngram}</td></tr>'
        )
    h.append("</table>")
    by_source = summary.get("eval_overlap_by_training_source") or {}
    if by_source:
        parts = ", ".join(f"{html.escape(str(k))} {int(v)}" for k, v in sorted(by_source.items()))
        h.append(f'<p class="small">Removed by training source: {parts}.</p>')
    return h
