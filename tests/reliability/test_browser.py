"""A person's path through the UI, in a real browser (Debian's Chromium driven by Playwright).

The first screen after a demo shows the demo's runs. Then: `eagle3 ui` (simulator + `dagster dev` on 127.0.0.1) -> the asset graph and our checks -> materialize
the ingest job -> launch one shard partition from the partition dialog -> the run succeeds ->
the offline HTML quality report shows every shard -> the Great Expectations Data Docs it built list our suites ->
a candidate drafter judged from the `drafter_comparison` asset, its URL given in the launchpad's run config,
and the `promotion_rule` check's result on the asset's page.
Screenshots go to the test's tmp dir.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rel_helpers import CHROMIUM, chromium_page, require_os_package
from sim_ctl import Sim

pytestmark = pytest.mark.integration

LOCATION = "/locations/eagle3_dagster.definitions%3Adefs"
RUN_TIMEOUT_MS = 240_000


@pytest.fixture
def page(tmp_path):
    require_os_package("chromium", CHROMIUM, Path(CHROMIUM).exists())
    with chromium_page({"width": 1600, "height": 1000}) as pg:
        try:
            yield pg
        finally:
            pg.screenshot(path=str(tmp_path / "last.png"))


def _launch_and_open_run(page) -> str:
    """After a launch: the toast says 'Launched run <id>'; open the run page from it."""
    toast = page.get_by_text(re.compile(r"Launched run [0-9a-f]{8}"))
    toast.wait_for(timeout=60_000)
    short = re.search(r"[0-9a-f]{8}", toast.inner_text()).group(0)
    view = page.get_by_role("link", name="View", exact=True).or_(page.get_by_role("button", name="View", exact=True))
    view.first.click()
    page.wait_for_url(re.compile(rf"/runs/{short}[0-9a-f-]+"), timeout=30_000)
    return page.url.rsplit("/runs/", 1)[1].split("?")[0]


def _wait_run_success(page, run_id: str, shot: Path) -> None:
    page.get_by_text("RUN_SUCCESS").or_(page.get_by_text("RUN_FAILURE")).first.wait_for(timeout=RUN_TIMEOUT_MS)
    page.screenshot(path=str(shot))
    assert page.get_by_text("RUN_FAILURE").count() == 0, f"run {run_id} failed (see {shot})"


def test_the_first_screen_shows_the_runs_a_demo_made(eagle3_ui, page, kimi_profile, tmp_path):
    """`make demo`, then `make ui`: the runs the demo executed in its own process are on the UI's first screen
    (Overview, Timeline), which lists only runs of a code location of its workspace. First in this module: the
    later test's runs, launched from the UI, would be listed anyway."""
    import dagster as dg
    from graph_helpers import graph_resources

    from eagle3_dagster.definitions import defs
    from eagle3_dagster.orchestration.run import GraphScope, materialize_graph

    res = graph_resources(eagle3_ui.data, kimi_profile.tokenizer, "http://127.0.0.1:9")
    with dg.DagsterInstance.from_config(str(eagle3_ui.home)) as instance:
        assert materialize_graph(
            defs, instance, scope=GraphScope(shards=[]), resources=res
        ).ingest_success  # as the demo runs it
    page.goto(eagle3_ui.url, wait_until="networkidle")
    assert "/overview" in page.url, page.url  # the first screen
    # the timeline's rows: the code location, then each job with runs in the period, the demo's `ingest` here
    page.get_by_text("eagle3_dagster.definitions:defs", exact=True).first.wait_for(state="visible", timeout=60_000)
    page.get_by_text("ingest", exact=True).first.wait_for(state="visible", timeout=60_000)
    page.screenshot(path=str(tmp_path / "first-screen.png"))
    assert page.get_by_text("No runs or scheduled ticks in this time period").count() == 0


