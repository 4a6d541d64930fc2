"""Project layout rules, checked over the source tree (no process, no I/O beyond reading files).

- Only the settings modules read the process environment: eagle3_dagster/config.py (the pipeline)
  and eagle3_dagster/sim/settings.py (the simulator, a program of its own with its own CLI).
  Everything else is handed its values as parameters (a Settings object, a Secret, a URL).
- `config.settings()` is called only where the app's commands and the definitions start (SETTINGS_READERS):
  no asset body, sensor, schedule, resource method, stage or report function reads the settings when it
  runs; the definitions bind the values into the resources and the steps when they are built.
- No function under eagle3_dagster/ is longer than 80 lines (small named functions, cut by concept).
  ruff's PLR0915 (statements) and C901 (complexity) in pyproject.toml hold the same line at lint time.

- Test folders follow the packages: tests/<pkg>/ holds the tests of eagle3_dagster/<pkg>, and each of its
  test modules imports that package; the gates' folder holds no report test.

A module still allowed to break the environment rule is listed in PENDING_ENV; an entry that no longer
breaks it fails too, so the list cannot go stale.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from eagle3_dagster.config import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "eagle3_dagster"
TESTS = PROJECT_ROOT / "tests"
ENV_READERS = {"eagle3_dagster/config.py", "eagle3_dagster/sim/settings.py"}
PENDING_ENV: dict[str, str] = {}  # none left
MAX_FUNCTION_LINES = 80

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


# (module, function) -> what starts there. Each reads the settings once and hands their values on.
SETTINGS_READERS = {
    ("eagle3_dagster/definitions.py", "<module>"): "the code location: `defs = build_definitions(settings())`",
    ("eagle3_dagster/app/demo.py", "run_graph_command"): "`eagle3 demo`, `eagle3 backfill`",
    ("eagle3_dagster/app/backfill.py", "run"): "`eagle3 backfill` (refused without EAGLE3_SGLANG_URL)",
    ("eagle3_dagster/app/ui.py", "run"): "`eagle3 ui`",
    ("eagle3_dagster/app/checkup.py", "run_check"): "`eagle3 check`",
    ("eagle3_dagster/app/smoke.py", "main"): "the smoke check after `make demo`",
    ("eagle3_dagster/report/cli.py", "run_inspect"): "`eagle3 inspect`",
    ("eagle3_dagster/report/cli.py", "run_report"): "`eagle3 report`",
    ("eagle3_dagster/plan/cli.py", "run"): "`eagle3 plan`",
    ("eagle3_dagster/drafters/cli.py", "run"): "`eagle3 drafters compare`",
    ("eagle3_dagster/ingest/cli.py", "run"): "`eagle3 ingest`",
    ("eagle3_dagster/tokenize/cli.py", "run"): "`eagle3 render`",
    ("eagle3_dagster/sim/server.py", "resolve_profile"): "the simulator's start (its default model profile)",
}


def settings_calls(source: str) -> list[tuple[str, int]]:
    """Every call of config.settings() in `source`: (the outermost function around it, or "<module>", line)."""
    tree = ast.parse(source)
    names, modules = set(), set()  # `from ..config import settings [as x]`; `from .. import config [as c]`
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            from_config = (node.module or "").split(".")[-1] == "config"
            names |= {a.asname or a.name for a in node.names if from_config and a.name == "settings"}
            modules |= {a.asname or a.name for a in node.names if a.name == "config"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name.endswith(".config") and a.asname}
        elif isinstance(node, ast.FunctionDef) and node.name == "settings" and node in tree.body:
            names.add("settings")  # config.py itself

    def is_settings(call: ast.Call) -> bool:
        f = call.func
        if isinstance(f, ast.Name):
            return f.id in names
        return (
            isinstance(f, ast.Attribute)
            and f.attr == "settings"
            and isinstance(f.value, ast.Name)
            and (f.value.id in modules)
        )

    found = []
    for top in tree.body:
        where = top.name if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else "<module>"
        found += [(where, n.lineno) for n in ast.walk(top) if isinstance(n, ast.Call) and is_settings(n)]
    return found


def test_the_settings_call_scanner_sees_every_way_of_calling_it():
    samples = {
        "from ..config import settings\ndef run():\n    return settings().fleet": [("run", 3)],
        "from eagle3_dagster.config import settings as st\nclass R:\n    def m(self):\n        st()": [("R", 4)],
        "from .. import config\nx = config.settings()": [("<module>", 2)],
        "import eagle3_dagster.config as c\ndef f():\n    def g():\n        c.settings()": [("f", 4)],
        "from ..config import Settings\ndef f(s: Settings):\n    return s.settings()": [],  # not config's
        "def settings():\n    pass\ndef wait(s=None):\n    return s or settings()": [("wait", 4)],  # config.py's own
    }
    for src, want in samples.items():
        assert settings_calls(src) == want, src


def test_only_the_entry_points_read_the_settings():
    """The definitions, and each command of the app, read the settings once where they start; what they run
    (asset bodies, sensors, schedules, resource methods, stages, the report) is handed values, so a step sees
    exactly the settings its definitions were built from (tests/pipeline/test_build_definitions.py)."""
    calls = {(rel, where): line for rel, path in _modules().items() for where, line in settings_calls(path.read_text())}
    unexpected = {
        f"{rel}:{line} in {where}" for (rel, where), line in calls.items() if (rel, where) not in SETTINGS_READERS
    }
    assert not unexpected, (
        "settings() is read only where the app's commands and the definitions start; hand the values down "
        f"(a parameter, a resource field bound in defs/common/resources.py, a value the asset factory closes over): {sorted(unexpected)}"
    )
    stale = set(SETTINGS_READERS) - set(calls)
    assert not stale, f"no longer reads the settings: remove from SETTINGS_READERS: {sorted(stale)}"


def long_functions(source: str, limit: int) -> list[str]:
    """Every function or method in `source` longer than `limit` lines (def line to last line): `line: name (n)`.

    A nested function counts on its own and inside the function around it.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > limit:
                found.append(f"{node.lineno}: {node.name} ({n})")
    return found


