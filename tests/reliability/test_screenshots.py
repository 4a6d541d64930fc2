"""scripts/screenshots.py, which redraws the README pictures, shows a materialized run with its checks passed.

One real `eagle3 demo` (simulator) in tmp dirs, `dagster-webserver` on it, Debian's Chromium: what the Lineage
view says about every demo asset before the shot, then both PNGs (written to tmp, not to docs/images).
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image
from rel_helpers import CHROMIUM, ROOT, chromium_page, require_os_package

pytestmark = pytest.mark.integration


def _script():
    spec = importlib.util.spec_from_file_location("eagle3_screenshots", ROOT / "scripts" / "screenshots.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _checks_per_asset() -> Counter[str]:
    from eagle3_dagster.definitions import defs

    return Counter(k.asset_key.to_user_string() for k in defs.resolve_asset_graph().asset_check_keys)


def test_the_lineage_picture_shows_every_demo_asset_materialized_with_its_checks_passed(tmp_path: Path) -> None:
    require_os_package("chromium", CHROMIUM, Path(CHROMIUM).exists())
    shots = _script()
    checks = _checks_per_asset()
    assert set(checks) <= set(shots.DEMO_ASSETS) and checks["training_dataset"] == 3, checks  # incl. freshness
    run = shots.run_demo(tmp_path / "run")
    with shots.webserver(run, tmp_path / "webserver.log") as url, chromium_page(shots.LINEAGE_VIEWPORT) as page:
        nodes = shots.open_lineage(page, url)
        assert "Never materialized" not in page.inner_text("body")
        for name in shots.DEMO_ASSETS:
            text = nodes[name]
            partitioned = "4 partitions" in text
            # unpartitioned: "Materialized <date>"; the 4 shards: every partition filled
            assert ("100% filled" in text) if partitioned else ("\nMaterialized\n" in text), f"{name}: {text!r}"
            n = checks[name]
            shown = f"{n} / {n} Passed" if n else "\u2013"  # an en dash: the asset has no checks
            assert f"Asset checks\n{shown}\n" in text, f"{name}: {text!r}"
        assert sum("4 partitions" in t for t in nodes.values()) == 3, nodes  # tokenized, generations, training
        graph = tmp_path / "asset-graph.png"
        size = shots.shoot_lineage(page, graph)
        report = tmp_path / "quality-report.png"
        report_size = shots.shoot_report(page, run.report, report)
    for png, n in ((graph, size), (report, report_size)):
        assert png.stat().st_size == n < shots.MAX_PNG_BYTES, (png, n)
    width, height = Image.open(graph).size
    assert 300 < width < 700 and height > 2 * width, (width, height)  # vertical, README-width, every node
    assert Image.open(report).size[0] == shots.REPORT_VIEWPORT["width"]
