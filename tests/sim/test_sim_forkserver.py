"""The simulators the tests fork from a warm process (tests/sim_forkserver.py) behave as new interpreters do:
their own session, the environment and log file they were given, their exit code, a changed tokenizer
folder loaded afresh, and a request that sets an import-time variable differently started as a new interpreter."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from sim_forkserver import ForkedSim, ForkLauncher

from eagle3_dagster.sim.process import start_simulator, use_launcher

pytestmark = pytest.mark.integration

KIMI = Path(__file__).resolve().parents[2].parent / "shared" / "tokenizers" / "kimi-k2.5"
ARGS = ("--model", "kimi-k2.5", "--log-level", "INFO")


@pytest.fixture
def launcher(tmp_path: Path):
    for name in ("bad", "killed", "w", "e", "f", "0", "1"):
        (tmp_path / name).mkdir()
    forks = ForkLauncher([KIMI])
    use_launcher(forks)
    yield forks
    use_launcher(None)
    forks.close()


def test_a_forked_simulator_has_its_session_env_log_and_exit_code(launcher, tmp_path: Path) -> None:
    sim = start_simulator(
        extra_args=(*ARGS, "--tokenizer", str(KIMI), "--api-key-env", "FORK_KEY"),
        env={"FORK_KEY": "k-123"},
        log_dir=tmp_path,
    )
    try:
        assert isinstance(sim.proc, ForkedSim) and sim.proc.pid not in {s.pid for s in launcher.servers.values()}
        assert os.getsid(sim.proc.pid) == sim.proc.pid  # a session of its own, as start_new_session
        assert httpx.get(sim.url + "/model_info", timeout=5).status_code == 401  # the key came from env
        ok = httpx.get(sim.url + "/model_info", headers={"Authorization": "Bearer k-123"}, timeout=5)
        assert ok.status_code == 200
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(20) == 0  # drained and exited cleanly
        assert "fired up and ready" in (tmp_path / "sim.log").read_text()
    finally:
        sim.kill()
    bad = start_simulator(extra_args=(*ARGS, "--reasoning-scale", "7"), wait_for="none", log_dir=tmp_path / "bad")
    assert bad.proc.wait(60) == 2 and "--reasoning-scale must be in (0, 1]" in bad.log_tail()
    killed = start_simulator(extra_args=(*ARGS, "--tokenizer", str(KIMI)), log_dir=tmp_path / "killed")
    killed.kill()
    assert killed.proc.returncode == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):
        start_simulator(extra_args=(*ARGS, "--tokenizer", str(KIMI)), log_dir=tmp_path / "w").proc.wait(0.2)


def test_a_preloaded_tokenizer_folder_that_changed_is_loaded_afresh(tmp_path: Path) -> None:
    copy = tmp_path / "tok"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copytree(KIMI, copy)
    forks = ForkLauncher([copy])  # the forkserver loads the copy before its first child
    use_launcher(forks)
    try:
        first = start_simulator(extra_args=(*ARGS, "--tokenizer", str(copy)), log_dir=tmp_path / "a")
        first.kill()
        (copy / "tokenizer.json").write_text("{")  # a stale preloaded tokenizer would still serve
        second = start_simulator(extra_args=(*ARGS, "--tokenizer", str(copy)), wait_for="none", log_dir=tmp_path / "b")
        assert second.proc.wait(60) == 2, second.log_tail()
    finally:
        use_launcher(None)
        forks.close()


def test_a_request_that_sets_an_import_time_variable_gets_a_forkserver_started_with_it(launcher, tmp_path) -> None:
    tok = (*ARGS, "--tokenizer", str(KIMI))
    n = ForkLauncher.MAX_SERVERS
    sims = [start_simulator(extra_args=tok, log_dir=tmp_path / "f")]
    for i in range(1, n + 1):  # n - 1 more sets fit, the next one does not
        (tmp_path / f"v{i}").mkdir()
        sims.append(start_simulator(extra_args=tok, env={"HF_FORK_TEST": f"v{i}"}, log_dir=tmp_path / f"v{i}"))
    try:
        assert [isinstance(s.proc, ForkedSim) for s in sims] == [True] * n + [False]
        assert isinstance(sims[-1].proc, subprocess.Popen)  # beyond MAX_SERVERS: a new interpreter
        environs = [Path(f"/proc/{s.pid}/environ").read_bytes().split(b"\0") for s in launcher.servers.values()]
        wanted = [[f"HF_FORK_TEST=v{i}".encode() in e for i in range(1, n)] for e in environs]
        assert wanted == [[False] * (n - 1)] + [[j == i for j in range(n - 1)] for i in range(n - 1)]
    finally:
        for s in sims:
            s.kill()


def test_the_forked_simulators_die_with_the_forkserver(launcher, tmp_path: Path) -> None:
    sims = [start_simulator(extra_args=(*ARGS, "--tokenizer", str(KIMI)), log_dir=tmp_path / str(i)) for i in (0, 1)]
    (server,) = launcher.servers.values()
    server.kill()  # as when the test process that started it dies
    for s in sims:
        assert s.proc.wait(10) == -signal.SIGKILL
        with pytest.raises(httpx.ConnectError):
            httpx.get(s.url + "/health", timeout=2)


def test_an_exit_code_the_forkserver_could_not_write_is_an_error_not_a_hang(launcher, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(ForkedSim, "STATUS_GRACE_S", 0.5)
    sim = start_simulator(extra_args=(*ARGS, "--tokenizer", str(KIMI)), log_dir=tmp_path / "f")
    shutil.rmtree(launcher._status_dir)  # where the forkserver writes each child's exit code
    sim.proc.send_signal(signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"simulator pid {sim.proc.pid} ended, but its forkserver .* wrote no exit"):
        sim.proc.wait(30)