def test_the_function_scanner_measures_from_def_to_last_line():
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    assert long_functions(f"def f():\n{body}\n", 4) == []
    assert long_functions(f"def f():\n{body}\n", 3) == ["1: f (4)"]
    nested = f"class C:\n    async def m(self):\n        def g():\n{textwrap.indent(body, '        ')}\n"
    assert long_functions(nested, 3) == ["2: m (5)", "3: g (4)"]


def test_no_function_is_longer_than_80_lines():
    too_long = {}
    for rel, path in _modules().items():
        found = long_functions(path.read_text(), MAX_FUNCTION_LINES)
        if found:
            too_long[rel] = found
    assert not too_long, f"cut these into small named functions (<= {MAX_FUNCTION_LINES} lines): {too_long}"


MAX_PARAMETERS = 7  # pyproject's ruff max-args (PLR0913); this scan also sees `_name` parameters and `noqa`


def many_parameters(source: str, limit: int) -> dict[str, int]:
    """Every function or method in `source` with more than `limit` parameters: name -> count. Keyword-only,
    positional-only and `_name` parameters count, `*args`/`**kwargs` and a method's self/cls do not."""
    tree = ast.parse(source)
    methods = {
        id(item)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
        and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in item.decorator_list)
    }
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - (id(node) in methods)
            if n > limit:
                found[node.name] = n
    return found


def test_the_parameter_scanner_counts_keyword_only_and_skips_self():
    src = "def f(a, /, b, *args, c, _d, **kw): pass\nclass C:\n    def m(self, a, b): pass\n"
    assert many_parameters(src, 3) == {"f": 4}
    assert many_parameters(src, 1) == {"f": 4, "m": 2}


def test_no_function_takes_more_than_seven_parameters():
    found = {
        f"{rel}:{name}": n
        for rel, path in _modules().items()
        for name, n in many_parameters(path.read_text(), MAX_PARAMETERS).items()
    }
    assert not found, (
        f"group parameters that travel together in a small frozen dataclass (<= {MAX_PARAMETERS}): {found}"
    )


