"""Data Docs per gate (issue 17): each gate renders its own page, the index is rebuilt only when due.

- gates inside the refresh interval do not rewrite the index, but every gate's page exists, its
  result and its Dagster check link it, and the index never links a deleted page;
- the end-of-run refresh (`refresh_docs_index`, run by training_dataset and `eagle3 report`) prunes
  to the newest `keep` and the index then lists exactly the kept pages;
- the refresh never fails the asset: a failure is a warning naming the cause.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from quality_helpers import generation_rows, tokenized_rows

from eagle3_dagster.defs import report as report_defs
from eagle3_dagster.orchestration.gates import gate_check_results
from eagle3_dagster.quality import generation_features, gx_context, prompt_features, run_gate
from eagle3_dagster.quality.retention import DOCS_INDEX, VALIDATIONS_BASE


def _linked_pages(index: Path) -> set[str]:
    return set(re.findall(r'(validations/[^"\\\s<>]+?\.html)', index.read_text()))


def _pages_on_disk(site: Path) -> set[str]:
    return {p.relative_to(site).as_posix() for p in (site / "validations").rglob("*.html")}


def test_gates_render_their_pages_and_the_index_only_when_due(kimi, kimi_profile, gx_dirs):
    feats = prompt_features(tokenized_rows(kimi, {"p0": "What is 2+2?", "p1": "Name a prime."}), kimi_profile)
    ctx_dir = gx_dirs["context_dir"]
    gx_root = ctx_dir / "gx"
    index = gx_root / DOCS_INDEX
    site = index.parent
    results = []
    for i in range(4):
        res = run_gate("prompts", feats, profile=kimi_profile, keep_validations=2, **gx_dirs)
        results.append(res)
        if i == 0:
            written = index.stat().st_mtime_ns  # built by the first gate (it was missing)
        # not rebuilt by the later gates (inside the refresh interval)
        assert index.stat().st_mtime_ns == written
        # this gate's own page exists, its result and its check link it
        page = Path(res.data_docs_page)
        assert page.is_file() and page.parent.name in {p.name for p in (gx_root / VALIDATIONS_BASE).glob("*/*/*")}
        (check,) = [c for c in gate_check_results("prompts", res, ()) if c.check_name == "prompts_gate"]
        assert check.metadata["data_docs_page"].value == "file://" + str(page)
        assert check.metadata["data_docs"].value == "file://" + str(index)
        # the index never links a page that is gone (pruning waits for the rebuild)
        assert all((site / p).is_file() for p in _linked_pages(index))
    assert _linked_pages(index) == {Path(results[0].data_docs_page).relative_to(site).as_posix()}
    assert len(_pages_on_disk(site)) == 4  # newest 2 + those stored since the last rebuild

    # the end of the run: pruned to the newest 2, the index lists exactly their pages
    assert gx_context.refresh_docs_index(ctx_dir, 2) == index
    kept = {Path(r.data_docs_page).relative_to(site).as_posix() for r in results[-2:]}
    assert _pages_on_disk(site) == kept and _linked_pages(index) == kept
    assert len(list((gx_root / VALIDATIONS_BASE).rglob("*.json"))) == 2
    assert not any(Path(r.data_docs_page).exists() for r in results[:2])


def test_a_suite_s_first_page_is_listed_at_once(kimi, kimi_profile, gx_dirs):
    # the index is fresh after the prompts gate; the generations gate's suite is new to the site, so
    # the index is rebuilt to list it (what a user opening Data Docs after one shard run expects)
    tokenized = tokenized_rows(kimi, {"p0": "What is 2+2?"})
    run_gate("prompts", prompt_features(tokenized, kimi_profile), profile=kimi_profile, **gx_dirs)
    gens = generation_rows([dict(sample_id="s0", prompt_id="p0", output_ids=kimi.output("Add.", "4."))])
    res = run_gate("generations", generation_features(gens, tokenized, kimi_profile), profile=kimi_profile, **gx_dirs)
    html = Path(res.data_docs_index).read_text()
    assert "expectations/prompts_gate.html" in html and "expectations/generations_gate.html" in html


def test_refresh_without_a_site_prunes_and_builds_no_docs(kimi, kimi_profile, gx_dirs):
    feats = prompt_features(tokenized_rows(kimi, {"p0": "What is 2+2?"}), kimi_profile)
    for _ in range(3):
        run_gate("prompts", feats, profile=kimi_profile, build_docs=False, keep_validations=0, **gx_dirs)
    gx_root = gx_dirs["context_dir"] / "gx"
    assert len(list((gx_root / VALIDATIONS_BASE).rglob("*.json"))) == 3
    assert gx_context.refresh_docs_index(gx_dirs["context_dir"], 1) is None  # no site: none is made
    assert len(list((gx_root / VALIDATIONS_BASE).rglob("*.json"))) == 1
    assert not list((gx_root / "uncommitted" / "data_docs").rglob("*.html"))
    assert gx_context.refresh_docs_index(gx_dirs["context_dir"].parent / "nothing", 1) is None  # no context


def test_end_of_run_refresh_failure_is_a_warning_not_a_failed_asset(monkeypatch, tmp_path):
    def broken(context_dir: Path, keep: int) -> Path:
        raise PermissionError(f"{context_dir}: read-only")

    monkeypatch.setattr(report_defs, "refresh_docs_index", broken)
    warnings: list[str] = []
    log = SimpleNamespace(warning=warnings.append)
    pipeline = SimpleNamespace(gx_context_dir=tmp_path / "gx", gx_keep_validations=20)
    assert report_defs.refresh_data_docs(log, pipeline) is None
    assert warnings == [f"GX Data Docs index not refreshed: PermissionError: {tmp_path / 'gx'}: read-only"]


def test_eagle3_report_brings_the_data_docs_index_up_to_date(kimi, kimi_profile, gx_dirs, capsys):
    from eagle3_dagster.app.cli import main as eagle3

    feats = prompt_features(tokenized_rows(kimi, {"p0": "What is 2+2?"}), kimi_profile)
    results = [run_gate("prompts", feats, profile=kimi_profile, **gx_dirs) for _ in range(3)]
    index = Path(results[0].data_docs_index)
    site = index.parent
    assert len(_linked_pages(index)) == 1  # the later gates did not rebuild it (inside the interval)
    work = gx_dirs["context_dir"].parent
    assert eagle3(["report", "--data-dir", str(work), "--work-dir", str(work)]) == 0
    assert _linked_pages(index) == _pages_on_disk(site) and len(_pages_on_disk(site)) == 3
