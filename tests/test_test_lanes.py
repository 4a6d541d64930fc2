"""`make test`'s two lanes: the parallel one in pytest-xdist workers and the serial one after it
(tests/serial_lane.py), and the integration-marker rule of tests/conftest.py, which must hold inside an
xdist worker as in a plain run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serial_lane import FULL_TESTS, LONG_MODULES, SERIAL_MODULES, is_serial, long_modules_first

from eagle3_dagster.config import PROJECT_ROOT

TESTS = Path(__file__).resolve().parent


def test_timing_sensitive_modules_and_the_ui_run_in_the_serial_lane():
    assert is_serial("tests/generate/test_fleet_states.py", ["tmp_path"])
    assert is_serial("tests/reliability/test_security.py", ["eagle3_ui", "tmp_path"])
    assert not is_serial("tests/generate/test_faults.py", ["shared_sim", "tmp_path"])


def test_every_serial_module_exists():
    missing = sorted(m for m in SERIAL_MODULES if not (PROJECT_ROOT / m).is_file())
    assert not missing, f"moved or removed: update SERIAL_MODULES in tests/serial_lane.py: {missing}"


def test_the_longest_parallel_modules_are_handed_out_first():
    missing = sorted(m for m in LONG_MODULES if not (PROJECT_ROOT / m).is_file())
    assert not missing, f"moved or removed: update LONG_MODULES in tests/serial_lane.py: {missing}"
    assert not set(LONG_MODULES) & SERIAL_MODULES
    collected = ["tests/a.py", LONG_MODULES[2], "tests/b.py", LONG_MODULES[0]]
    assert long_modules_first(collected) == [LONG_MODULES[0], LONG_MODULES[2], "tests/a.py", "tests/b.py"]


SAMPLE = """
import subprocess

import pytest


@pytest.fixture(scope="session")
def eagle3_ui():
    return "a stand-in for the session's UI"


@pytest.mark.parametrize("n", range(3))
def test_uses_the_ui(eagle3_ui, n):
    pass


@pytest.mark.parametrize("n", range(4))
def test_free(n):
    pass


def test_unmarked_starts_a_process():
    subprocess.run(["true"], check=True)


@pytest.mark.integration
def test_marked_starts_a_process():
    subprocess.run(["true"], check=True)
