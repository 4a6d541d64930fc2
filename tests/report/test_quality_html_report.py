"""The offline HTML quality report (eagle3_dagster/report/html.py).

Offline means: no scripts, no external styles/fonts/images, every link a relative path, a file:// URI
or an in-page anchor, and each of them resolves. Built from stored results only, so it is the same
whichever shard run writes it last; after a real pipeline run it shows every shard x gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import dagster as dg
import polars as pl
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.orchestration.run import GraphScope
from eagle3_dagster.quality import ExpectationOutcome, GateResult, write_gate_result
from eagle3_dagster.quality.retention import DOCS_VALIDATIONS_BASE, VALIDATIONS_BASE
from eagle3_dagster.report.html import collect, default_report_path, render, write_report

BLOCK = {"td", "th", "tr", "div", "p", "h1", "h2", "h3", "table", "li", "br", "title"}
VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source", "track", "wbr"}
EVIL = "<script>alert('x')</script>"


class _Doc(HTMLParser):
    """Tags, attributes, visible text and an open/close balance check."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.ids: set[str] = set()
        self.text: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "style":
            self._in_style = True
        if tag in BLOCK:
            self.text.append(" ")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False
        if tag in BLOCK:
            self.text.append(" ")
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        if not self._in_style:
            self.text.append(data)


def parse(html_text: str) -> _Doc:
    d = _Doc()
    d.feed(html_text)
    d.close()
    assert not d.errors and not d.stack, (d.errors, d.stack)
    return d


def assert_offline(html_text: str, report: Path) -> _Doc:
    doc = parse(html_text)
    for tag, attrs in doc.tags:
        assert tag not in ("script", "link", "img", "iframe", "object", "embed", "base"), (tag, attrs)
        for k, v in attrs.items():
            assert not k.startswith("on"), (tag, k)  # no inline handlers either
            if k in ("src", "href", "srcset", "action", "data") and v is not None:
                low = v.strip().lower()
                assert not low.startswith(("http:", "https:", "//", "javascript:", "data:")), (tag, k, v)
    low = html_text.lower()
    assert "<script" not in low and "@import" not in low and "url(" not in low
    # every link resolves: an in-page anchor, a relative path, or a file:// URI of an existing file
    for tag, attrs in doc.tags:
        href = attrs.get("href")
        if tag != "a" or href is None:
            continue
        if href.startswith("#"):
            assert href[1:] in doc.ids, href
        elif href.startswith("file://"):
            assert Path(unquote(urlparse(href).path)).is_file(), href
        else:
            assert (report.parent / unquote(href)).resolve().is_file(), href
    return doc


def rows_text(doc: _Doc) -> str:
    return " ".join("".join(doc.text).split())


# ------------------------------------------------------------------------------------------ unit


def _outcome(
    name: str,
    key: str,
    *,
    ok: bool,
    severity: str = "critical",
    evaluated: int = 10,
    unexpected: int = 0,
    mostly: float = 0.95,
    level: str = "row",
    observed=None,
) -> ExpectationOutcome:
    rate = (evaluated - unexpected) / evaluated if evaluated else 1.0
    return ExpectationOutcome(
        name=name,
        severity=severity,
        mostly=mostly,
        pass_rate=rate,
        unexpected_count=unexpected,
        success=ok,
        description="d",
        key=key,
        evaluated=evaluated,
        level=level,
        observed_value=observed,
    )


