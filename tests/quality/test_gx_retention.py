"""GX validation results do not pile up: only the newest N per suite stay, results and Data Docs pages
(plus those stored since the last index rebuild, which prunes), and the Data Docs index links only
pages that exist."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from quality_helpers import tokenized_rows

from eagle3_dagster.quality import gx_context, gx_docs, prompt_features, run_gate
from eagle3_dagster.quality.retention import DOCS_VALIDATIONS_BASE, VALIDATIONS_BASE, prune_validations

SUITE = "prompts_gate"


@pytest.fixture()
def feats(kimi, kimi_profile):
    return prompt_features(tokenized_rows(kimi, {"p0": "What is 2+2?", "p1": "Name a prime."}), kimi_profile)


def _runs(base: Path) -> set[str]:
    d = base / SUITE
    return {p.name for p in d.glob("*/*") if p.is_dir()} if d.exists() else set()


def _files(base: Path) -> int:
    return sum(1 for p in (base / SUITE).rglob("*") if p.is_file()) if (base / SUITE).exists() else 0


def _dangling_links(index: Path) -> list[str]:
    html = index.read_text()
    links = set(re.findall(r'((?:validations|expectations)/[^"\\\s<>]+?\.html)', html))
    assert links, "the index links no page at all"
    return sorted(link for link in links if not (index.parent / link).exists())


def _age_index(index: Path) -> None:
    """Make the Data Docs index older than the refresh interval (as if the run went on for a while)."""
    old = index.stat().st_mtime - gx_docs.DOCS_INDEX_REFRESH_S - 1
    os.utime(index, (old, old))


def test_gate_keeps_only_the_newest_n_validations(feats, kimi_profile, gx_dirs):
    gx_dirs = {**gx_dirs, "keep_validations": 3}
    ctx_dir = gx_dirs["context_dir"]
    gx_root = ctx_dir / "gx"
    results_base, pages_base = gx_root / VALIDATIONS_BASE, gx_root / DOCS_VALIDATIONS_BASE
    order: list[str] = []
    index = None
    for i in range(6):
        before = _runs(results_base)
        res = run_gate("prompts", feats, profile=kimi_profile, **gx_dirs)
        assert res.success
        (new,) = _runs(results_base) - before  # this run's result
        order.append(new)
        index = Path(res.data_docs_index)
        assert Path(res.data_docs_page).is_file() and new in res.data_docs_page  # its own page, linked
        # pruned only with an index rebuild: the newest 3 plus those stored since. The first gate
        # built the index; the fifth finds it due (aged below) and prunes to 3; the sixth adds one.
        assert len(_runs(results_base)) == {4: 3, 5: 4}.get(i, i + 1)
        assert _dangling_links(index) == []
        if i == 3:
            _age_index(index)  # the next gate finds the index due: prunes, then rebuilds it
    assert sorted(order) == order  # run folders sort by time
    # gate 5 pruned to the newest 3 (runs 2..4) and rebuilt the index; gate 6 stored one more since
    assert _runs(results_base) == set(order[2:]) and _runs(pages_base) == set(order[2:])
    assert all(o in index.read_text() for o in order[2:5]) and order[5] not in index.read_text()

    # the end-of-run refresh: exactly the newest 3, results and pages, and the index lists exactly them
    assert gx_context.refresh_docs_index(ctx_dir, 3) == index
    assert _runs(results_base) == set(order[-3:])  # the newest survive
    assert _runs(pages_base) == set(order[-3:])  # and exactly their pages
    assert _files(results_base) == 3 and _files(pages_base) == 3
    html = index.read_text()
    for old in order[:-3]:
        assert old not in html
    for kept in order[-3:]:
        assert kept in html
    assert _dangling_links(index) == []

    # a run without docs still prunes, and rewrites the index so no link dangles
    res = run_gate("prompts", feats, profile=kimi_profile, build_docs=False, **gx_dirs)
    assert res.data_docs_index is None
    assert len(_runs(results_base)) == 3 and order[-3] not in _runs(results_base)
    assert order[-3] not in _runs(pages_base)
    assert _dangling_links(index) == []

    # 0 keeps everything
    del gx_dirs["keep_validations"]
    run_gate("prompts", feats, profile=kimi_profile, keep_validations=0, **gx_dirs)
    assert len(_runs(results_base)) == 4
    gx_context.refresh_docs_index(ctx_dir, 0)
    assert len(_runs(results_base)) == 4
    run_gate("prompts", feats, profile=kimi_profile, keep_validations=2, **gx_dirs)
    gx_context.refresh_docs_index(ctx_dir, 2)
    assert len(_runs(results_base)) == 2 and len(_runs(pages_base)) == 2
    assert _dangling_links(index) == []


def test_concurrent_gate_runs_stay_capped(feats, kimi_profile, gx_dirs):
    # several shard runs validate at once on one context: the pruning is under the context lock
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda _: run_gate("prompts", feats, profile=kimi_profile, keep_validations=2, **gx_dirs), range(6)
            )
        )
    assert all(r.success for r in results)
    assert all(Path(r.data_docs_page).is_file() for r in results)
    index = Path(results[-1].data_docs_index)
    assert _dangling_links(index) == []
    gx_context.refresh_docs_index(gx_dirs["context_dir"], 2)
    gx_root = gx_dirs["context_dir"] / "gx"
    assert len(_runs(gx_root / VALIDATIONS_BASE)) == 2 and len(_runs(gx_root / DOCS_VALIDATIONS_BASE)) == 2
    assert _dangling_links(index) == []


def test_prune_removes_orphan_pages_and_leaves_other_suites(tmp_path):
    gx_root = tmp_path / "gx"
    for base in (VALIDATIONS_BASE, DOCS_VALIDATIONS_BASE):
        for suite in (SUITE, "generations_gate"):
            for t in ("20260101T000000.000000Z", "20260102T000000.000000Z", "20260103T000000.000000Z"):
                d = gx_root / base / suite / "__none__" / t
                d.mkdir(parents=True)
                (d / "x.json").write_text("{}")
    # a page whose result is gone
    (gx_root / DOCS_VALIDATIONS_BASE / SUITE / "__none__" / "20251231T000000.000000Z").mkdir()
    st = prune_validations(gx_root, SUITE, 1)
    assert (st.results_removed, st.pages_removed) == (2, 3)
    assert _runs(gx_root / VALIDATIONS_BASE) == {"20260103T000000.000000Z"}
    assert _runs(gx_root / DOCS_VALIDATIONS_BASE) == {"20260103T000000.000000Z"}
    assert len(list((gx_root / VALIDATIONS_BASE / "generations_gate").glob("*/*"))) == 3  # untouched
    assert prune_validations(gx_root, SUITE, -1).results_removed == 0


def test_keep_setting_is_validated(monkeypatch):
    from eagle3_dagster.config import settings

    monkeypatch.delenv("EAGLE3_GX_KEEP_VALIDATIONS", raising=False)
    assert settings().gx_keep_validations == 20
    monkeypatch.setenv("EAGLE3_GX_KEEP_VALIDATIONS", "0")
    assert settings().gx_keep_validations == 0
    for bad in ("-1", "many"):
        monkeypatch.setenv("EAGLE3_GX_KEEP_VALIDATIONS", bad)
        with pytest.raises(ValueError, match="EAGLE3_GX_KEEP_VALIDATIONS"):
            settings()


def test_runs_without_docs_prune_and_build_no_docs(feats, kimi_profile, gx_dirs):
    gx_root = gx_dirs["context_dir"] / "gx"
    for _ in range(3):
        res = run_gate("prompts", feats, profile=kimi_profile, build_docs=False, keep_validations=2, **gx_dirs)
        assert res.data_docs_index is None
    assert len(_runs(gx_root / VALIDATIONS_BASE)) == 2
    assert not (gx_root / "uncommitted" / "data_docs" / "local_site" / "index.html").exists()
    assert not list((gx_root / "uncommitted" / "data_docs").rglob("*.html"))