"""


def _run_sample(suite: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(suite)],
        cwd=suite,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.integration
def test_the_two_lanes_split_the_suite_and_an_unmarked_process_still_fails_in_a_worker(tmp_path: Path):
    """A copy of tests/conftest.py over a sample module, run as `make test` runs the two lanes."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for helper in ("conftest.py", "serial_lane.py", "sim_forkserver.py", "quality_helpers.py"):
        shutil.copy(TESTS / helper, suite / helper)
    (suite / "test_sample.py").write_text(SAMPLE)
    (suite / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\nmarkers =\n    integration\n    serial\n")

    # 6 of the 9: the three that use the UI wait for the serial lane (an xdist run does not count them)
    parallel = _run_sample(suite, "-n", "2", "--dist", "loadfile", "-m", "not serial")
    assert parallel.returncode == 1 and "1 failed, 5 passed in" in parallel.stdout, parallel.stdout
    assert "test_unmarked_starts_a_process started a process during call but is not marked integration" in (
        parallel.stdout
    )
    serial = _run_sample(suite, "-m", "serial")
    assert serial.returncode == 0 and "3 passed, 6 deselected" in serial.stdout, serial.stdout + serial.stderr


def _parallel_lane_flags() -> list[str]:
    """The xdist flags of `make test`'s parallel lane, read from the Makefile."""
    recipe = next(ln for ln in (PROJECT_ROOT / "Makefile").read_text().splitlines() if '-m "not serial' in ln)
    flags = recipe.split("pytest", 1)[1].split("-m", 1)[0].split()
    return [f for f in flags if f not in ("-q", "-n", "$(TEST_WORKERS)")]


@pytest.mark.integration
def test_the_parallel_lane_starts_a_long_module_before_one_with_more_tests(tmp_path: Path):
    """xdist, as `make test` runs it, hands out LONG_MODULES first, not the modules with the most tests."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for helper in ("conftest.py", "sim_forkserver.py", "quality_helpers.py"):
        shutil.copy(TESTS / helper, suite / helper)
    lanes = (TESTS / "serial_lane.py").read_text() + '\nLONG_MODULES = ("test_long.py",)\n'
    (suite / "serial_lane.py").write_text(lanes)
    record = "import os\n\ndef _ran(name):\n    with open(os.environ['ORDER_FILE'], 'a') as f:\n        f.write(name + '\\n')\n"
    many = "".join(f"\n\ndef test_many_{i}():\n    _ran('many')\n" for i in range(5))
    (suite / "test_many.py").write_text(record + many)
    (suite / "test_long.py").write_text(record + "\n\ndef test_long():\n    _ran('long')\n")
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration\n    serial\n")
    order = tmp_path / "order.txt"
    os.environ["ORDER_FILE"] = str(order)
    try:
        run = _run_sample(suite, "-n", "1", *_parallel_lane_flags(), "-m", "not serial")
    finally:
        del os.environ["ORDER_FILE"]
    assert run.returncode == 0, run.stdout + run.stderr
    assert order.read_text().split()[0] == "long", order.read_text()


def _autogroup_of_child(env: dict[str, str], new_session: bool) -> str:
    code = "print(open('/proc/self/autogroup').read().split()[-1])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, start_new_session=new_session
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="a kernel without sched_autogroup")
def test_a_session_the_parallel_lane_starts_runs_at_the_lowest_priority():
    """The parallel lane's processes that start a session of their own (a simulator, a Dagster daemon) lower
    their scheduler group to nice 19 (tests/background/sitecustomize.py); nothing else is touched."""
    recipe = (PROJECT_ROOT / "Makefile").read_text().split('-m "not serial', 1)[0].rsplit("rc=0;", 1)[1]
    assert "EAGLE3_TEST_BACKGROUND=1" in recipe and "nice -n 19 setsid" in recipe
    assert "PYTHONPATH=$(CURDIR)/tests/background" in recipe
    lane = {**os.environ, "EAGLE3_TEST_BACKGROUND": "1", "PYTHONPATH": str(TESTS / "background")}
    ours = Path("/proc/self/autogroup").read_text().split()[-1]
    assert _autogroup_of_child(lane, new_session=True) == "19"
    assert _autogroup_of_child(lane, new_session=False) == ours  # the caller's group is left alone
    plain = {k: v for k, v in lane.items() if k != "EAGLE3_TEST_BACKGROUND"}
    assert _autogroup_of_child(plain, new_session=True) == "0"


def _pytest_lines(target: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    r = subprocess.run(
        ["make", "--no-print-directory", "-n", target],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return [ln for ln in r.stdout.splitlines() if "-m pytest" in ln and '-m "' in ln]


@pytest.mark.integration
def test_make_test_leaves_out_the_full_tests_and_test_full_runs_them():
    """Both lanes of `make test` deselect `full`; `make test-full` runs the same lanes with them."""
    quick, full = _pytest_lines("test"), _pytest_lines("test-full")
    assert len(quick) == len(full) == 2, (quick, full)
    assert all("and not full" in ln for ln in quick), quick
    assert not any("full" in ln.split("-m", 2)[2] for ln in full), full
    assert [ln.replace(" and not full", "") for ln in quick] == [re.sub(r' +"(?= )', '"', ln) for ln in full]


@pytest.mark.integration
def test_only_the_listed_tests_are_marked_full():
    """`full` takes a test out of `make test`: the marked ones are exactly FULL_TESTS (tests/serial_lane.py)."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-m", "full", "-p", "no:cacheprovider"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    marked = {ln.strip() for ln in r.stdout.splitlines() if "::" in ln}
    assert marked == FULL_TESTS, (marked - FULL_TESTS, FULL_TESTS - marked)