@pytest.fixture()
def stored(tmp_path: Path) -> dict:
    """Stored results for shards 0 and 1 (2 and 3 never ran), a real-looking Data Docs page and a snapshot."""
    data, work = tmp_path / "data", tmp_path / "data"
    site = work / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site"
    page = (
        site
        / "validations"
        / "generations_gate"
        / "__none__"
        / "20261202T000000.000000Z"
        / "eagle3_features-generations.html"
    )
    page.parent.mkdir(parents=True)
    page.write_text("<html>validation page</html>")
    (site / "index.html").write_text("<html>index</html>")
    ok = GateResult(
        "prompts",
        True,
        [_outcome("last id is <think>", "thinking_token_ends_prompt", ok=True)],
        n_rows=10,
        profile="kimi-k2.5",
        created_at="2026-12-02T10:00:00+00:00",
    )
    failures = pl.DataFrame(
        {"row_id": ["a", "b", "c"], "reasons": [["163607 present", EVIL], ["163607 present"], ["163607 present"]]},
        schema={"row_id": pl.String, "reasons": pl.List(pl.String)},
    )
    bad = GateResult(
        "generations",
        False,
        [
            _outcome("163607 present", "think_end_present", ok=False, evaluated=10, unexpected=3),
            _outcome(f"evil {EVIL}", "evil_key", ok=False, severity="warning", evaluated=10, unexpected=1, mostly=0.99),
            _outcome("row count", "row_count", ok=False, severity="warning", level="table", observed=0, mostly=1.0),
            _outcome("passes", "fine", ok=True),
        ],
        row_failures=failures,
        n_rows=10,
        data_docs_page=str(page),
        profile="kimi-k2.5",
        created_at="2026-12-02T10:01:00+00:00",
    )
    pruned = GateResult(
        "prompts",
        True,
        [],
        n_rows=5,
        profile="kimi-k2.5",
        created_at="2026-12-02T10:02:00+00:00",
        data_docs_page=str(page.parent.parent / "20201231T000000.000000Z" / page.name),
    )
    write_gate_result(data, "prompts", 0, ok)
    write_gate_result(data, "generations", 0, bad)
    write_gate_result(data, "prompts", 1, pruned)
    snap = data / "snapshots" / "0123456789abcdef"
    snap.mkdir(parents=True)
    (snap / "manifest.json").write_text(
        json.dumps(
            {
                "version": "0123456789abcdef",
                "created_at": "2026-12-02T10:05:00+00:00",
                "rows": 0,
                "shards": [
                    {"shard": "0000", "included": False, "reason": f"generations gate failed {EVIL}", "rows": 0},
                    {"shard": "0001", "included": False, "reason": "no generations gate result", "rows": 0},
                ],
            }
        )
    )
    (data / "snapshots" / "LATEST").write_text("0123456789abcdef\n")
    return {"data": data, "work": work, "page": page}


def test_model_statuses_failures_reasons_and_links(stored):
    m = collect(stored["data"], stored["work"], n_shards=4)
    assert [r.shard for r in m.shards] == ["0000", "0001", "0002", "0003"]
    c = m.shards[0].cells
    assert (c["prompts"].status, c["generations"].status, c["training_samples"].status) == ("PASS", "FAIL", "not run")
    assert [i.key for i in c["generations"].issues] == ["think_end_present", "evil_key", "row_count"]
    assert c["generations"].reasons == {"163607 present": 3, EVIL: 1}
    assert c["generations"].docs_page == stored["page"]
    assert m.shards[1].cells["prompts"].status == "PASS" and m.shards[1].cells["prompts"].docs_page is None  # pruned
    assert all(cell.status == "not run" for cell in m.shards[3].cells.values())
    assert m.profiles == ["kimi-k2.5"] and m.snapshots[0].latest and m.counts()["FAIL"] == 1


def test_render_is_offline_escaped_and_linked(stored):
    out = write_report(stored["data"], stored["work"], n_shards=4, profile="kimi-k2.5")
    assert out == default_report_path(stored["work"]) == stored["work"] / "reports" / "index.html"
    text = out.read_text()
    doc = assert_offline(text, out)
    assert EVIL not in text and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
    visible = rows_text(doc)
    assert EVIL in visible  # shown to the reader as text, not run
    assert "last id is <think>" not in text  # passed expectations are not listed; names escaped anyway
    # relative link to the existing validation page, none to the pruned one
    hrefs = [a.get("href") for t, a in doc.tags if t == "a"]
    page_links = [h for h in hrefs if h and h.endswith("eagle3_features-generations.html")]
    assert page_links == [
        "../gx/gx/uncommitted/data_docs/local_site/validations/generations_gate/__none__/"
        "20261202T000000.000000Z/eagle3_features-generations.html"
    ]
    assert "20201231T000000" not in text
    assert "3 of 10 rows unexpected (30.0%); pass rate 70.0% &lt; mostly 95.0%" in text
    assert "observed value <code>0</code>" in text
    assert "generations gate failed" in visible and "0123456789abcdef (LATEST)" in visible
    for shard in ("0000", "0001", "0002", "0003"):
        assert f'id="shard-{shard}"' in text


