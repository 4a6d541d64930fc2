"""Regenerate the README pictures from a real run: `.venv/bin/python scripts/screenshots.py`.

In a throwaway DAGSTER_HOME and data dir: `eagle3 demo` (the whole graph, with the simulator it starts),
the `training_dataset` freshness check evaluated once (what the `snapshot_freshness` sensor does under the
daemon), then `dagster-webserver` on 127.0.0.1 against that instance and Debian's Chromium (Playwright):

- docs/images/asset-graph.png: the Lineage view of the pipeline's assets, all materialized (vertical, so that it
  is legible at README width), cropped to the graph; the assets only a user's request materializes
  (ON_DEMAND_ASSETS) are left out of its selection, so the picture shows the pipeline a demo runs;
- docs/images/quality-report.png: the run's offline quality report: gates by shard, then the latest snapshot
  with its first two distributions.

`--out DIR` writes them elsewhere (tests/reliability/test_screenshots.py does). Nothing is written to the
project's own instance or data dir. Needs /usr/bin/chromium (`bash scripts/ci-services.sh` installs it).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "reliability")]  # this checkout's package and the browser helpers

from rel_helpers import (  # noqa: E402
    CHROMIUM,
    VENV_BIN,
    child_env,
    chromium_page,
    process_tree,
    stop_process_group,
    tail,
    wait_http,
)

from eagle3_dagster.sim.process import free_port  # noqa: E402

# the demo's assets, in graph order (source__demo is the demo source YAML's asset)
DEMO_ASSETS = (
    "source__demo",
    "prompts",
    "tokenized_prompts",
    "generations",
    "training_samples",
    "training_dataset",
    "quality_report",
)
# Assets no demo materializes: each waits for a user's request (its run config names what to judge). Lineage draws
# them beside the pipeline, "Never materialized" until asked; the picture's selection leaves them out. Every asset
# of the definitions is in DEMO_ASSETS or here (tests/reliability/test_screenshots.py).
ON_DEMAND_ASSETS = ("drafter_comparison",)  # a candidate drafter judged against production's (defs/drafters.py)
IMAGES = ROOT / "docs" / "images"
MAX_PNG_BYTES = 200_000  # tests/test_docs_reference.py
LINEAGE_VIEWPORT = {"width": 1400, "height": 2000}  # room for the vertical graph at NODE_WIDTH
NODE_WIDTH = 270  # px of one asset node, its rows readable at README width (the fitted zoom draws ~210)
REPORT_VIEWPORT = {"width": 1120, "height": 900}  # two 520-px charts side by side


@dataclass
class DemoRun:
    home: Path  # DAGSTER_HOME
    data: Path  # EAGLE3_DATA_DIR (also the work dir: the report is under it)

    def env(self) -> dict[str, str]:
        env = child_env(
            DAGSTER_HOME=str(self.home),
            EAGLE3_DATA_DIR=str(self.data),
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        )
        for k in ("EAGLE3_SGLANG_URL", "EAGLE3_WORK_DIR"):  # the demo starts its own simulator; report in data
            env.pop(k, None)
        return env

    @property
    def report(self) -> Path:
        return self.data / "reports" / "index.html"


def run_demo(root: Path) -> DemoRun:
    """`eagle3 demo` into root/{dagster_home,data}, then one evaluation of the freshness check; loud on failure."""
    run = DemoRun(home=root / "dagster_home", data=root / "data")
    root.mkdir(parents=True, exist_ok=True)
    log = root / "demo.log"
    with open(log, "wb") as logf:
        rc = subprocess.run(
            [sys.executable, "-m", "eagle3_dagster.app.cli", "demo"],
            cwd=ROOT,
            env=run.env(),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=900,
        ).returncode
    if rc != 0 or not run.report.exists():
        raise RuntimeError(f"eagle3 demo exited {rc} (report written: {run.report.exists()}):\n{tail(log, 60)}")
    out = subprocess.run(
        [sys.executable, __file__, "_freshness"], cwd=ROOT, env=run.env(), capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise RuntimeError(f"the freshness check did not pass:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return run


def _evaluate_freshness() -> int:
    """In a child with the run's environment: execute training_dataset:freshness_check once, as its sensor would."""
    import dagster as dg

    from eagle3_dagster.config import settings
    from eagle3_dagster.definitions import defs

    key = dg.AssetCheckKey(dg.AssetKey("training_dataset"), "freshness_check")
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_check_selection={key}, asset_selection=set())
    with dg.DagsterInstance.from_config(str(settings().dagster_home)) as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    evaluations = [(e.asset_check_key.to_user_string(), e.passed) for e in result.get_asset_check_evaluations()]
    print(f"freshness: {evaluations}")
    return 0 if result.success and evaluations == [(key.to_user_string(), True)] else 1