def test_ui_graph_checks_shard_run_and_data_docs(eagle3_ui, page, tmp_path):
    base = eagle3_ui.url

    # 0. the Lineage page (the nav's /asset-groups) opens on the graph: with one asset group Dagster draws
    # no collapsed group boxes, so every asset is on screen without a click
    page.goto(f"{base}/asset-groups", wait_until="networkidle")
    for name in ("prompts", "tokenized_prompts", "generations", "training_samples", "training_dataset"):
        page.get_by_text(name, exact=True).last.wait_for(state="visible")
    assert page.get_by_text("Expand all groups").count() == 0
    page.screenshot(path=str(tmp_path / "0-lineage.png"))

    # 1. the asset graph: every stage of the pipeline, wired in order
    page.goto(f"{base}/assets/generations?view=lineage&lineageDepth=4", wait_until="networkidle")
    for name in ("source__demo", "prompts", "tokenized_prompts", "generations", "training_samples"):
        page.get_by_text(name, exact=True).last.wait_for(state="visible")
    page.screenshot(path=str(tmp_path / "1-asset-graph.png"))

    # 2. our blocking checks are listed on their assets
    page.goto(f"{base}/assets/tokenized_prompts?view=checks", wait_until="networkidle")
    page.get_by_text("thinking_token_ends_prompt").first.wait_for(state="visible")
    page.goto(f"{base}/assets/generations?view=checks", wait_until="networkidle")
    page.get_by_text("think_end_present").first.wait_for(state="visible")
    page.screenshot(path=str(tmp_path / "2-checks.png"))

    # 3. materialize the ingest job (source__demo + prompts) from its page
    page.goto(f"{base}{LOCATION}/jobs/ingest", wait_until="networkidle")
    page.get_by_role("button", name="Materialize all").first.click()
    ingest_run = _launch_and_open_run(page)
    _wait_run_success(page, ingest_run, tmp_path / "3-ingest-run.png")

    # 4. one shard: shard_pipeline -> Materialize all… -> Custom partition 0000 -> Launch 1 run
    page.goto(f"{base}{LOCATION}/jobs/shard_pipeline", wait_until="networkidle")
    page.get_by_role("button", name="Materialize all").first.click()
    dialog = page.get_by_role("dialog").filter(has_text="Partition selection")
    dialog.get_by_text("Select a partition or create one").click()
    page.get_by_placeholder("Filter partitions").fill("0000")
    page.locator("label:visible", has_text="0000").first.click()
    page.keyboard.press("Escape")  # close the partition list, not the dialog
    launch = dialog.get_by_role("button", name="Launch 1 run")
    launch.wait_for(state="visible")
    page.screenshot(path=str(tmp_path / "4-partition-dialog.png"))
    launch.click()
    shard_run = _launch_and_open_run(page)
    _wait_run_success(page, shard_run, tmp_path / "5-shard-run.png")
    # the run's header: its status badge follows the log's RUN_SUCCESS on its own poll, so wait for it
    page.get_by_text("Success", exact=True).first.wait_for(state="visible", timeout=RUN_TIMEOUT_MS)
    assert re.search(r"partition:\s*0000", page.inner_text("body"))

    # the checks ran and passed for that shard (the assets' check pages say so)
    page.goto(f"{base}/assets/generations?view=checks", wait_until="networkidle")
    page.get_by_text("Passed").first.wait_for(state="visible")
    page.screenshot(path=str(tmp_path / "6-checks-after.png"))
    assert re.search(r"think_end_present\s+Succeeded", page.inner_text("body"))
    # a check's page plots its numeric metadata over every execution, across shards: the gate's per-shard
    # numbers are a table, so there is no plot of shard sizes (Dagster's empty state says so)
    page.get_by_text("generations_gate", exact=True).first.click()
    page.get_by_text("Plots", exact=True).first.wait_for(state="visible")  # open when there are executions
    empty = page.get_by_text("Include numeric metadata entries in your check metadata").first
    empty.scroll_into_view_if_needed()
    empty.wait_for(state="visible")
    page.screenshot(path=str(tmp_path / "6b-check-plots.png"))
    page.goto(f"{base}/assets/tokenized_prompts?view=checks", wait_until="networkidle")
    page.get_by_text("Passed").first.wait_for(state="visible")
    assert re.search(r"thinking_token_ends_prompt\s+Succeeded", page.inner_text("body"))

    # 5. the offline quality report: its own asset (the gated steps never draw it), materialized from the
    # `report` job's page, written beside gx/ in the work dir (the data dir here); it renders without the
    # network: every shard row, shard 0000 passed all gates
    page.goto(f"{base}{LOCATION}/jobs/report", wait_until="networkidle")
    page.get_by_role("button", name="Materialize").first.click()
    # nothing published yet: the UI warns that training_dataset (upstream) was never materialized; the
    # report draws what is stored, so go on
    page.get_by_role("button", name="Confirm").click()
    report_run = _launch_and_open_run(page)
    _wait_run_success(page, report_run, tmp_path / "9a-report-run.png")
    report = eagle3_ui.data / "reports" / "index.html"
    page.goto(report.as_uri(), wait_until="load")
    for shard in ("0000", "0001", "0002", "0003"):
        page.locator(f"th#shard-{shard}").wait_for(state="visible")
    row = page.locator("tr", has=page.locator("th#shard-0000")).inner_text()
    assert row.count("PASS") == 3 and "Data Docs" in row, row
    assert "not run" in page.locator("tr", has=page.locator("th#shard-0001")).inner_text()
    page.screenshot(path=str(tmp_path / "9-quality-report.png"), full_page=True)

    # 6. the GX Data Docs, built by that report run (the gates build none), list our suites; the gate result
    # (also the check's `data_docs_page` link) names its page under <data>/gx/gx/uncommitted/data_docs/local_site/
    gate = json.loads((eagle3_ui.data / "gates" / "generations" / "shard=0000.json").read_text())
    assert Path(gate["data_docs_page"]).is_file(), gate["data_docs_page"]
    index = eagle3_ui.data / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    assert index.exists(), index
    page.goto(index.as_uri(), wait_until="load")
    page.get_by_text("Expectation Suites").first.wait_for(state="visible")
    page.screenshot(path=str(tmp_path / "7-data-docs-index.png"), full_page=True)
    # GX renders the index tables with scripts from public CDNs, which an offline machine cannot load;
    # the rows (suite links) are in the page itself, so read them there and open each suite page,
    # which is static HTML and renders offline.
    listed = sorted(set(re.findall(r'href="(expectations/[A-Za-z0-9_]+\.html)"', page.content())))
    assert listed == [f"expectations/{g}_gate.html" for g in ("generations", "prompts", "training_samples")], listed
    for href in listed:
        suite = href.split("/")[1].removesuffix(".html")
        page.goto((index.parent / href).as_uri(), wait_until="load")
        text = page.inner_text("body")
        assert f"Expectations / {suite}" in text and "Expectation Suite Name" in text, text[:1000]
    page.goto((index.parent / "expectations" / "generations_gate.html").as_uri(), wait_until="load")
    assert "think_end_count" in page.inner_text("body")
    page.screenshot(path=str(tmp_path / "8-data-docs-generations-suite.png"), full_page=False)

    # 7. a candidate drafter judged from the UI (docs/drafter-compare.md): Materialize on `drafter_comparison`
    # opens the launchpad, whose run config takes the candidate's URL. The demo has no probe set, so there is no
    # production result to compare with: the comparison holds, saying why, and its check fails
    _judge_a_candidate_drafter(page, base, tmp_path)
    print(f"screenshots: {tmp_path}")


