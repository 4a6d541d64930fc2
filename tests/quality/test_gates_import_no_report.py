"""The gates (quality/) never import the report (report/): a gate only gates, and importing
`eagle3_dagster.quality` must not pull in the HTML/SVG drawing code."""

from __future__ import annotations

import ast
from pathlib import Path

from eagle3_dagster.config import PROJECT_ROOT

QUALITY = PROJECT_ROOT / "eagle3_dagster" / "quality"


def _report_imports(path: Path) -> list[str]:
    """The report modules `path` (a module directly in quality/) imports, relative (`..report`) or absolute."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if (node.level == 2 and mod.split(".")[0] == "report") or mod.startswith("eagle3_dagster.report"):
                out.append(mod)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("eagle3_dagster.report")]
    return out


def test_no_gate_module_imports_a_report_module():
    offenders = {p.name: bad for p in sorted(QUALITY.rglob("*.py")) if (bad := _report_imports(p))}
    assert offenders == {}, f"gate modules importing the report: {offenders}"