def test_report_outside_work_dir_uses_file_uris(stored, tmp_path):
    out = write_report(stored["data"], stored["work"], n_shards=1, out=tmp_path / "elsewhere" / "q.html")
    text = out.read_text()
    assert_offline(text, out)
    assert stored["page"].as_uri() in text and 'href="../gx/' not in text


def test_secrets_never_shown_for_object_storage_uri(tmp_path):
    m = collect("memory://bucket/prefix?region=x", tmp_path / "work", n_shards=1)
    assert m.data_dir == "memory://bucket/prefix"
    assert "region" not in render(m, tmp_path / "work" / "reports" / "index.html")


def test_concurrent_writers_leave_one_complete_report(stored):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as ex:
        paths = list(ex.map(lambda _: write_report(stored["data"], stored["work"], n_shards=4), range(8)))
    assert len(set(paths)) == 1
    parse(paths[0].read_text())
    assert [p.name for p in paths[0].parent.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.integration
def test_cli_report(stored, tmp_path):
    env = {**os.environ, "EAGLE3_WORK_DIR": str(stored["work"])}
    out = tmp_path / "cli" / "report.html"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_dagster.app.cli",
            "report",
            "--data-dir",
            str(stored["data"]),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    assert_offline(out.read_text(), out)
    r = subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.app.cli", "report", "--data-dir", "s3://u:p@bucket/x"],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
        timeout=120,
    )
    assert r.returncode == 2 and "p@" not in r.stderr


# ------------------------------------------------------------------------------------------ pipeline


def _pipeline_run(tmp_path: Path, kimi_profile, sim_args: list[str]) -> tuple[Path, str, object]:
    from eagle3_dagster.definitions import defs
    from eagle3_dagster.orchestration.run import materialize_graph
    from eagle3_dagster.sim.process import start_simulator

    data = tmp_path / "data"
    with start_simulator(extra_args=sim_args) as sim:
        res = graph_resources(data, kimi_profile.tokenizer, sim.url)
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)
            out = materialize_graph(
                defs,
                instance,
                scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
                resources=res,
            )
            meta = {}
            for key in ("tokenized_prompts", "generations", "training_dataset", "quality_report"):
                ev = instance.get_latest_materialization_event(dg.AssetKey(key))
                meta[key] = ev.asset_materialization.metadata if ev else {}
    return data, shard, (out, meta)


@pytest.mark.integration
def test_gated_steps_store_results_and_only_the_report_asset_renders(tmp_path, kimi_profile):
    from eagle3_dagster.definitions import defs
    from eagle3_dagster.orchestration.run import SHARD_ASSETS, materialize_graph
    from eagle3_dagster.sim.process import start_simulator

    data = tmp_path / "data"
    with start_simulator() as sim, dg.instance_for_test() as instance:
        res = graph_resources(data, kimi_profile.tokenizer, sim.url)
        assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
        shard = shard_with_most_prompts(data)
        assets = list(defs.assets or [])
        run = dg.materialize(
            assets, selection=list(SHARD_ASSETS), partition_key=shard, instance=instance, resources=res
        )
        assert run.success
        assert all((data / "gates" / g / f"shard={shard}.json").is_file() for g in ("prompts", "generations"))
        assert not (data / "reports").exists(), "a gated step rendered the report"
        report = dg.materialize(assets, selection=["quality_report"], instance=instance, resources=res)
    path = report.asset_materializations_for_node("quality_report")[-1].metadata["path"].value
    assert path == str(data / "reports" / "index.html")
    assert Path(path).is_file()


