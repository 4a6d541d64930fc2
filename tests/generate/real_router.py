"""Start the real sglang-router (PyPI `sglang-router`, a Rust binary) in front of given workers (docs/sglang-router.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from gen_helpers import free_port


def start_real_router(workers: list[str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The router process and its URL, once its /readiness answers 200 (its workers are up)."""
    port = free_port()
    with log_path.open("wb") as log:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--worker-urls",
                *workers,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
                "--log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"sglang-router exited {p.returncode}:\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/readiness", timeout=1.0).status_code == 200:
                return p, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    p.kill()
    p.wait()
    raise TimeoutError(f"sglang-router not ready in 60 s:\n{log_path.read_text()[-2000:]}")
