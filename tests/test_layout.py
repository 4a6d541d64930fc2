"""Project layout rules, checked over the source tree (no process, no I/O beyond reading files).

- Only the settings modules read the process environment: eagle3_dagster/config.py (the pipeline)
  and eagle3_dagster/sim/settings.py (the simulator, a program of its own with its own CLI).
  Everything else is handed its values as parameters (a Settings object, a Secret, a URL).
- No module under eagle3_dagster/ is longer than 600 lines (one responsibility per module).

A module another part of issue 15 still has to fix is listed in PENDING_*; an entry that no longer
breaks the rule fails too, so the lists cannot go stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

from eagle3_dagster.config import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "eagle3_dagster"
ENV_READERS = {"eagle3_dagster/config.py", "eagle3_dagster/sim/settings.py"}
PENDING_ENV: dict[str, str] = {}  # none left
MAX_LINES = 600
PENDING_LINES: dict[str, str] = {}  # none left

_ENV_ATTRS = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def env_reads(source: str) -> list[str]:
    """Every place `source` touches the process environment: `line: what`."""
    found: list[str] = []
    nodes = list(ast.walk(ast.parse(source)))
    os_names = {"os"}  # `import os as o` too
    for node in nodes:
        if isinstance(node, ast.Import):
            os_names |= {a.asname or a.name for a in node.names if a.name == "os"}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            bad = [a.name for a in node.names if a.name in _ENV_ATTRS]
            if bad:
                found.append(f"{node.lineno}: from os import {', '.join(bad)}")
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in os_names and node.attr in _ENV_ATTRS:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
            elif isinstance(node.value, ast.Name) and node.value.id == "environ":
                found.append(f"{node.lineno}: environ.{node.attr}")
            elif node.attr == "EnvVar":  # dg.EnvVar: Dagster reads the environment at run time
                found.append(f"{node.lineno}: .EnvVar")
        elif isinstance(node, ast.Name) and node.id in ("EnvVar", "getenv"):
            found.append(f"{node.lineno}: {node.id}")
    return sorted(set(found), key=lambda x: int(x.split(":")[0]))


def _modules() -> dict[str, Path]:
    mods = {str(p.relative_to(PROJECT_ROOT)): p for p in sorted(PACKAGE.rglob("*.py"))}
    assert len(mods) > 50, f"found only {len(mods)} modules under {PACKAGE}"  # the scan is not vacuous
    return mods


def test_the_scanner_sees_every_way_of_reading_the_environment():
    samples = {
        "import os\nx = os.environ['A']": "os.environ",
        "import os\nx = os.environ.get('A')": "os.environ",
        "import os\nos.environ.setdefault('A', '1')": "os.environ",
        "import os\nx = os.getenv('A')": "os.getenv",
        "import os as o\nx = o.environ": "o.environ",
        "from os import environ\nx = environ.get('A')": "from os import environ",
        "from os import getenv\nx = getenv('A')": "from os import getenv",
        "import dagster as dg\nx = dg.EnvVar('A')": ".EnvVar",
        "from dagster import EnvVar\nx = EnvVar('A')": "EnvVar",
    }
    for src, what in samples.items():
        assert any(what in f for f in env_reads(src)), (src, env_reads(src))
    # a mapping handed in as a parameter is not the environment
    assert env_reads("def f(env):\n    return env.get('A')") == []


def test_only_the_settings_modules_read_the_environment():
    offenders = {}
    for rel, path in _modules().items():
        reads = env_reads(path.read_text())
        if reads and rel not in ENV_READERS and rel not in PENDING_ENV:
            offenders[rel] = reads
    assert not offenders, (
        "only eagle3_dagster/config.py (Settings.from_env) and eagle3_dagster/sim/settings.py read the "
        f"environment; pass values as parameters instead: {offenders}"
    )
    # the allowed readers exist and do read it (the rule is about them, not about nothing)
    for rel in ENV_READERS:
        assert env_reads((PROJECT_ROOT / rel).read_text()), rel
    stale = [rel for rel in PENDING_ENV if not env_reads((PROJECT_ROOT / rel).read_text())]
    assert not stale, f"no longer reads the environment: remove from PENDING_ENV: {stale}"


def test_no_module_is_longer_than_600_lines():
    sizes = {rel: len(p.read_text().splitlines()) for rel, p in _modules().items()}
    too_long = {rel: n for rel, n in sizes.items() if n > MAX_LINES and rel not in PENDING_LINES}
    assert not too_long, f"split these modules (one responsibility each, <= {MAX_LINES} lines): {too_long}"
    stale = [rel for rel in PENDING_LINES if sizes.get(rel, 0) <= MAX_LINES]
    assert not stale, f"no longer over {MAX_LINES} lines: remove from PENDING_LINES: {stale}"