@pytest.mark.integration
def test_report_after_clean_pipeline_run(tmp_path, kimi_profile):
    from eagle3_dagster.definitions import defs
    from eagle3_dagster.orchestration.run import graph_shard_keys

    keys = graph_shard_keys(defs)  # the shards of the definitions the run used
    data, shard, (out, meta) = _pipeline_run(tmp_path, kimi_profile, [])
    assert out.shards[0].success and out.publish_success
    report = data / "reports" / "index.html"  # local data dir: the work dir is the data dir
    assert report.is_file()
    # the report is its own asset, rendered once after the gated steps, which only store their gate results
    assert meta["quality_report"]["path"].value == str(report)
    assert not any("quality_report" in meta[key] for key in ("tokenized_prompts", "generations", "training_dataset"))
    text = report.read_text()
    doc = assert_offline(text, report)
    m = collect(data, data, n_shards=len(keys))
    assert [r.shard for r in m.shards] == keys
    for row in m.shards:
        statuses = {g: c.status for g, c in row.cells.items()}
        want = "PASS" if row.shard == shard else "not run"
        assert statuses == {"prompts": want, "generations": want, "training_samples": want}, (row.shard, statuses)
        if row.shard == shard:
            assert all(c.docs_page is not None and c.docs_page.is_file() for c in row.cells.values())
            assert all(c.n_rows > 0 for c in row.cells.values())
    visible = rows_text(doc)
    for k in keys:
        assert k in visible
    assert "kimi-k2.5" in visible and str(data) in visible
    assert visible.count("Data Docs") >= 3 and f"snapshot {out.snapshot_version} (LATEST)" in visible
    assert "all gates passed" in visible
    # a server that does not speculate: no acceptance figures anywhere
    assert "spec_accept_rate" not in meta["generations"] and "Drafter acceptance" not in visible

    # a pruned page loses its link (and only that one); `eagle3 report` rebuilds on demand
    page = m.shards[int(shard)].cells["prompts"].docs_page
    gx_root = data / "gx" / "gx"
    stored = gx_root / VALIDATIONS_BASE / page.relative_to(gx_root / DOCS_VALIDATIONS_BASE).with_suffix(".json")
    stored.unlink()  # pruned as retention prunes: the stored result and its page
    page.unlink()
    env = {**os.environ, "EAGLE3_DATA_DIR": str(data)}
    env.pop("EAGLE3_WORK_DIR", None)
    r = subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.app.cli", "report"],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(report)
    doc2 = assert_offline(report.read_text(), report)
    assert rows_text(doc2).count("Data Docs") == visible.count("Data Docs") - 1


@pytest.mark.integration
def test_report_shows_dropped_think_end(tmp_path, kimi_profile):
    data, shard, (out, meta) = _pipeline_run(tmp_path, kimi_profile, ["--mode", "drop-think-end"])
    assert not out.shards[0].success
    report = data / "reports" / "index.html"
    assert meta["quality_report"]["path"].value == str(report)
    text = report.read_text()
    doc = assert_offline(text, report)
    cells = collect(data, data, n_shards=1).shards
    row = next(r for r in cells if r.shard == shard)
    assert row.cells["prompts"].status == "PASS"
    gen = row.cells["generations"]
    assert gen.status == "FAIL" and row.cells["training_samples"].status == "not run"
    assert "think_end_present" in [i.key for i in gen.issues if i.severity == "critical"]
    think = next(i for i in gen.issues if i.key == "think_end_present")
    assert gen.n_quarantined == gen.n_rows > 0 and gen.reasons[think.name] == gen.n_rows
    visible = rows_text(doc)
    assert f"shard {shard} · gate generations (on generations) FAIL" in visible
    assert "think_end_present" in visible and think.name in visible
    assert "blocked: the generations gate failed" in visible  # why training_samples did not run
    assert f"{gen.n_rows} of {gen.n_rows} rows unexpected (100.0%); pass rate 0.0% < mostly" in visible
    # the shard failed, so no snapshot is even attempted (one rule: every shard must pass); the report, run last
    # all the same, opens with that and says why
    assert out.publish_success is None and out.snapshot_version is None
    assert out.not_published == f"not published: no shard passed (shard(s) {shard} failed)"
    top = visible[: visible.index("Gates by shard")]
    assert "A snapshot is published only when every shard passed" in top
    assert f"{shard}: generations gate FAIL" in top and "No publish attempt recorded yet" in top


