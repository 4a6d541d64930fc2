"""GX set-up once per process (issue 17): same verdicts and stored results, no rewrites, no lock queue.

- a second gate in the same process reuses the prepared context (no GX config file is rewritten)
  and judges, stores and documents exactly as a cold set-up does;
- an edited suite (other overrides) in the same process is not served from the cache;
- the gate's own validation path (no checkpoint freshness re-reads, each expectation's configuration
  built once) stores exactly what GX's `checkpoint.run` stores, and the Data Docs the quality report
  builds from the stored results (gx_docs.build_data_docs) are what GX's own full build writes, each
  page where the gate's result said it would be;
- two processes validating on one context at the same time overlap and take no context lock once set
  up (only a set-up writes to the shared context), proven by the timestamps of both processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from quality_helpers import EXPECTATIONS_DIR, generation_rows, tokenized_rows

from eagle3_dagster.quality import gate as gate_mod
from eagle3_dagster.quality import generation_features, gx_context, gx_docs, load_suite, run_gate
from eagle3_dagster.quality.retention import VALIDATIONS_BASE

VOLATILE = {"created_at", "data_docs_page"}
KEY = "think_end_present"


def _gens(kimi, n: int, missing_think_end: int) -> pl.DataFrame:
    return generation_rows(
        [
            dict(
                sample_id=f"s{i:05d}",
                prompt_id="p0",
                output_ids=kimi.output(f"Step {i}: add.", f"It is {i}.", think_end=i >= missing_think_end),
            )
            for i in range(n)
        ]
    )


@pytest.fixture()
def feats(kimi, kimi_profile) -> pl.DataFrame:
    tokenized = tokenized_rows(kimi, {"p0": "What is 2+2?"})
    return generation_features(_gens(kimi, 30, 1), tokenized, kimi_profile)


def _config_files(context_dir: Path) -> dict[str, int]:
    """mtime_ns of every GX config file (yml, suites, validation definitions, checkpoints)."""
    root = context_dir / "gx"
    out = {}
    for p in [root / "great_expectations.yml", *root.glob("expectations/*.json"), *root.glob("*definitions/*.json")]:
        out[str(p.relative_to(root))] = p.stat().st_mtime_ns
    for p in root.glob("checkpoints/*.json"):
        out[str(p.relative_to(root))] = p.stat().st_mtime_ns
    return out


def _stored_result(context_dir: Path, suite: str, run_dir: str) -> dict:
    """The stored GX validation result of one run, without what differs per run (time, ids)."""
    (f,) = (context_dir / "gx" / VALIDATIONS_BASE / suite).glob(f"*/{run_dir}/*.json")
    d = json.loads(f.read_text())
    d["meta"] = {k: v for k, v in d["meta"].items() if k not in ("run_id", "validation_time")}
    d["meta"]["batch_markers"].pop("ge_load_time")
    d.pop("id", None)
    return d


def _runs(context_dir: Path, suite: str) -> set[str]:
    return {p.name for p in (context_dir / "gx" / VALIDATIONS_BASE / suite).glob("*/*")}


def test_second_gate_reuses_the_context_and_judges_identically(feats, kimi_profile, gx_dirs):
    gx_context.clear_cache()
    ctx_dir = gx_dirs["context_dir"]
    cold = run_gate("generations", feats, profile=kimi_profile, **gx_dirs)
    assert cold.gx_run is not None and not cold.gx_run.cache_hit
    before_files, before_runs = _config_files(ctx_dir), _runs(ctx_dir, "generations_gate")
    warm = run_gate("generations", feats, profile=kimi_profile, **gx_dirs)
    assert warm.gx_run is not None and warm.gx_run.cache_hit
    # nothing of the context's configuration was rewritten by the second gate
    assert _config_files(ctx_dir) == before_files
    # the same verdict, outcomes (mostly, pass rates, observed values) and quarantined rows
    strip = lambda r: {k: v for k, v in r.to_json().items() if k not in VOLATILE}
    assert strip(warm) == strip(cold)
    assert warm.success and warm.row_failures.height == 1
    # the stored GX validation results are the same but for time and ids, and each has its page
    (new_run,) = _runs(ctx_dir, "generations_gate") - before_runs
    (old_run,) = before_runs
    assert _stored_result(ctx_dir, "generations_gate", new_run) == _stored_result(ctx_dir, "generations_gate", old_run)
    index = gx_docs.build_data_docs(ctx_dir, 20)  # the quality report's build, once per run
    assert index is not None and new_run in index.read_text()
    assert Path(warm.data_docs_page).is_file() and Path(cold.data_docs_page).is_file()

    # a fresh process (empty cache) on the same context reuses the stored objects: still no rewrite
    gx_context.clear_cache()
    again = run_gate("generations", feats, profile=kimi_profile, **gx_dirs)
    assert again.gx_run is not None and not again.gx_run.cache_hit
    assert _config_files(ctx_dir) == before_files and strip(again) == strip(cold)


def test_edited_suite_is_not_served_from_the_cache(feats, kimi_profile, gx_dirs):
    default = next(e.mostly for e in load_suite("generations", EXPECTATIONS_DIR).expectations if e.key == KEY)
    assert default != 0.5
    for mostly, overrides in ((default, None), (0.5, {KEY: {"mostly": 0.5}}), (default, None)):
        res = run_gate("generations", feats, profile=kimi_profile, config_overrides=overrides, **gx_dirs)
        assert _outcome_mostly(res, KEY) == mostly
        assert res.gx_run is not None and not res.gx_run.cache_hit  # another definition: set up again
        # the stored suite (what Data Docs render) is the one that judged this run
        stored = json.loads((gx_dirs["context_dir"] / "gx" / "expectations" / "generations_gate.json").read_text())
        (exp,) = [e for e in stored["expectations"] if e["meta"]["key"] == KEY]
        assert exp["kwargs"]["mostly"] == mostly


def test_stored_result_is_what_gx_checkpoint_run_stores(feats, kimi_profile, gx_dirs):
    gx_context.clear_cache()
    ctx_dir = gx_dirs["context_dir"]
    ours = run_gate("generations", feats, profile=kimi_profile, **gx_dirs)
    assert ours.success and ours.row_failures.height == 1  # a failing row: partial results are stored too
    (our_run,) = _runs(ctx_dir, "generations_gate")
    suite = load_suite("generations", EXPECTATIONS_DIR, profile=kimi_profile)
    prepared, hit = gx_context.prepare(ctx_dir, "generations", gate_mod._gx_suite("generations", suite), "SUMMARY")
    assert hit
    # GX's own path: the checkpoint (with its freshness checks), configurations rebuilt on every access
    prepared.checkpoint.run(batch_parameters={"dataframe": feats.select(suite.columns()).to_pandas()})
    (gx_run,) = _runs(ctx_dir, "generations_gate") - {our_run}
    assert _stored_result(ctx_dir, "generations_gate", our_run) == _stored_result(ctx_dir, "generations_gate", gx_run)


def test_data_docs_after_gates_are_what_a_full_gx_build_writes(feats, kimi_profile, gx_dirs, tmp_path):
    import great_expectations as gx

    gx_context.clear_cache()
    ctx_dir = gx_dirs["context_dir"]
    site = ctx_dir / "gx" / "uncommitted" / "data_docs" / "local_site"
    results = [run_gate("generations", feats, profile=kimi_profile, **gx_dirs) for _ in range(3)]
    assert gx_docs.build_data_docs(ctx_dir, 3) == site / "index.html"  # a first run's report
    results += [run_gate("generations", feats, profile=kimi_profile, **gx_dirs) for _ in range(2)]
    assert gx_docs.build_data_docs(ctx_dir, 3) == site / "index.html"  # the next run's: prune, new pages, index
    index = (site / "index.html").read_text()
    for r in results[-3:]:  # the kept runs: each page exists where the gate's result said, the index links it
        page = Path(r.data_docs_page)
        assert page.is_file()
        assert page.relative_to(site).as_posix() in index
    for r in results[:2]:  # pruned: neither the page nor a link is left
        assert not Path(r.data_docs_page).exists()
        assert Path(r.data_docs_page).relative_to(site).as_posix() not in index
    # GX's own full build of a copy of the context (no cache, every page re-rendered) writes the same site
    copy = tmp_path / "copy"
    shutil.copytree(ctx_dir, copy)
    shutil.rmtree(copy / "gx" / "uncommitted" / "data_docs")
    gx.get_context(mode="file", project_root_dir=str(copy)).build_data_docs()
    copy_site = copy / "gx" / "uncommitted" / "data_docs" / "local_site"
    pages = sorted(p.relative_to(site) for p in site.rglob("*.html"))
    assert pages == sorted(p.relative_to(copy_site) for p in copy_site.rglob("*.html"))
    for rel in pages:  # the same but for the render time and the random block ids
        assert _no_render_time(site / rel) == _no_render_time(copy_site / rel), rel
    # the static assets are all there
    statics = sorted(p.relative_to(site) for p in (site / "static").rglob("*") if p.is_file())
    assert statics and statics == sorted(
        p.relative_to(copy_site) for p in (copy_site / "static").rglob("*") if p.is_file()
    )


def _no_render_time(page: Path) -> str:
    """The page without what differs between any two GX builds: the render time in its logo's URL, and the
    random ids of its collapsible blocks (a uuid4 Jinja folds into the template when it compiles it)."""
    text = re.sub(r"\?d=\d{8}T\d{6}\.\d+Z&", "?d=&", page.read_text())
    return re.sub(r"-collapse-body-[0-9a-f-]{36}", "-collapse-body-", text)


def _outcome_mostly(res, key: str) -> float:
    return next(o.mostly for o in res.outcomes if o.key == key)


_WORKER = r"""
import json, sys, time
from pathlib import Path
import polars as pl
from eagle3_dagster.quality import run_gate
feats_file, expectations_dir, context_dir, go, out = sys.argv[1:6]
feats = pl.read_parquet(feats_file)
warm = feats.head(50)
run_gate("generations", warm, expectations_dir=Path(expectations_dir), context_dir=Path(context_dir))  # set-up
Path(out + ".ready").write_text("1")
while not Path(go).exists():
    time.sleep(0.005)
