"""Shared test fixtures: the read-only ../shared folder, profiles bound to its tokenizers."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Generator
from pathlib import Path

import pytest
from quality_helpers import EXPECTATIONS_DIR, Kimi
from serial_lane import is_serial, long_modules_first
from sim_forkserver import ForkLauncher

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.profiles import ModelProfile, load_profile
from eagle3_dagster.sim.process import use_launcher

SHARED = (PROJECT_ROOT.parent / "shared").resolve()
KIMI_TOKENIZER_DIR = SHARED / "tokenizers" / "kimi-k2.5"
QWEN_TOKENIZER_DIR = SHARED / "tokenizers" / "qwen3"
DATASETS_DIR = SHARED / "datasets"
MODELS_DIR = PROJECT_ROOT / "assets" / "models"

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Like the Makefile: the default (Kimi) profile's tokenizer is the offline copy in ../shared,
# for this process and every process a test starts (simulator, Dagster).
os.environ.setdefault("EAGLE3_TOKENIZER", str(KIMI_TOKENIZER_DIR))
SIM_LAUNCHER = pytest.StashKey[ForkLauncher]()


def pytest_configure(config: pytest.Config) -> None:
    if not KIMI_TOKENIZER_DIR.exists():
        raise pytest.UsageError(f"the tests need ../shared beside the project; not found: {SHARED}")
    # The simulators this process starts fork from one warm server process (tests/sim_forkserver.py).
    if os.environ.get("EAGLE3_TEST_SIM_EXEC") != "1":
        config.stash[SIM_LAUNCHER] = ForkLauncher([KIMI_TOKENIZER_DIR, QWEN_TOKENIZER_DIR])
        use_launcher(config.stash[SIM_LAUNCHER])


def pytest_unconfigure(config: pytest.Config) -> None:
    launcher = config.stash.get(SIM_LAUNCHER, None)
    if launcher is not None:
        use_launcher(None)
        launcher.close()


# --- the `integration` marker: every test that starts a process (simulator, Dagster, Postgres, Chromium,
# moto, the CLI) carries it, so `make test-fast` (pytest -m "not integration") runs in-process tests only.
# A test gets it from its module (`pytestmark`), its own decorator, or here, from a process-starting
# fixture it uses: (folder or module that defines the fixture, fixture name).
PROCESS_FIXTURES = {
    ("tests/sim", "sim"),
    ("tests/sim", "sim059"),
    ("tests/sim", "qsim"),
    ("tests/generate", "start_sim"),
    ("tests/generate", "shared_sim"),
    ("tests/generate/test_generate_basic.py", "short_ctx_sim"),
    ("tests/generate/test_fleet.py", "pair"),
    ("tests/pipeline/test_end_to_end.py", "normal_sim"),
    ("tests/reliability", "eagle3_ui"),
    ("tests/reliability/test_browser.py", "page"),
    ("tests/reliability/test_postgres_pool.py", "pg"),
    ("tests/reliability/test_object_storage.py", "moto_s3"),
    ("tests/reliability/test_fault_matrix.py", "matrix"),
    ("tests/ingest/test_ingest_remote.py", "moto_prompts"),
}


def _mark_integration(item: pytest.Item) -> None:
    info = getattr(item, "_fixtureinfo", None)
    if info is None or item.get_closest_marker("integration"):
        return
    used = {(d.baseid, name) for name, defs in info.name2fixturedefs.items() for d in defs[-1:]}
    if used & PROCESS_FIXTURES:
        item.add_marker(pytest.mark.integration)


# --- the serial lane (tests/serial_lane.py): `make test` runs `-m "not serial"` in xdist workers, then `-m serial`.
@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        _mark_integration(item)
        info = getattr(item, "_fixtureinfo", None)
        if is_serial(item.nodeid.split("::")[0], info.name2fixturedefs if info else ()):
            item.add_marker(pytest.mark.serial)
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::")[0], []).append(item)
    items[:] = [item for module in long_modules_first(list(by_module)) for item in by_module[module]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _no_process_unless_integration(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _no_process_unless_integration(item, "call"))


def _no_process_unless_integration(item: pytest.Item, phase: str) -> Generator[None, None, None]:
    """Fail a test not marked `integration` that starts a process, so `make test-fast` stays in-process."""
    if item.get_closest_marker("integration"):
        return (yield)
    started: list[str] = []
    popen_init, process_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def recording_popen_init(self: subprocess.Popen, args: object, *a: object, **kw: object) -> None:
        # platform.architecture() runs `file -b <python>` (dagster's vendored croniter asks on first
        # import, so whichever test imports it first would fail): a library probe, not a service
        if not (isinstance(args, list) and args[:2] == ["file", "-b"]):
            started.append(f"subprocess {args!r}"[:200])
        popen_init(self, args, *a, **kw)

    def recording_process_start(self: multiprocessing.process.BaseProcess) -> None:
        started.append(f"multiprocessing {self.name}")
        process_start(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "__init__", recording_popen_init)
        mp.setattr(multiprocessing.process.BaseProcess, "start", recording_process_start)
        result = yield
    if started:
        pytest.fail(
            f"{item.nodeid} started a process during {phase} but is not marked integration "
            f"(mark it, or list its fixture in tests/conftest.py PROCESS_FIXTURES): {started}"
        )
    return result


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return SHARED


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    return DATASETS_DIR


@pytest.fixture(scope="session")
def kimi_profile() -> ModelProfile:
    return load_profile("kimi-k2.5", MODELS_DIR).with_tokenizer(str(KIMI_TOKENIZER_DIR))


@pytest.fixture(scope="session")
def qwen_profile() -> ModelProfile:
    return load_profile("qwen3", MODELS_DIR).with_tokenizer(str(QWEN_TOKENIZER_DIR))


@pytest.fixture(scope="session")
def kimi_tokenizer(kimi_profile: ModelProfile):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(KIMI_TOKENIZER_DIR))


@pytest.fixture(scope="session")
def kimi(kimi_tokenizer, kimi_profile: ModelProfile) -> Kimi:
    """Kimi-K2.5 prompts and outputs as the real tokenizer and server make them (tests/quality_helpers.py)."""
    return Kimi(kimi_tokenizer, kimi_profile)


@pytest.fixture()
def gx_dirs(tmp_path: Path) -> dict[str, Path]:
    """The project's expectations and a GX context dir of the test's own, for run_gate."""
    return {"expectations_dir": EXPECTATIONS_DIR, "context_dir": tmp_path / "data" / "gx"}
