"""GX validation results do not pile up: the quality report's Data Docs build keeps the newest N per suite,
results and pages, and its index links only pages that exist (the gates store, the report prunes)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from quality_helpers import tokenized_rows

from eagle3_dagster.quality import gx_docs, prompt_features, run_gate
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


def test_the_report_build_keeps_only_the_newest_n_validations(feats, kimi_profile, gx_dirs):
    ctx_dir = gx_dirs["context_dir"]
    gx_root = ctx_dir / "gx"
    results_base, pages_base = gx_root / VALIDATIONS_BASE, gx_root / DOCS_VALIDATIONS_BASE
    order: list[str] = []
    for _ in range(6):
        before = _runs(results_base)
        assert run_gate("prompts", feats, profile=kimi_profile, **gx_dirs).success
        (new,) = _runs(results_base) - before  # this run's result
        order.append(new)
    assert sorted(order) == order  # run folders sort by time
    assert _runs(results_base) == set(order)  # the gates store; they prune nothing

    index = gx_docs.build_data_docs(ctx_dir, 3)
    assert index is not None
    assert _runs(results_base) == set(order[-3:]) and _runs(pages_base) == set(order[-3:])  # the newest, with pages
    assert _files(results_base) == 3 and _files(pages_base) == 3
    html = index.read_text()
    assert not any(old in html for old in order[:-3]) and all(kept in html for kept in order[-3:])
    assert _dangling_links(index) == []

    # 0 keeps everything; a smaller keep prunes the results and their pages together
    run_gate("prompts", feats, profile=kimi_profile, **gx_dirs)
    gx_docs.build_data_docs(ctx_dir, 0)
    assert len(_runs(results_base)) == len(_runs(pages_base)) == 4
    gx_docs.build_data_docs(ctx_dir, 2)
    assert len(_runs(results_base)) == len(_runs(pages_base)) == 2
    assert _dangling_links(index) == []


def test_concurrent_gate_runs_then_one_build_stay_capped(feats, kimi_profile, gx_dirs):
    # several shard runs validate at once on one context; the report prunes once, under the context lock
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: run_gate("prompts", feats, profile=kimi_profile, **gx_dirs), range(6)))
    assert all(r.success for r in results)
    index = gx_docs.build_data_docs(gx_dirs["context_dir"], 2)
    assert index is not None and _dangling_links(index) == []
    gx_root = gx_dirs["context_dir"] / "gx"
    assert len(_runs(gx_root / VALIDATIONS_BASE)) == 2 and len(_runs(gx_root / DOCS_VALIDATIONS_BASE)) == 2
    assert sum(Path(r.data_docs_page).is_file() for r in results) == 2


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
    assert settings().stages.gx_keep_validations == 20
    monkeypatch.setenv("EAGLE3_GX_KEEP_VALIDATIONS", "0")
    assert settings().stages.gx_keep_validations == 0
    for bad in ("-1", "many"):
        monkeypatch.setenv("EAGLE3_GX_KEEP_VALIDATIONS", bad)
        with pytest.raises(ValueError, match="EAGLE3_GX_KEEP_VALIDATIONS"):
            settings()
