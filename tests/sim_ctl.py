"""The simulator as the tests drive it: a real eagle3-sim process plus its fault and stats endpoints.

Lives at tests/ (on sys.path through tests/conftest.py) so generation and reliability tests share it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.sim.process import SimProcess, start_simulator

KIMI_TOKENIZER_DIR = (PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5").resolve()

# The client of the tests' own calls to simulators (faults, stats, readiness polls, raw /generate requests).
# httpx.get / httpx.post open a new client per call, and with it a TLS context (the CA bundle loaded, about
# 15 ms of CPU), and the suite makes thousands of such calls. No keep-alive: every call has its own
# connection, as before, so a simulator restarted on the same port is reached afresh.
HTTP = httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))


class Sim:
    """The real simulator process (eagle3_dagster.sim.process) plus fault / stats helpers."""

    def __init__(
        self,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        wait: bool = True,
        ready_timeout: float = 60.0,
    ) -> None:
        args = ("--model", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER_DIR), "--log-level", "WARNING", *extra_args)
        self.env = env
        self.sp: SimProcess = start_simulator(
            port=port, extra_args=args, env=env, wait_for="none", log_dir=log_path.parent if log_path else None
        )
        if wait:
            self.wait_ready(ready_timeout)

    @property
    def url(self) -> str:
        return self.sp.url

    @property
    def proc(self):
        return self.sp.proc

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sp.alive():
                raise RuntimeError(f"simulator exited:\n{self.sp.log_tail()}")
            try:
                if HTTP.get(self.url + "/model_info", headers=self._auth(), timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("simulator did not come up")

    def start(self) -> None:
        """Start again on the same port (after a crash or a kill)."""
        self.sp.fixed_port = self.sp.port
        self.sp.start()

    def faults(self, **faults: Any) -> dict[str, Any]:
        r = HTTP.post(self.url + "/_sim/faults", json=faults, headers=self._auth(), timeout=10)
        r.raise_for_status()
        return r.json()

    def stats(self, rids: bool = False) -> dict[str, Any]:
        return HTTP.get(self.url + "/_sim/stats" + ("?rids=1" if rids else ""), headers=self._auth(), timeout=5).json()

    def requests(self) -> int:
        """/generate requests the simulator has received so far."""
        return int(self.stats()["requests"])

    def _auth(self) -> dict[str, str]:
        key = (self.env or {}).get("SIM_TEST_KEY")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def kill(self) -> None:
        self.sp.kill()