def _judge_a_candidate_drafter(page, base: str, tmp_path: Path) -> None:
    candidate = Sim(extra_args=("--speculative-draft-model-path", "org/candidate-eagle3"), log_path=tmp_path / "c.log")
    try:
        page.goto(f"{base}/assets/drafter_comparison", wait_until="networkidle")
        page.get_by_role("button", name="Materialize").first.click()
        # its upstream (`generations`) is not materialized for every shard: the UI asks first
        confirm, editor = page.get_by_role("button", name="Confirm"), page.locator(".CodeMirror")
        confirm.or_(editor).first.wait_for(state="visible")
        if confirm.is_visible():
            confirm.click()
        dialog = page.get_by_role("dialog").filter(has=editor)
        editor.first.wait_for(state="visible")
        config = f'ops:\n  drafter_comparison:\n    config:\n      candidate_urls: "{candidate.url}"\n'
        page.evaluate("(text) => document.querySelector('.CodeMirror').CodeMirror.setValue(text)", config)
        page.screenshot(path=str(tmp_path / "10-comparison-launchpad.png"))
        dialog.get_by_role("button", name="Materialize").last.click()
        page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)  # the launchpad opens the run's page
        run = page.url.rsplit("/runs/", 1)[1].split("?")[0]
        _wait_run_success(page, run, tmp_path / "11-comparison-run.png")
        page.get_by_text("Check promotion_rule failed").first.wait_for(state="visible", timeout=RUN_TIMEOUT_MS)
        page.goto(f"{base}/assets/drafter_comparison?view=checks", wait_until="networkidle")
        page.get_by_text("promotion_rule").first.wait_for(state="visible")
        page.get_by_text("Failed").first.wait_for(state="visible")
        page.screenshot(path=str(tmp_path / "12-comparison-check.png"))
        body = page.inner_text("body")
        assert re.search(r"promotion_rule\s+Failed", body), body[:2000]
        assert "hold: no probe results of a production drafter yet" in body, body[:2000]  # the reason, on the page
    finally:
        candidate.kill()
