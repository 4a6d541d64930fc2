"""The gates (quality/*.py outside quality/report/) never import the report: a gate only gates, and
importing `eagle3_dagster.quality` must not pull in the HTML/SVG drawing code."""

from __future__ import annotations

import ast
from pathlib import Path

from eagle3_dagster.config import PROJECT_ROOT

QUALITY = PROJECT_ROOT / "eagle3_dagster" / "quality"
# the modules that moved into quality/report/, by the names they had beside the gates
REPORT_NAMES = {"report", "reports", "charts", "svg", "turns_report", "acceptance_report", "cli"}


def _quality_imports(path: Path) -> list[str]:
    """The quality-level modules `path` imports (relative `.x` / `from . import x`, or absolute)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1:
                out += [mod.split(".")[0]] if mod else [a.name for a in node.names]
            elif mod.startswith("eagle3_dagster.quality."):
                out.append(mod.split(".")[2])
    return out


def test_no_gate_module_imports_a_report_module():
    offenders = {
        p.name: bad
        for p in sorted(QUALITY.glob("*.py"))
        if (bad := [m for m in _quality_imports(p) if m in REPORT_NAMES or m.startswith("report_")])
    }
    assert offenders == {}, f"gate modules importing the report: {offenders}"
