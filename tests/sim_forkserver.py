"""Simulators for the tests, forked from a process that has already loaded the server and the shared tokenizers.

A simulator started as a new interpreter spends about 2 s of CPU importing transformers and parsing the
tokenizer before it serves; the suite starts about 150. tests/conftest.py plugs `ForkLauncher` into
`eagle3_dagster.sim.process.use_launcher`, so every simulator a test process starts (Sim, start_simulator)
is forked from one warm server process per test process instead. What a test sees is the same: a process
in its own session, with the environment, working directory and log file it was given, its exit code, and
death with its parent (the forkserver, which exits when the test process does). Programs the tests run as
their own processes (`eagle3 demo`, `eagle3 ui`, ...) start their simulators as a user's would.

EAGLE3_TEST_SIM_EXEC=1 turns it off (every simulator a new interpreter).

Run as a program, this file is the forkserver: it reads one JSON request per line on stdin
({"args", "env", "cwd", "log", "status"}), forks, answers {"pid": N} on stdout, and writes the exit code
of each child to its "status" file when the child ends.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

# Variables a library reads once, at import: a child forked from the warm process would not see a new value,
# so a request that sets one differently from the forkserver's start goes to a new interpreter instead.
IMPORT_TIME_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "PYTHON", "LD_", "MALLOC", "OMP_")


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


class ForkedSim:
    """A forked simulator, as SimProcess uses a subprocess.Popen: pid, poll, wait, send_signal, kill."""

    def __init__(self, pid: int, status: Path, args: list[str], server: subprocess.Popen[bytes]) -> None:
        self.pid, self.args, self._status, self._server = pid, args, status, server
        self.returncode: int | None = None
        self._ended_at: float | None = None
        try:  # signals go to this process even after its pid is reused
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None

    # How long an ended child may go without the exit code its forkserver writes when it reaps it.
    STATUS_GRACE_S = 5.0

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = int(self._status.read_text())
            except FileNotFoundError:
                if not self._exited():
                    return None
                if self._server.poll() is not None:
                    # the forkserver that would have reaped it is gone, and took it along (PR_SET_PDEATHSIG)
                    self.returncode = -signal.SIGKILL
                else:
                    self._ended_at = self._ended_at or time.monotonic()
                    if time.monotonic() - self._ended_at < self.STATUS_GRACE_S:
                        return None
                    raise RuntimeError(
                        f"simulator pid {self.pid} ended, but its forkserver (pid {self._server.pid}) wrote no exit "
                        f"code to {self._status} in {self.STATUS_GRACE_S:.0f} s (see the forkserver's stderr)"
                    ) from None
            self._status.unlink(missing_ok=True)
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self.returncode

    def _exited(self) -> bool:
        if self._pidfd is None:
            return not Path(f"/proc/{self.pid}").exists()
        return bool(select.select([self._pidfd], [], [], 0)[0])  # a pidfd reads ready once its process ended

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)


class ForkLauncher:
    """An `eagle3_dagster.sim.process.Launcher`. A forkserver starts with the first simulator, one per set of
    import-time variables (a test that sets one gets a forkserver of its own), at most MAX_SERVERS; beyond
    that, a new interpreter."""

    MAX_SERVERS = 3

    def __init__(self, tokenizer_dirs: list[Path]) -> None:
        self.tokenizer_dirs = [str(d) for d in tokenizer_dirs if d.is_dir()]
        self._lock = threading.Lock()
        self.servers: dict[frozenset[tuple[str, str]], subprocess.Popen[bytes]] = {}
        self._status_dir = Path(tempfile.mkdtemp(prefix="eagle3-sim-forks-"))  # where each child's exit code lands

    def __call__(self, args: list[str], env: dict[str, str], log_path: Path):
        from eagle3_dagster.sim.process import exec_launcher

        with self._lock:
            server = self._server_for(env)
            if server is None:
                return exec_launcher(args, env, log_path)
            open(log_path, "ab").close()  # a log that cannot be written fails here, as exec_launcher's does
            status = self._status_dir / uuid.uuid4().hex
            request = {"args": args, "env": env, "cwd": os.getcwd(), "log": str(log_path), "status": str(status)}
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(request).encode() + b"\n")
            server.stdin.flush()
            answer = server.stdout.readline()
        if not answer:
            raise RuntimeError(f"the simulator forkserver (pid {server.pid}) exited: {server.poll()}")
        return ForkedSim(int(json.loads(answer)["pid"]), status, args, server)

    def _server_for(self, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        key = frozenset(import_time_env(env).items())
        server = self.servers.get(key)
        if server is not None and server.poll() is None:
            return server
        self.servers = {k: s for k, s in self.servers.items() if s.poll() is None}
        if len(self.servers) >= self.MAX_SERVERS:
            return None
        from eagle3_dagster.sim.process import die_with_parent

        self.servers[key] = subprocess.Popen(
            [sys.executable, __file__, *self.tokenizer_dirs],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        return self.servers[key]

    def close(self) -> None:
        """Stop the forkservers, and with them the simulators they forked; remove the exit-code folder."""
        for server in self.servers.values():
            server.kill()
            server.wait()
        self.servers = {}
        shutil.rmtree(self._status_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- the forkserver


def _warm(tokenizer_dirs: list[str]) -> None:
    """Import the server and load the shared tokenizers once; a child's load of one of them is then free."""
    import eagle3_dagster.sim.server as server
    from eagle3_dagster.sim.settings import quiet_transformers

    quiet_transformers()
    loaded: dict[tuple[Any, ...], Any] = {}
    load = server.load_tokenizer

    def key(location: str, trust_remote_code: bool) -> tuple[Any, ...] | None:
        folder = Path(location)
        if not folder.is_dir():
            return None
        files = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir() if p.is_file())
        return (str(folder.resolve()), trust_remote_code, tuple(files))

    def load_once(location: str, *, trust_remote_code: bool = False, **kw: Any) -> Any:
        k = key(location, trust_remote_code) if not kw else None
        if k is None:
            return load(location, trust_remote_code=trust_remote_code, **kw)
        if k not in loaded:
            loaded[k] = load(location, trust_remote_code=trust_remote_code)
        return loaded[k]

    server.load_tokenizer = load_once  # this process only: its children load through it
    for d in tokenizer_dirs:
        load_once(d)


