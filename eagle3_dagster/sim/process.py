"""Start `eagle3-sim` as a real separate process on 127.0.0.1 (for tests, demos and the CLI).

    with start_simulator(extra_args=["--model", "kimi-k2.5", "--tokenizer", path]) as sim:
        httpx.post(f"{sim.url}/generate", json={...})

The child runs `sys.executable -m eagle3_dagster.sim.server`, logs to `sim.log_path`, and is ready
when `/health` answers 200 (or `/model_info` answers 200 when the server was started with
`--starting-seconds`, whose /health is 503 on purpose).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

import httpx

from .settings import api_key_from_env, child_env


def die_with_parent(sig: int = signal.SIGKILL):
    """A preexec_fn: the child gets `sig` when the process that started it dies, even by SIGKILL
    (Linux prctl PR_SET_PDEATHSIG; elsewhere a no-op). Nothing is left holding a port after a `kill -9`."""
    parent = os.getpid()
    # Linux delivers the signal when the *thread* that forked the child exits, not the process: a child
    # started from a short-lived thread (a test's restarter, a worker) would be killed at once. Only the
    # main thread lives as long as the process, so only children it starts get the death signal.
    from_main_thread = threading.current_thread() is threading.main_thread()

    def _set() -> None:
        if not sys.platform.startswith("linux") or not from_main_thread:
            return
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return _set


class SimHandle(Protocol):
    """What SimProcess needs of a started server process (subprocess.Popen has it)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    """Starts `eagle3_dagster.sim.server` with `args` in a new session, the environment `env`, its output
    appended to `log_path`, dying with the process that started it."""

    def __call__(self, args: list[str], env: dict[str, str], log_path: Path) -> SimHandle: ...


def exec_launcher(args: list[str], env: dict[str, str], log_path: Path) -> SimHandle:
    """The default: a new interpreter, `python -m eagle3_dagster.sim.server ARGS`."""
    with open(log_path, "ab") as logf:
        # Its own session (a Ctrl-C in the terminal reaches the parent, which stops it in order), and
        # it dies with the parent (a `kill -9` of the parent leaves no simulator holding the port).
        return subprocess.Popen(
            [sys.executable, "-m", "eagle3_dagster.sim.server", *args],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )


_launcher: Launcher = exec_launcher


def use_launcher(launcher: Launcher | None) -> None:
    """How this process starts simulators from now on (None: `exec_launcher`). The test suite plugs in one
    that forks them from a process that has already loaded the server and the shared tokenizers."""
    global _launcher
    _launcher = launcher or exec_launcher


class SimulatorError(RuntimeError):
    """The simulator process did not come up; the message carries the tail of its log."""


SIM_EXTRA_MISSING = (
    "the simulator (eagle3-sim) needs its optional dependencies, which are not installed: "
    "pip install 'eagle3-dagster[sim]' (make install does), or set EAGLE3_SGLANG_URL to a real SGLang server"
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _arg_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


class SimProcess:
    def __init__(
        self,
        *,
        port: int | None,
        extra_args: Sequence[str],
        env: dict[str, str] | None,
        ready_timeout: float,
        wait_for: Literal["auto", "health", "model_info", "none"] = "auto",
        log_dir: str | Path | None = None,
    ) -> None:
        self.host = "127.0.0.1"
        self.fixed_port = port
        self.port = port or 0
        self.extra_args = list(extra_args)
        self.env = dict(env) if env is not None else None
        self.ready_timeout = ready_timeout
        self.wait_for = wait_for
        self._log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="eagle3-sim-"))
        self.log_path = self._log_dir / "sim.log"
        self.proc: SimHandle | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def _headers(self) -> dict[str, str]:
        key = api_key_from_env(_arg_value(self.extra_args, "--api-key-env"), self.env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def start(self) -> SimProcess:
        # the child runs this interpreter: without the `sim` extra it would die on `import aiohttp`
        if importlib.util.find_spec("aiohttp") is None:
            raise SimulatorError(SIM_EXTRA_MISSING)
        attempts = 1 if self.fixed_port else 3  # a free port can be taken between probe and bind
        last: Exception | None = None
        for _ in range(attempts):
            self.port = self.fixed_port or free_port(self.host)
            try:
                self._spawn_and_wait()
                return self
            except SimulatorError as e:
                last = e
                self.kill()
                if "address already in use" not in str(e).lower():
                    break
        assert last is not None
        raise last

    def _spawn_and_wait(self) -> None:
        args = ["--host", self.host, "--port", str(self.port), *self.extra_args]
        env = child_env(self.env)  # ours + self.env, Hugging Face offline unless set (sim/settings.py)
        self.proc = _launcher(args, env, self.log_path)
        mode = self.wait_for
        if mode == "auto":
            mode = "model_info" if _arg_value(self.extra_args, "--starting-seconds") else "health"
        if mode == "none":
            return
        path = "/health" if mode == "health" else "/model_info"
        deadline = time.monotonic() + self.ready_timeout
        with httpx.Client(timeout=2.0, headers=self._headers()) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise SimulatorError(f"simulator exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if c.get(self.url + path).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        raise SimulatorError(f"simulator not ready after {self.ready_timeout}s at {self.url}{path}:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (graceful: health 503, drain, exit), then SIGKILL after `timeout`."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> SimProcess:
        """Stop and start again on the same port (clients keep their URL)."""
        self.stop()
        self.fixed_port = self.port
        return self.start()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_simulator(
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout: float = 60,
    wait_for: Literal["auto", "health", "model_info", "none"] = "auto",
    log_dir: str | Path | None = None,
) -> SimProcess:
    """Start `eagle3-sim` on a free (or the given) 127.0.0.1 port and wait until it is ready."""
    return SimProcess(
        port=port, extra_args=extra_args, env=env, ready_timeout=ready_timeout, wait_for=wait_for, log_dir=log_dir
    ).start()
