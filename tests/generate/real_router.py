"""Start the real gateways in front of given workers: the sglang-router (PyPI `sglang-router`, a Rust binary;
docs/sglang-router.md) and smg, the Shepherd Model Gateway that succeeded it (PyPI `smg`; docs/smg.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from gen_helpers import free_port


def start_real_router(workers: list[str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The router process and its URL, once its /readiness answers 200 (its workers are up)."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers]
    return _start("sglang-router", cmd, log_path)


def smg_command() -> str | None:
    """The `smg` command of this venv (the `router` extra installs it), or None."""
    found = Path(sys.executable).with_name("smg")
    return str(found) if found.is_file() else shutil.which("smg")


def start_smg(
    workers: list[str], log_path: Path, *extra: str, port: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`smg launch` in front of `workers`, bound to 127.0.0.1 with its metrics there too, checking its workers'
    health every second (a dead worker leaves its rotation in about 3 s, not 3 minutes); `extra`: more flags
    (the policy, retries, ...); `port`: a given one (a gateway started again where it was), else a free one.
    The process and its URL, once its /readiness answers 200."""
    smg = smg_command()
    if smg is None:
        raise RuntimeError("smg is not installed (pip install -e '.[router]')")
    cmd = [smg, "launch", "--worker-urls", *workers, "--health-check-interval-secs", "1"]
    cmd += ["--shutdown-grace-period-secs", "1", *extra]  # a test stops it with nothing in flight
    return _start("smg", cmd, log_path, port)


def _start(what: str, cmd: list[str], log_path: Path, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = port or free_port()
    bind = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1"]
    bind += ["--prometheus-port", str(free_port()), "--log-level", os.environ.get("I46A_SMG_LOG", "warn")]
    with log_path.open("ab") as log:  # a gateway started again keeps its first life's lines
        p = subprocess.Popen([*cmd, *bind], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"{what} exited {p.returncode}:\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/readiness", timeout=1.0).status_code == 200:
                return p, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    p.kill()
    p.wait()
    raise TimeoutError(f"{what} not ready in 60 s:\n{log_path.read_text()[-2000:]}")


def stop(p: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s (smg drains in-flight requests for up to its grace period)."""
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