def _child(request: dict[str, Any], keep: list[int], die_with_forkserver: Any) -> None:
    """In the forked child: become the simulator the request describes, then exit with its code."""
    code = 1
    try:
        os.setsid()
        die_with_forkserver()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in keep:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import random

        random.seed()  # a new interpreter would seed from the OS, not share the forkserver's state
        sys.argv = ["eagle3-sim", *request["args"]]
        from eagle3_dagster.sim.server import main

        try:
            main(request["args"])
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    from eagle3_dagster.sim.process import die_with_parent

    _warm(sys.argv[1:])
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status: dict[int, str] = {}
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    pending = b""
    while True:
        for key, _ in sel.select():
            if key.fd == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
                _reap(status)
                continue
            data = os.read(0, 1 << 16)
            if not data:  # the test process is gone: so are the simulators it started
                for pid in status:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                os._exit(0)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                die_with_forkserver = die_with_parent()  # made here: "parent" is this process
                pid = os.fork()
                if pid == 0:
                    _child(request, [wake_r, wake_w, sel.fileno()], die_with_forkserver)
                status[pid] = request["status"]
                os.write(1, json.dumps({"pid": pid}).encode() + b"\n")


def _reap(status: dict[int, str]) -> None:
    while True:
        try:
            pid, wstatus = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = status.pop(pid, None)
        if path:
            try:
                with open(f"{path}.tmp", "w") as f:
                    f.write(str(os.waitstatus_to_exitcode(wstatus)))
                os.replace(f"{path}.tmp", path)
            except OSError as e:  # the waiting handle names the missing code after its grace period
                print(
                    f"sim forkserver: exit code {os.waitstatus_to_exitcode(wstatus)} of pid {pid} "
                    f"not written to {path}: {e}",
                    file=sys.stderr,
                    flush=True,
                )


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder (tests/) is not the simulator's
    _serve()
