"""Pictures in the offline report: inline SVG charts of the snapshot and each shard, drift on top.

Two nights are stored with the real code paths (real Kimi ids, real GX gates with per-source counts,
real snapshots judged by the publish and drift suites), the report is written, then opened in
Chromium at 1280 px: every chart renders (non-empty SVG with bars), is visible and fits the width.
The screenshot is kept as a test artifact (its path is printed).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import polars as pl
import pytest
from quality_helpers import EXPECTATIONS_DIR, training_rows

from eagle3_dagster.publish.snapshot import PublishPolicy, SnapshotContent, build_snapshot
from eagle3_dagster.publish.snapshot_gates import judge_snapshot
from eagle3_dagster.quality import read_gate_result, run_gate, training_features, write_gate_result
from eagle3_dagster.quality.features import available_source_shares
from eagle3_dagster.report.html import write_report
from eagle3_dagster.storage import write_frame_atomic
from eagle3_dagster.train.summary import SUMMARY_FILE, summarize_samples

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WORDS = [
    "we",
    "consider",
    "the",
    "numbers",
    "carefully",
    "then",
    "check",
    "each",
    "step",
    "and",
    "verify",
    "the",
    "sum",
    "before",
    "answering",
]


def _samples(kimi, shard: int, night: int) -> pl.DataFrame:
    rng = random.Random(shard * 100 + 7)
    rows = []
    for i in range(40):
        n_words = rng.randint(30, 160) // (5 if night == 2 else 1)
        reasoning = " ".join(rng.choice(WORDS) for _ in range(max(n_words, 2)))
        tool = ("get_weather", '{"city": "Paris"}') if i % 5 == 0 else None
        out = kimi.output(reasoning, f"The answer is {i}.", tool=tool)
        if i % 9 == 0:
            out = out[:-1]  # cut at max_new_tokens
        src = "gsm8k" if i % 3 else "alpaca"
        rows.append(
            dict(
                sample_id=f"s{shard}-{i}",
                prompt_id=f"p{shard}-{i}",
                source=src,
                prompt_ids=kimi.prompt(f"Question {shard}-{i}: what is {i} + {i}?"),
                output_ids=out,
            )
        )
    df = training_rows(rows)
    return df.with_columns(
        pl.when(pl.col("input_ids").list.last() == kimi.p.end_of_turn_id)
        .then(pl.lit("stop"))
        .otherwise(pl.lit("length"))
        .alias("finish_reason"),
        pl.lit(f"moonshotai/Kimi-K2.5@{'default' if night == 1 else 'v2-int4'}").alias("model_revision"),
    )


def _night(data: Path, kimi, profile, night: int):
    for shard in (0, 1):
        samples = _samples(kimi, shard, night)
        folder = data / "training_samples" / f"shard={shard:04d}"
        write_frame_atomic(samples, folder / "part-0000.parquet")
        (folder / SUMMARY_FILE).write_text(json.dumps(summarize_samples(samples, profile)))
        if night == 1:
            shares = available_source_shares(samples)
            feats = training_features(samples, profile, max_total_len=65536, available_shares=shares)
            res = run_gate(
                "training_samples",
                feats,
                expectations_dir=EXPECTATIONS_DIR,
                context_dir=data / "gx",
                profile=profile,
            )
            assert res.success and res.by_source
            for gate in ("prompts", "generations", "training_samples"):
                write_gate_result(data, gate, shard, res)

    def judge(facts):
        return judge_snapshot(
            facts,
            expectations_dir=EXPECTATIONS_DIR,
            context_dir=data / "gx",
        )

    return build_snapshot(
        data,
        [0, 1],
        lambda g, k: read_gate_result(data, g, k),
        SnapshotContent(config={}, profile=profile),
        policy=PublishPolicy(judge=judge),
    )


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory, kimi, kimi_profile):
    data = tmp_path_factory.mktemp("charts") / "data"
    first = _night(data, kimi, kimi_profile, 1)
    second = _night(data, kimi, kimi_profile, 2)
    report = write_report(data, data, n_shards=2, profile="kimi-k2.5")
    return data, first, second, report


def test_report_has_charts_and_drift_on_top(two_nights):
    _data, first, second, report = two_nights
    assert first.published and second.published and second.verdict.drift.status == "warned"
    text = report.read_text()
    assert "<script" not in text.lower() and "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    top = text[: text.index("Gates by shard")]
    assert "DRIFT WARNED" in top and "median reasoning length" in top
    titles = re.findall(r'<svg[^>]*aria-label="([^"]+)"', text)
    for want in (
        "reasoning length: before vs after",
        "snapshot: reasoning length (tokens before think-end)",
        "snapshot: answer length (after think-end)",
        "snapshot: prompt length",
        "snapshot: output length",
        "snapshot: finish reasons",
        "snapshot: rates",
        "training_samples gate: pass rate by source",
        "shard 0000: reasoning length (tokens before think-end)",
        "shard 0001: finish reasons",
    ):
        assert any(t.startswith(want) for t in titles), (want, titles)
    # counts and units are written on the charts
    assert "reasoning length (tokens)" in text and "samples" in text and "(n=80)" in text


@pytest.mark.integration  # Chromium through Playwright's driver process
def test_charts_render_visible_at_1280px_in_chromium(two_nights, tmp_path):
    from playwright.sync_api import sync_playwright

    _data, _, _, report = two_nights
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: run `bash scripts/ci-services.sh` (as root) first; `make test` does it")
    shot = tmp_path / "report-1280.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            ctx.route(re.compile(r"^(?!(file://|data:)).*"), lambda route: route.abort("blockedbyclient"))
            page = ctx.new_page()
            page.goto(report.as_uri(), wait_until="load")
            boxes = page.eval_on_selector_all(
                "svg.chart",
                """els => els.map(e => { const r = e.getBoundingClientRect();
                    return {w: r.width, h: r.height, right: r.right, visible: !!e.offsetParent || r.width > 0,
                            bars: [...e.querySelectorAll('rect')].filter(b => b.getBBox().height > 0.5).length,
                            label: e.getAttribute('aria-label')}; })""",
            )
            shown = [b for b in boxes if b["w"] > 0]
            assert len(shown) >= 12, boxes
            for b in shown:
                assert b["w"] >= 300 and b["h"] >= 100 and b["right"] <= 1280, b
                assert b["bars"] >= 2, b  # background + at least one bar
            assert page.evaluate("document.documentElement.scrollWidth") <= 1280
            # per-shard charts open natively (<details>, no script)
            page.click("#dist-0001 > summary")
            opened = page.eval_on_selector_all(
                "#dist-0001 svg.chart", "els => els.map(e => e.getBoundingClientRect().width)"
            )
            assert opened and all(w >= 300 for w in opened), opened
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 20_000
    print(f"report screenshot: {shot}")