def test_demo_summary_prints_report_path(stored, monkeypatch):
    from eagle3_dagster.app.demo import summarize
    from eagle3_dagster.orchestration.run import GraphOutcome
    from eagle3_dagster.storage import data_root

    monkeypatch.setenv("EAGLE3_DATA_DIR", str(stored["data"]))
    monkeypatch.delenv("EAGLE3_WORK_DIR", raising=False)
    outcome = GraphOutcome(True, "r", [])
    assert "report:     not written" in summarize(outcome, data_root(stored["data"]), settings())
    path = write_report(stored["data"], stored["work"], n_shards=1)
    assert f"report:     {path}  (offline HTML" in summarize(outcome, data_root(stored["data"]), settings())


def test_demo_summary_says_empty_for_checks_that_passed_on_zero_rows(stored, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle3_dagster import schemas
    from eagle3_dagster.app.demo import summarize
    from eagle3_dagster.orchestration.run import GraphOutcome, ShardOutcome
    from eagle3_dagster.storage import data_root

    monkeypatch.setenv("EAGLE3_DATA_DIR", str(stored["data"]))
    monkeypatch.delenv("EAGLE3_WORK_DIR", raising=False)
    tok = stored["data"] / "tokenized_prompts" / "shard=0000"
    tok.mkdir(parents=True)
    row = {"prompt_id": "p", "source": "s", "shard": 0, "input_ids": [1, 2], "prompt_len": 2}
    pq.write_table(pa.Table.from_pylist([row], schema=schemas.TOKENIZED_PROMPTS), tok / "part-0.parquet")
    checks = {"tokenized_prompts:prompts_gate": True, "generations:generations_gate": True}
    outcome = GraphOutcome(
        True, "r", [ShardOutcome("0000", True, dict(checks)), ShardOutcome("0001", True, dict(checks))]
    )
    lines = {
        ln.split()[0]: ln for ln in summarize(outcome, data_root(stored["data"]), settings()).splitlines() if ln.strip()
    }
    # shard 0: 1 tokenized prompt (PASS: counted, not named), no generations (empty); shard 1: nothing at all
    assert lines["0000"].endswith("  1 PASS; generations_gate=empty")
    assert lines["0001"].endswith("  prompts_gate=empty, generations_gate=empty")


SHARD_CHECKS = [
    "tokenized_prompts:thinking_token_ends_prompt",
    "tokenized_prompts:prompts_gate",
    "generations:think_end_present",
    "generations:request_failure_budget",
    "generations:generations_gate",
    "training_samples:training_samples_gate",
]


def test_demo_summary_shard_table_fits_100_columns(stored, monkeypatch):
    """Six checks a shard: passing ones counted, the others named, a long row wrapped under its column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle3_dagster import schemas
    from eagle3_dagster.app.demo import summarize
    from eagle3_dagster.orchestration.run import GraphOutcome, ShardOutcome
    from eagle3_dagster.storage import data_root

    monkeypatch.setenv("EAGLE3_DATA_DIR", str(stored["data"]))
    monkeypatch.delenv("EAGLE3_WORK_DIR", raising=False)
    for k in (0, 1):
        tok = stored["data"] / "tokenized_prompts" / f"shard={k:04d}"
        tok.mkdir(parents=True)
        row = {"prompt_id": "p", "source": "s", "shard": k, "input_ids": [1, 2], "prompt_len": 2}
        pq.write_table(pa.Table.from_pylist([row], schema=schemas.TOKENIZED_PROMPTS), tok / "part-0.parquet")
    fine = dict.fromkeys(SHARD_CHECKS[:2], True)
    bad = {c: c.endswith(("ends_prompt", "_gate")) for c in SHARD_CHECKS}
    failed = {c: "ERROR" for c, ok in bad.items() if not ok}
    outcome = GraphOutcome(
        True, "r", [ShardOutcome("0000", True, fine), ShardOutcome("0001", False, bad, failed_checks=failed)]
    )
    summary = summarize(outcome, data_root(stored["data"]), settings())
    table = summary.split("checks\n")[1].split("\nwarnings:")[0].splitlines()[1:]
    assert all(len(ln) <= 100 for ln in table), "\n".join(table)
    assert table[0].startswith("  0000") and table[0].endswith("  all 2 PASS")
    rest = " ".join(" ".join(table[1:]).split())
    assert rest.endswith(
        "2 PASS; request_failure_budget=FAIL, think_end_present=FAIL, generations_gate=empty, "
        "training_samples_gate=empty"
    ), table
    assert len(table) > 2 and table[2].startswith(" " * 40)  # the wrapped rest sits under the checks column


def test_report_lists_failed_requests_by_reason_with_prompt_ids(tmp_path):
    """A shard's errors.parquet (requests that failed for good): the report counts them by reason with a few
    prompt ids and the last detail; a shard without failures has no such row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle3_dagster.schemas import GENERATION_ERRORS

    data, work = tmp_path / "data", tmp_path / "work"
    rows = [
        {
            "sample_id": f"s{i}",
            "prompt_id": f"p-{i}",
            "shard": 0,
            "reason": "prompt_too_long_for_server",
            "status": None,
            "detail": "prompt of 300,000 ids >= the server's context length 262,144",
        }
        for i in range(4)
    ]
    (data / "generations" / "shard=0000").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=GENERATION_ERRORS), data / "generations" / "shard=0000" / "errors.parquet"
    )
    m = collect(data, work, n_shards=2)
    by_shard = {row.shard: row.other_rejects for row in m.shards}
    assert by_shard["0000"]["failed requests (generations)"] == {
        "prompt_too_long_for_server (e.g. p-0, p-1, p-2; last: prompt of 300,000 ids >= the server's context "
        "length 262,144)": 4
    }
    assert "failed requests (generations)" not in by_shard["0001"]
    html = render(m, work / "reports" / "index.html")
    assert "failed requests (generations)" in html and "prompt_too_long_for_server (e.g. p-0, p-1, p-2" in html


