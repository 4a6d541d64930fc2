"""The layers of the package, held against its imports (read as text: nothing is imported or run).

From the top down (CONTRIBUTING.md draws them):

    App      the `eagle3` command, the demo, developer tools       app/ (cli, demo, ui, ...), devtools/
    Wiring   Dagster: assets, checks, resources, automation          defs/, orchestration/, definitions.py
    Report   reads stored results and draws                          report/
    Stages   one package per stage, plain functions                  ingest/ tokenize/ generate/ train/ plan/ publish/ drafters/
    Gates    features, suites, the GX engine                         quality/ (the rest)
    Base     settings, profiles, schemas, storage                    config.py, storage/, ...
    Sim      the SGLang-protocol simulator, a program of its own     sim/ (Base and the tokenizer loader; no stage needs it)

An import may run down the layers, never up; Stages and Gates may use each other's plain readers (the gates
read generations; publishing runs the snapshot gates), but never Report, Wiring or App; no two files import
each other, directly or round a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from eagle3_dagster.config import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "eagle3_dagster"

APP, WIRING, REPORT, STAGES, GATES, BASE, SIM = "App", "Wiring", "Report", "Stages", "Gates", "Base", "Sim"
RANK = {APP: 5, WIRING: 4, REPORT: 3, STAGES: 2, GATES: 2, BASE: 1}
APP_FILES = {"__main__.py"}
STAGE_DIRS = {"ingest", "tokenize", "generate", "train", "plan", "publish", "drafters"}


def layer(rel: str) -> str:
    """The layer of a file, `rel` relative to the package folder (`generate/shard.py`)."""
    parts = rel.split("/")
    top = parts[0]
    if len(parts) == 1:
        if rel in APP_FILES:
            return APP
        return WIRING if rel == "definitions.py" else BASE
    if top in ("defs", "orchestration"):
        return WIRING
    if top == "report":
        return REPORT
    if top == "quality":
        return GATES
    if top == "sim":
        return SIM
    if top in STAGE_DIRS:
        return STAGES
    if top in ("storage",):
        return BASE
    if top in ("app", "devtools"):
        return APP
    raise AssertionError(f"{rel}: no layer for this folder; add it to tests/test_architecture.py and CONTRIBUTING.md")


def _files() -> dict[str, Path]:
    files = {str(p.relative_to(PACKAGE)): p for p in sorted(PACKAGE.rglob("*.py"))}
    assert len(files) > 50, files  # the scan is not vacuous
    return files


def _module_of(rel: str) -> list[str]:
    parts = rel[: -len(".py")].split("/")
    return parts[:-1] if parts[-1] == "__init__" else parts


def _resolve(names: list[str], files: dict[str, Path]) -> str | None:
    """The file behind a dotted path inside the package: a module, or a package's __init__."""
    base = "/".join(names)
    for rel in (f"{base}.py", f"{base}/__init__.py" if base else "__init__.py"):
        if rel in files:
            return rel
    return None


def imports_of(rel: str, source: str, files: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, file) for every import of a package file in `source`, relative or absolute, at any depth."""
    here = _module_of(rel)
    package = here if rel.endswith("__init__.py") else here[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
            for t in targets:
                if t[0] == "eagle3_dagster" and (hit := _resolve(t[1:], files)):
                    yield node.lineno, hit
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                mod = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "eagle3_dagster":
                mod = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:  # `from . import paths` names a module; `from .paths import X` a name
                hit = _resolve([*mod, alias.name], files) or _resolve(mod, files)
                if hit:
                    yield node.lineno, hit


def _graph() -> dict[str, dict[str, int]]:
    files = _files()
    graph: dict[str, dict[str, int]] = {}
    for rel, path in files.items():
        edges = graph.setdefault(rel, {})
        for line, target in imports_of(rel, path.read_text(), files):
            if target != rel:
                edges.setdefault(target, line)
    return graph


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    found = []
    for src, edges in graph.items():
        a = layer(src)
        for dst, line in edges.items():
            b = layer(dst)
            if a == b:
                continue
            if a == SIM or b == SIM:  # the simulator serves a tokenizer the way the tokenize stage loads it
                ok = (a == SIM and (b == BASE or dst.startswith("tokenize/"))) or (b == SIM and a == APP)
            else:
                ok = RANK[b] < RANK[a] or {a, b} == {STAGES, GATES}
            if not ok:
                found.append(f"{src}:{line} ({a}) imports {dst} ({b})")
    return found


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected groups of more than one file (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_scanner_resolves_relative_absolute_and_module_imports():
    files = {k: Path(k) for k in ("generate/shard.py", "storage/__init__.py", "storage/paths.py", "config.py")}
    src = "from ..storage import DataPath\nfrom ..storage import paths\nimport eagle3_dagster.config\nfrom .. import config"
    assert sorted(imports_of("generate/shard.py", src, files)) == [
        (1, "storage/__init__.py"),
        (2, "storage/paths.py"),
        (3, "config.py"),
        (4, "config.py"),
    ]


def test_the_checks_see_an_upward_import_and_a_circle():
    graph = {"generate/a.py": {"defs/b.py": 3}, "defs/b.py": {"generate/a.py": 1}}
    assert upward_imports(graph) == ["generate/a.py:3 (Stages) imports defs/b.py (Wiring)"]
    assert circles(graph) == [["defs/b.py", "generate/a.py"]]


def test_no_import_runs_up_the_layers():
    found = upward_imports(_graph())
    assert not found, "imports that run up the layers (CONTRIBUTING.md, 'The layers'):\n" + "\n".join(found)


def test_no_two_files_import_each_other_even_round_a_circle():
    found = circles(_graph())
    assert not found, "files that import each other (move the shared name down to where it belongs):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )
