"""Real services for the reliability tests: a throwaway PostgreSQL cluster, child processes, ports.

Everything binds 127.0.0.1 and is stopped by the fixture that started it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.sim.process import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MISSING_SERVICES = "run `bash scripts/ci-services.sh` (as root) first; `make test` does it"
# Only this machine: the UI on 127.0.0.1 and file:// pages. Anything else (CDNs, telemetry) is refused at
# once, as it would be on an offline cluster, instead of hanging.
LOCAL_ONLY = r"^(?!(https?://127\.0\.0\.1[:/]|file://|data:|blob:)).*"


@contextmanager
def chromium_page(viewport: dict[str, int], device_scale_factor: float = 1) -> Iterator:
    """A Playwright page in Debian's headless Chromium: local URLs only, Dagster's first-visit modal dismissed."""
    import re

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport=viewport, device_scale_factor=device_scale_factor)
            context.route(re.compile(LOCAL_ONLY), lambda route: route.abort("blockedbyclient"))
            page = context.new_page()
            page.set_default_timeout(30_000)
            # Dagster's "Join the community" modal may cover any page: dismiss it when it shows.
            page.add_locator_handler(
                page.get_by_role("dialog").filter(has_text="Join the Dagster community"),
                lambda d: d.get_by_role("button", name="Skip").click(),
            )
            yield page
        finally:
            browser.close()


def require_os_package(package: str, what: str, present: bool) -> None:
    """Skip the test when an OS package is missing and this user cannot install it; fail it as root.

    `make services` installs the packages as root (CI), so there a missing one is a broken setup, never a skip.
    """
    if present:
        return
    msg = f"{what} not found (Debian package {package}): {MISSING_SERVICES}"
    if os.geteuid() == 0:
        pytest.fail(msg)
    pytest.skip(f"{msg} -- not root, so `make services` could not install it")


def pg_bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    require_os_package("postgresql", "PostgreSQL server binaries under /usr/lib/postgresql", bool(found))
    return Path(found[-1]).parent


@dataclass
class PgCluster:
    root: Path
    port: int
    user: str
    password: str
    db: str
    bin_dir: Path
    run_as: str | None

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def _cmd(self, args: list[str]) -> list[str]:
        return ["runuser", "-u", self.run_as, "--", *args] if self.run_as else args

    def psql(self, sql: str) -> str:
        env = {**os.environ, "PGPASSWORD": self.password}
        out = subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.user,
                "-d",
                self.db,
                "-Atc",
                sql,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode:
            raise RuntimeError(f"psql failed: {out.stderr}")
        return out.stdout.strip()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.db}"

    def postmaster_pid(self) -> int:
        return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            subprocess.run(
                self._cmd([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"]),
                capture_output=True,
                timeout=60,
            )


@contextmanager
def postgres_cluster(
    db: str = "dagster", user: str = "dagster", password: str = "dagster-test-pw"
) -> Iterator[PgCluster]:
    """initdb + start a private cluster: TCP on 127.0.0.1:<free port>, unix socket in its own temp dir.

    As root the server runs as the `postgres` user (PostgreSQL refuses to run as root); its folder
    lives directly under /tmp because pytest's tmp dirs are private to root.
    """
    bin_dir = pg_bin_dir()
    run_as = None
    root = Path(tempfile.mkdtemp(prefix="eagle3-pg-"))
    if os.geteuid() == 0:
        run_as = "postgres"
        pw = pwd.getpwnam(run_as)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    cluster = PgCluster(
        root=root, port=free_port(), user=user, password=password, db=db, bin_dir=bin_dir, run_as=run_as
    )
    try:
        pwfile = root / "pw"
        pwfile.write_text(password + "\n")
        cluster.socket_dir.mkdir()
        if run_as:
            pw = pwd.getpwnam(run_as)
            for p in (pwfile, cluster.socket_dir):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        _run(
            cluster._cmd(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(cluster.data_dir),
                    "-U",
                    user,
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                ]
            ),
            "initdb",
        )
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {cluster.port} -k {cluster.socket_dir} -c fsync=off "
            f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
        )
        _run(
            cluster._cmd(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(cluster.data_dir),
                    "-o",
                    opts,
                    "-l",
                    str(root / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            "pg_ctl start",
            log=root / "server.log",
        )
        env = {**os.environ, "PGPASSWORD": password}
        _run(
            [str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", user, db], "createdb", env=env
        )
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _run(cmd: list[str], what: str, *, env: dict | None = None, log: Path | None = None) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if r.returncode:
        extra = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
        raise RuntimeError(f"{what} failed ({r.returncode}): {r.stdout}\n{r.stderr}\n{extra}")


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def listening_addresses(pids: list[int]) -> dict[int, set[tuple[str, int]]]:
    """pid -> {(ip, port)} of its TCP sockets in LISTEN state."""
    out: dict[int, set[tuple[str, int]]] = {}
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            out.setdefault(c.pid, set()).add((c.laddr.ip, c.laddr.port))
    return out


def process_tree(pid: int) -> list[int]:
    try:
        p = psutil.Process(pid)
        return [pid, *[c.pid for c in p.children(recursive=True)]]
    except psutil.NoSuchProcess:
        return []


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered:\n{tail(log)}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer within {timeout}s:\n{tail(log)}")


def tail(log: Path | None, n: int = 40) -> str:
    if log is None or not log.exists():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def stop_process_group(proc: subprocess.Popen, pids: list[int], timeout: float = 30) -> None:
    """Ctrl-C the group we started (as a terminal would), then make sure every recorded pid is gone."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    gone_by = time.monotonic() + 10
    for pid in pids:
        try:
            p = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        try:
            p.wait(max(0.1, gone_by - time.monotonic()))
        except psutil.TimeoutExpired:
            p.kill()
        except psutil.NoSuchProcess:
            pass


PYTHON = sys.executable
VENV_BIN = Path(sys.executable).parent
ROOT = PROJECT_ROOT
