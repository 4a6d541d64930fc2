"""The quality report updated per gate (issue 17): one shard re-read, the same page as a full rebuild.

After every gate the pipeline calls update_report(shards=[k]): shard k is re-read, the other rows
come from the report's index. The page must be byte-identical to what a full rebuild
(write_report, `eagle3 report`) writes for the same stored results, also after a result changes
and after a Data Docs page is pruned. The cost figure (ms at 1,000 results) is in bench/stages.py.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl
import pytest

from eagle3_dagster.quality import ExpectationOutcome, GateResult, write_gate_result
from eagle3_dagster.quality.retention import DOCS_VALIDATIONS_BASE, VALIDATIONS_BASE, prune_validations
from eagle3_dagster.quality.suites import GATES
from eagle3_dagster.report.html import update_report, write_report
from eagle3_dagster.report.index import index_path

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
N = 6
BROKEN = 'class="badge unreadable"'  # a cell whose stored result could not be read


def _result(gate: str, shard: int, *, ok: bool, page: Path | None = None) -> GateResult:
    bad = 0 if ok else 2 + shard
    failures = pl.DataFrame(
        {"row_id": [f"r{shard}-{i}" for i in range(bad)], "reasons": [["think-end present"]] * bad},
        schema={"row_id": pl.String, "reasons": pl.List(pl.String)},
    )
    outcomes = [
        ExpectationOutcome(
            name="think-end present",
            severity="critical",
            mostly=0.95,
            pass_rate=(10 - bad) / 10,
            unexpected_count=bad,
            success=ok,
            description="d",
            key="think_end_present",
            evaluated=10,
        ),
        ExpectationOutcome(
            name="source mix",
            severity="warning",
            mostly=1.0,
            pass_rate=0.0,
            unexpected_count=0,
            success=shard % 2 == 0,
            description="d",
            key="source_mix",
            level="table",
            observed_value={"gsm8k": 0.7 + shard / 100},
        ),
    ]
    return GateResult(
        gate,
        ok,
        outcomes,
        row_failures=failures,
        n_rows=10,
        profile="kimi-k2.5",
        created_at=f"2026-12-03T10:{shard:02d}:00+00:00",
        data_docs_page=str(page) if page else None,
        by_source={"gsm8k": [7, bad], "ultrachat": [3, 0]},
    )


@pytest.fixture()
def dirs(tmp_path: Path) -> dict[str, Path]:
    data = work = tmp_path / "data"
    site = work / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site"
    (site).mkdir(parents=True)
    (site / "index.html").write_text("<html>index</html>")
    pages = []
    for k in range(N):
        p = site / "validations" / "generations_gate" / "__none__" / f"2026120{k}T000000.000000Z" / "x.html"
        p.parent.mkdir(parents=True)
        p.write_text("<html>page</html>")
        pages.append(p)
    rejects = pl.DataFrame({"prompt_id": ["a", "b"], "reason": ["too_long", "empty"]})
    (data / "tokenized_prompts" / "shard=0001").mkdir(parents=True)
    rejects.write_parquet(data / "tokenized_prompts" / "shard=0001" / "rejects.parquet")
    _write_turns(data, 2, conversations=5)
    return {"data": data, "work": work, "site": site, "pages": pages}  # type: ignore[dict-item]


def _write_turns(data: Path, shard: int, *, conversations: int) -> None:
    """generations/shard=NNNN/turns.json, as the generations step of an all_turns source writes it."""
    f = data / "generations" / f"shard={shard:04d}" / "turns.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    turns = {"conversations": conversations, "conversations_completed": conversations - 1, "turns_planned": 9}
    f.write_text(json.dumps({**turns, "conversations_ended_early": {"length": 1}, "rows_by_turn": {"0": 3}}))


def _store_and_update(d: dict, gate: str, shard: int, res: GateResult) -> str:
    write_gate_result(d["data"], gate, shard, res)
    out = update_report(d["data"], d["work"], shards=[shard], n_shards=4, profile="kimi-k2.5", now=NOW)
    return out.read_text()


def _full(d: dict) -> str:
    return write_report(d["data"], d["work"], n_shards=4, profile="kimi-k2.5", now=NOW).read_text()


def test_incremental_updates_write_the_same_page_as_a_full_rebuild(dirs):
    d = dirs
    incremental = ""
    for k in range(N):  # shards 4 and 5 lie beyond n_shards: listed because they have results
        for g in GATES:
            ok = not (g == "generations" and k in (1, 4))
            incremental = _store_and_update(d, g, k, _result(g, k, ok=ok, page=d["pages"][k]))
    index_after_updates = index_path(d["work"] / "reports" / "index.html").read_text()
    assert incremental == _full(d)
    assert index_path(d["work"] / "reports" / "index.html").read_text() == index_after_updates
    assert "shard-0005" in incremental and "too_long" in incremental  # rows beyond n_shards, other rejects
    assert "Multi-turn conversations" in incremental  # shard 2's turns.json (kept in the index)

    # shard 2's generations step ran again (new turns.json), then its gate: the update shows it
    _write_turns(d["data"], 2, conversations=8)
    regenerated = _store_and_update(d, "generations", 2, _result("generations", 2, ok=True, page=d["pages"][2]))
    assert regenerated != incremental and regenerated == _full(d)

    # a result changes (a re-run of shard 1 passes now): the update shows it, as a rebuild would
    changed = _store_and_update(d, "generations", 1, _result("generations", 1, ok=True, page=d["pages"][1]))
    assert changed != incremental and changed == _full(d)

    # a Data Docs page pruned (retention, at an index refresh) is no longer linked, as in a rebuild:
    # the pruning rewrites the context's prune stamp, so the next update re-checks the linked pages
    gx_root = d["work"] / "gx" / "gx"
    for page in d["pages"]:  # each page's stored result (same run folder)
        run = page.parent.relative_to(gx_root / DOCS_VALIDATIONS_BASE)
        (gx_root / VALIDATIONS_BASE / run).mkdir(parents=True)
        (gx_root / VALIDATIONS_BASE / run / "x.json").write_text("{}")
    assert prune_validations(gx_root, "generations_gate", N - 1).pages_removed == 1  # the oldest: shard 0's
    assert not d["pages"][0].exists()
    after_prune = _store_and_update(d, "prompts", 1, _result("prompts", 1, ok=True, page=d["pages"][1]))
    assert "2026120" + "0T000000" not in after_prune and after_prune == _full(d)


def test_update_rereads_only_its_shard_and_rebuilds_without_an_index(dirs):
    d = dirs
    for k in range(3):
        write_gate_result(d["data"], "prompts", k, _result("prompts", k, ok=True))
    _full(d)
    # shard 2's stored result becomes unreadable; an update of shard 0 does not read it again...
    f = d["data"] / "gates" / "prompts" / "shard=0002.json"
    f.write_text("{not json")
    page = _store_and_update(d, "prompts", 0, _result("prompts", 0, ok=False))
    assert BROKEN not in page
    # ...a full rebuild does, and so does an update without (or with a foreign) index
    assert BROKEN in _full(d)
    f.write_text(json.dumps(_result("prompts", 2, ok=True).to_json(include_rows=False)))
    index_path(d["work"] / "reports" / "index.html").write_text(json.dumps({"version": 0}))
    rebuilt = _store_and_update(d, "prompts", 1, _result("prompts", 1, ok=True))
    assert BROKEN not in rebuilt and rebuilt == _full(d)
    index_path(d["work"] / "reports" / "index.html").unlink()
    f.write_text("{not json")
    assert BROKEN in _store_and_update(d, "prompts", 1, _result("prompts", 1, ok=True))