# Test folders that are no one package's: whole graphs on a Dagster instance, deployments (Postgres, object
# storage, executors, the browser), the parallel lane's start-up hook, test data.
CROSS_PACKAGE_TEST_DIRS = {"pipeline", "reliability", "background", "data"}
# Packages a test drives a stage through rather than tests: the CLI, the Dagster wiring, the dev tools.
DRIVER_PACKAGES = {"app", "defs", "orchestration", "devtools"}


def project_imports(source: str) -> tuple[set[str], set[str], set[str]]:
    """The eagle3_dagster modules or packages `source` imports (their first name under eagle3_dagster), anywhere
    in it and at its top level, and the local modules it imports (plain names: helpers beside it)."""
    anywhere: set[str] = set()
    top: set[str] = set()
    local: set[str] = set()
    tree = ast.parse(source)
    top_nodes = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            first, _, rest = node.module.partition(".")
            names = {rest.split(".")[0]} if rest else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            first, names = "eagle3_dagster", set()
            for a in node.names:
                head, _, rest = a.name.partition(".")
                if head == "eagle3_dagster" and rest:
                    names.add(rest.split(".")[0])
                elif "." not in a.name:
                    local.add(a.name)
        else:
            continue
        if first != "eagle3_dagster":
            if isinstance(node, ast.ImportFrom):
                local.add(node.module)
            continue
        anywhere |= names
        if id(node) in top_nodes:
            top |= names
    return anywhere, top, local


def _packages() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def modules_off_their_package(tests: Path = TESTS) -> dict[str, list[str]]:
    """Test modules in a package's folder that do not import it, by folder. A module whose imports reach its
    package through a helper module of its folder (tests/sim/sim_helpers.py) counts; one that imports no
    package but the base modules and the drivers drives its package from outside (the CLI in a process, the
    simulator over HTTP: a command it runs names no package) and is left to its folder."""
    packages = _packages()
    off: dict[str, list[str]] = {}
    for folder in sorted(d for d in tests.iterdir() if d.is_dir() and d.name in packages):
        helpers = {p.stem: project_imports(p.read_text())[0] for p in folder.glob("*.py")}
        for path in sorted(folder.glob("test_*.py")):
            imported, _, local = project_imports(path.read_text())
            for name in local & set(helpers):
                imported |= helpers[name]
            stages = imported & packages - DRIVER_PACKAGES
            if folder.name not in imported and stages:
                off.setdefault(folder.name, []).append(f"{path.name} (imports {', '.join(sorted(stages))})")
    return off


def report_tests_among_gates(tests: Path = TESTS) -> list[str]:
    """tests/quality/ modules that import the report at their top: the gates never draw the report
    (tests/quality/test_gates_import_no_report.py), so such a module tests the report and goes in tests/report/."""
    return [
        p.name for p in sorted((tests / "quality").glob("test_*.py")) if "report" in project_imports(p.read_text())[1]
    ]


def test_the_import_scanner_sees_each_form_and_where_it_is():
    source = textwrap.dedent(
        """
        import eagle3_dagster.quality.gate
        from eagle3_dagster import schemas, storage
        from eagle3_dagster.publish.snapshot import build_snapshot
        from quality_helpers import Kimi
        import sim_ctl

        def f():
            from eagle3_dagster.report.html import render
        """
    )
    anywhere, top, local = project_imports(source)
    assert anywhere == {"quality", "schemas", "storage", "publish", "report"}
    assert top == anywhere - {"report"}
    assert local == {"quality_helpers", "sim_ctl"}


def test_every_test_folder_is_a_package_or_a_named_cross_package_one():
    folders = {d.name for d in TESTS.iterdir() if d.is_dir() and not d.name.startswith((".", "__"))}
    assert folders - _packages() - CROSS_PACKAGE_TEST_DIRS == set(), "name it after its package, or list it"
    assert {"quality", "report", "publish", "train"} <= folders


def test_the_tests_in_a_package_folder_import_that_package():
    off = modules_off_their_package()
    assert not off, f"move each to the folder of the package it tests (git mv): {off}"


def test_the_report_tests_are_not_among_the_gates():
    found = report_tests_among_gates()
    assert not found, f"these test the report: move them to tests/report/ (git mv): {found}"