@pytest.mark.integration
def test_report_and_ui_show_where_the_drafter_is_weak(tmp_path, kimi_profile):
    from eagle3_dagster.quality.acceptance import ACCEPTANCE_FILE

    spec = ["--speculative-draft-model-path", "test/kimi-eagle3", "--speculative-num-draft-tokens", "4"]
    data, shard, (out, meta) = _pipeline_run(tmp_path, kimi_profile, spec)
    assert out.shards[0].success
    md = meta["generations"]
    for key in ("spec_rows", "spec_accept_length", "spec_accept_rate"):
        assert isinstance(md[key], dg.FloatMetadataValue), key  # plotted across materializations
    assert md["spec_rows"].value == md["stored_samples"].value
    assert 1.0 < md["spec_accept_length"].value <= 4.0 and 0.0 < md["spec_accept_rate"].value < 1.0
    summary = json.loads((data / "generations" / f"shard={shard}" / ACCEPTANCE_FILE).read_text())
    assert summary["all"]["rows"] == md["spec_rows"].value and summary["by_source"] and summary["histogram"]
    visible = rows_text(assert_offline((data / "reports" / "index.html").read_text(), data / "reports" / "index.html"))
    for text in ("Drafter acceptance", "output length", "tool calls", "weakest prompts", "histogram"):
        assert text in visible, text
