"""scripts/screenshots.py, which redraws the README pictures, shows a materialized run with its checks passed.

One real `eagle3 demo` (simulator) in tmp dirs, `dagster-webserver` on it, Debian's Chromium: what the Lineage
view says about every demo asset before the shot, then both PNGs (written to tmp, not to docs/images). Every asset
of the definitions is in the picture and materialized by the demo, or is one a user's request materializes
(the script's ON_DEMAND_ASSETS), which the demo leaves alone and the picture leaves out.
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


def _assets_and_checks() -> tuple[set[str], Counter[str]]:
    """Every asset of the definitions, and the number of checks on each."""
    from eagle3_dagster.definitions import defs

    graph = defs.resolve_asset_graph()
    assets = {k.to_user_string() for k in graph.get_all_asset_keys()}
    return assets, Counter(k.asset_key.to_user_string() for k in graph.asset_check_keys)


def _materialized(run, names) -> dict[str, bool]:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(run.home)) as instance:
        return {n: instance.get_latest_materialization_event(dg.AssetKey(n)) is not None for n in names}


def test_the_lineage_picture_shows_every_demo_asset_materialized_with_its_checks_passed(tmp_path: Path) -> None:
    require_os_package("chromium", CHROMIUM, Path(CHROMIUM).exists())
    shots = _script()
    assets, checks = _assets_and_checks()
    demo, on_demand = set(shots.DEMO_ASSETS), set(shots.ON_DEMAND_ASSETS)
    assert assets == demo | on_demand and not demo & on_demand, (sorted(assets), demo, on_demand)
    assert checks["training_dataset"] == 3, checks  # incl. freshness
    run = shots.run_demo(tmp_path / "run")
    # an on-demand asset is one the demo leaves alone (else it belongs in the picture)
    assert _materialized(run, sorted(on_demand)) == dict.fromkeys(sorted(on_demand), False)
    with shots.webserver(run, tmp_path / "webserver.log") as url, chromium_page(shots.LINEAGE_VIEWPORT) as page:
        nodes = shots.open_lineage(page, url)
        body = page.inner_text("body")
        assert "Never materialized" not in body
        assert not [name for name in on_demand if page.get_by_text(name, exact=True).count()], body[:2000]
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