@contextmanager
def webserver(run: DemoRun, log: Path) -> Iterator[str]:
    """`dagster-webserver` on 127.0.0.1:<free port> against the run's instance; yields its URL."""
    port = free_port()
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [str(VENV_BIN / "dagster-webserver"), "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1"]
            + ["-p", str(port)],
            cwd=ROOT,
            env=run.env(),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    seen: set[int] = set()
    try:
        wait_http(f"{url}/server_info", timeout=180, proc=proc, log=log)
        seen.update(process_tree(proc.pid))
        yield url
    finally:
        seen.update(process_tree(proc.pid))
        stop_process_group(proc, sorted(seen))


def _node(page: Any, name: str) -> Any:
    """An asset's node in full detail (not the zoomed-out name box): its title and its rows."""
    return page.locator("div", has=page.get_by_text(name, exact=True)).filter(has_text="Asset checks").last


def pipeline_lineage_path() -> str:
    """Lineage (the nav's /asset-groups) with a selection that leaves out ON_DEMAND_ASSETS (the selection box
    shows it); the UI's URL form of a selection is `/asset-groups~<query>/`."""
    query = " and ".join(f'not key:"{name}"' for name in ON_DEMAND_ASSETS)
    return f"/asset-groups~{urllib.parse.quote(query, safe='')}/"


def open_lineage(page: Any, url: str) -> dict[str, str]:
    """The pipeline's Lineage view, vertical, without the side panels, zoomed to NODE_WIDTH; returns each node's
    text."""
    page.goto(f"{url}{pipeline_lineage_path()}", wait_until="networkidle")
    page.get_by_text(DEMO_ASSETS[-1], exact=True).last.wait_for(state="visible")
    page.locator("button:has([aria-label=settings])").last.click()  # the graph's own settings menu
    page.get_by_text("Change graph to vertical orientation").click()  # kept in the browser's storage
    page.reload(wait_until="networkidle")  # so that the graph is laid out and fitted afresh
    page.get_by_role("button", name="Hide navigation").click()
    page.locator("button:has([aria-label=panel_show_right])").last.click()  # the asset list beside the graph
    for name in DEMO_ASSETS:
        _node(page, name).wait_for(state="visible")
    for _ in range(12):  # the fitted zoom is small for a README; each click is a few per cent
        if _node(page, DEMO_ASSETS[0]).bounding_box()["width"] >= NODE_WIDTH:
            break
        page.locator("button:has([aria-label=zoom_in])").click()
        page.wait_for_timeout(300)
    page.wait_for_timeout(1000)  # the zoom's and the edges' animation
    return _loaded_node_texts(page)


def _loaded_node_texts(page: Any, timeout_s: float = 60.0) -> dict[str, str]:
    """Each node's text once its figures have arrived: the UI fills nodes in one by one after the layout."""
    deadline = time.monotonic() + timeout_s
    while True:
        texts = {name: _node(page, name).inner_text() for name in DEMO_ASSETS}
        loading = [name for name, text in texts.items() if "Loading" in text]
        if not loading or time.monotonic() > deadline:
            return texts
        page.wait_for_timeout(500)


