"""Gates only validate; the quality report builds the GX Data Docs once per run (issue 49).

- a gate step stores its validation result and nothing else: no Data Docs page, no index, no context
  lock once its context is set up; its result names the page the report's build will write;
- the report's build (`gx_docs.build_data_docs`, run by `quality_report` and `eagle3 report`) prunes every
  suite to the newest `keep`, renders the pages the kept results lack and every suite's page, and rewrites
  the index, which then links exactly the kept pages;
- a build that fails never fails the report asset: a warning names the cause.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from quality_helpers import generation_rows, tokenized_rows

from eagle3_dagster.defs import report as report_defs
from eagle3_dagster.orchestration.gates import gate_check_results
from eagle3_dagster.quality import generation_features, gx_docs, prompt_features, run_gate
from eagle3_dagster.quality.retention import DOCS_INDEX, VALIDATIONS_BASE


def _linked_pages(index: Path) -> set[str]:
    return set(re.findall(r'(validations/[^"\\\s<>]+?\.html)', index.read_text()))


def _pages_on_disk(site: Path) -> set[str]:
    return {p.relative_to(site).as_posix() for p in (site / "validations").rglob("*.html")}


def test_a_gate_stores_its_result_and_builds_no_data_docs(kimi, kimi_profile, gx_dirs):
    feats = prompt_features(tokenized_rows(kimi, {"p0": "What is 2+2?", "p1": "Name a prime."}), kimi_profile)
    gx_root = gx_dirs["context_dir"] / "gx"
    results = [run_gate("prompts", feats, profile=kimi_profile, **gx_dirs) for _ in range(3)]
    assert len(list((gx_root / VALIDATIONS_BASE).rglob("*.json"))) == 3  # each result stored
    docs = gx_root / "uncommitted" / "data_docs"  # (GX makes the empty folder with the context)
    assert not [p for p in docs.rglob("*") if p.is_file()]  # no page, no index, no static assets
    # once set up, a gate takes no lock on the shared context at all
    assert results[0].gx_run is not None and [h.what for h in results[0].gx_run.locks] == ["set-up"]
    assert all(r.gx_run is not None and r.gx_run.locks == [] for r in results[1:])
    # its result and its check name the page the report's build writes, under the context
    for r in results:
        assert r.data_docs_page is not None and gx_root in Path(r.data_docs_page).parents
        (check,) = [c for c in gate_check_results("prompts", r, ()) if c.check_name == "prompts_gate"]
        assert check.metadata["data_docs_page"].value == "file://" + r.data_docs_page
        assert "data_docs" not in check.metadata  # the index is the report's
    assert not any(Path(r.data_docs_page).exists() for r in results)


def test_the_build_prunes_renders_the_kept_pages_and_indexes_exactly_them(kimi, kimi_profile, gx_dirs):
    tokenized = tokenized_rows(kimi, {"p0": "What is 2+2?"})
    feats = prompt_features(tokenized, kimi_profile)
    gens = generation_rows([dict(sample_id="s0", prompt_id="p0", output_ids=kimi.output("Add.", "4."))])
    prompts = [run_gate("prompts", feats, profile=kimi_profile, **gx_dirs) for _ in range(4)]
    run_gate("generations", generation_features(gens, tokenized, kimi_profile), profile=kimi_profile, **gx_dirs)
    ctx_dir = gx_dirs["context_dir"]
    index = ctx_dir / "gx" / DOCS_INDEX
    site = index.parent
    assert gx_docs.build_data_docs(ctx_dir, 2) == index
    kept = {Path(r.data_docs_page).relative_to(site).as_posix() for r in prompts[-2:]}
    assert {p for p in _pages_on_disk(site) if "prompts_gate" in p} == kept
    assert not any(Path(r.data_docs_page).exists() for r in prompts[:2])  # pruned, results and pages
    assert _linked_pages(index) == _pages_on_disk(site)  # the index links exactly what is kept
    html = index.read_text()
    assert "expectations/prompts_gate.html" in html and "expectations/generations_gate.html" in html

    # a later run: the pages already built are not rendered again, the new one is, the index follows
    built = {p: (site / p).stat().st_mtime_ns for p in kept}
    newest = run_gate("prompts", feats, profile=kimi_profile, **gx_dirs)
    assert gx_docs.build_data_docs(ctx_dir, 0) == index
    assert Path(newest.data_docs_page).is_file()
    assert {p: (site / p).stat().st_mtime_ns for p in kept} == built
    assert Path(newest.data_docs_page).relative_to(site).as_posix() in _linked_pages(index)


def test_no_context_no_docs(tmp_path):
    assert gx_docs.build_data_docs(tmp_path / "nothing", 1) is None
    assert not (tmp_path / "nothing").exists()


def test_a_failed_docs_build_is_a_warning_not_a_failed_report(monkeypatch, tmp_path):
    def broken(context_dir: Path, keep: int) -> Path:
        raise PermissionError(f"{context_dir}: read-only")

    monkeypatch.setattr(report_defs, "build_data_docs", broken)
    warnings: list[str] = []
    log = SimpleNamespace(warning=warnings.append)
    pipeline = SimpleNamespace(gx_context_dir=tmp_path / "gx")
    assert report_defs.data_docs(log, pipeline, keep=20) is None
    assert warnings == [f"GX Data Docs not built: PermissionError: {tmp_path / 'gx'}: read-only"]


def test_eagle3_report_builds_the_data_docs(kimi, kimi_profile, gx_dirs):
    from eagle3_dagster.app.cli import main as eagle3

    feats = prompt_features(tokenized_rows(kimi, {"p0": "What is 2+2?"}), kimi_profile)
    results = [run_gate("prompts", feats, profile=kimi_profile, **gx_dirs) for _ in range(3)]
    work = gx_dirs["context_dir"].parent
    assert eagle3(["report", "--data-dir", str(work), "--work-dir", str(work)]) == 0
    index = gx_dirs["context_dir"] / "gx" / DOCS_INDEX
    assert all(Path(r.data_docs_page).is_file() for r in results)
    assert _linked_pages(index) == _pages_on_disk(index.parent) and len(_pages_on_disk(index.parent)) == 3