res = run_gate("generations", feats, expectations_dir=Path(expectations_dir), context_dir=Path(context_dir))
r = res.gx_run
Path(out).write_text(json.dumps({
    "success": res.success, "rows": res.n_rows, "hit": r.cache_hit,
    "validate": [r.validate_started_at, r.validate_ended_at],
    "locks": [[h.what, h.acquired_at, h.released_at] for h in r.locks],
}))
"""


@pytest.mark.integration
def test_parallel_gates_overlap_outside_the_context_lock(kimi, kimi_profile, gx_dirs, tmp_path):
    # a shard big enough that GX validation takes a while, in two processes on one GX context
    tokenized = tokenized_rows(kimi, {"p0": "What is 2+2?"})
    small = generation_features(_gens(kimi, 40, 0), tokenized, kimi_profile)
    big = pl.concat([small] * 500).with_columns(pl.format("r{}", pl.int_range(pl.len())).alias("row_id"))
    feats_file = tmp_path / "feats.parquet"
    big.write_parquet(feats_file)
    go = tmp_path / "go"
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WORKER,
                str(feats_file),
                str(EXPECTATIONS_DIR),
                str(gx_dirs["context_dir"]),
                str(go),
                str(o),
            ],
            env=env,
        )
        for o in outs
    ]
    try:
        deadline = time.monotonic() + 240
        while not all(Path(str(o) + ".ready").exists() for o in outs):
            assert all(p.poll() is None for p in procs), "a gate worker died during set-up"
            assert time.monotonic() < deadline, "gate workers did not get ready"
            time.sleep(0.05)
        go.write_text("go")
        assert [p.wait(timeout=240) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    a, b = (json.loads(o.read_text()) for o in outs)
    assert a["success"] and b["success"] and a["rows"] == b["rows"] == big.height
    assert a["hit"] and b["hit"]  # set-up done before, once per process
    # the two validations ran at the same time: impossible if validating held the context lock
    (a0, a1), (b0, b1) = a["validate"], b["validate"]
    assert max(a0, b0) < min(a1, b1), f"validations did not overlap: {a['validate']} {b['validate']}"
    # set up already, neither took the context lock: a gate writes nothing shared (no Data Docs, no pruning)
    assert a["locks"] == [] and b["locks"] == []