def _graph_box(page: Any) -> dict[str, float]:
    """The clip around every demo node, their kind tags below them and a margin."""
    boxes = [_node(page, name).bounding_box() for name in DEMO_ASSETS]
    left, top = min(b["x"] for b in boxes), min(b["y"] for b in boxes)
    right, bottom = max(b["x"] + b["width"] for b in boxes), max(b["y"] + b["height"] for b in boxes)
    view = page.viewport_size
    if left < 0 or top < 0 or right > view["width"] or bottom + 40 > view["height"]:
        raise RuntimeError(f"the graph ({left:.0f},{top:.0f})-({right:.0f},{bottom:.0f}) is not all on screen {view}")
    m = 20
    return {"x": left - m, "y": top - m, "width": right - left + 2 * m, "height": bottom - top + 40 + m}


def save_png(png: bytes, out: Path) -> int:
    """Write a screenshot as a palette PNG (UI colours are few); fails if it is over the README's size limit."""
    from PIL import Image

    im = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    im.save(out, optimize=True)
    size = out.stat().st_size
    if size >= MAX_PNG_BYTES:
        raise RuntimeError(f"{out} is {size:,} bytes, over {MAX_PNG_BYTES:,} (tests/test_docs_reference.py)")
    return size


def shoot_lineage(page: Any, out: Path) -> int:
    return save_png(page.screenshot(clip=_graph_box(page)), out)


def shoot_report(page: Any, report: Path, out: Path) -> int:
    """Two parts of the report page, stacked: gates by shard; the latest snapshot and its first two distributions."""
    from PIL import Image

    page.goto(report.as_uri(), wait_until="load")
    page.locator("th#shard-0000").wait_for(state="visible")

    def part(top: Any, bottom: Any) -> Any:
        """The page from `top`'s top edge to `bottom`'s bottom edge (page coordinates: the page is not scrolled)."""
        t, b = top.bounding_box(), bottom.bounding_box()
        clip = {
            "x": 0,
            "y": t["y"] - 8,
            "width": REPORT_VIEWPORT["width"],
            "height": b["y"] + b["height"] - t["y"] + 16,
        }
        return Image.open(io.BytesIO(page.screenshot(clip=clip, full_page=True))).convert("RGB")

    gates = page.locator("h2", has_text="Gates by shard")
    gates_table = page.locator("h2:has-text('Gates by shard') + table")
    snapshot = page.locator("h2#snapshot-status")
    charts = page.locator("h2#snapshot-status ~ div.charts").first.locator("svg.chart")
    parts = [part(gates, gates_table), part(snapshot, charts.nth(1))]
    sheet = Image.new("RGB", (REPORT_VIEWPORT["width"], sum(p.height for p in parts)), "white")
    y = 0
    for p in parts:
        sheet.paste(p, (0, y))
        y += p.height
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    return save_png(buf.getvalue(), out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/screenshots.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=IMAGES, help="folder for the PNGs (default docs/images)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary instance and data dir (prints where)")
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} not found: run `bash scripts/ci-services.sh` (as root) once", file=sys.stderr)
        return 1
    root = Path(tempfile.mkdtemp(prefix="eagle3-shots-"))
    try:
        print(f"[shots] eagle3 demo in {root} ...", flush=True)
        run = run_demo(root)
        with webserver(run, root / "webserver.log") as url, chromium_page(LINEAGE_VIEWPORT) as page:
            nodes = open_lineage(page, url)
            never = [n for n, text in nodes.items() if "Never materialized" in text]
            if never:
                raise RuntimeError(f"not materialized in the UI: {never}")
            size = shoot_lineage(page, args.out / "asset-graph.png")
            print(f"[shots] {args.out / 'asset-graph.png'}: {size:,} bytes", flush=True)
            page.set_viewport_size(REPORT_VIEWPORT)
            size = shoot_report(page, run.report, args.out / "quality-report.png")
            print(f"[shots] {args.out / 'quality-report.png'}: {size:,} bytes", flush=True)
    finally:
        if args.keep:
            print(f"[shots] kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["_freshness"]:
        sys.exit(_evaluate_freshness())
    sys.exit(main())
