"""Fixtures for the reliability tests: `eagle3 ui` (simulator + `dagster dev`) as a user starts it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from rel_helpers import ROOT, VENV_BIN, child_env, process_tree, stop_process_group, tail, wait_http

from eagle3_dagster.sim.process import free_port


@dataclass
class UiServer:
    url: str
    port: int
    proc: subprocess.Popen
    home: Path
    data: Path
    log: Path

    def pids(self) -> list[int]:
        return process_tree(self.proc.pid)


@pytest.fixture(scope="session")
def eagle3_ui():
    """`eagle3 ui --port <free>` (what `make ui` runs) with its own DAGSTER_HOME and data dir.

    No EAGLE3_SGLANG_URL, so it starts the simulator itself, exactly like a newcomer's `make ui`.
    Stopped with Ctrl-C (SIGINT to its process group), as in a terminal.
    """
    root = Path(tempfile.mkdtemp(prefix="eagle3-ui-"))
    home, data, log = root / "dagster_home", root / "data", root / "ui.log"
    port = free_port()
    env = child_env(DAGSTER_HOME=str(home), EAGLE3_DATA_DIR=str(data))
    env.pop("EAGLE3_SGLANG_URL", None)
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [str(VENV_BIN / "eagle3"), "ui", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = UiServer(url=f"http://127.0.0.1:{port}", port=port, proc=proc, home=home, data=data, log=log)
    seen: set[int] = set()
    try:
        wait_http(f"{server.url}/server_info", timeout=180, proc=proc, log=log)
        seen.update(server.pids())
        yield server
    finally:
        seen.update(server.pids())
        stop_process_group(proc, sorted(seen))
        if os.environ.get("EAGLE3_KEEP_UI_LOG"):
            print(tail(log, 200))
        shutil.rmtree(root, ignore_errors=True)
