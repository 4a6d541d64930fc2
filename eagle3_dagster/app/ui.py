"""`eagle3 ui`: the Dagster UI (`dagster dev`) for this project's definitions, with a simulator behind it
unless EAGLE3_SGLANG_URL is set. `dagster dev` and the runs it starts get the instance and the URL in
their own environment; nothing here writes this process's environment.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

from ..config import PROJECT_ROOT, child_process_env, settings
from .instance import ensure_dagster_home, sglang_endpoint
from .stop import StopOnSignal

# `dagster dev` warns on every start that `dg dev` supersedes it; `dg dev` needs a dg project layout
# this repository does not have, so that one warning is filtered (every other warning still shows).
DAGSTER_DEV_WARNING_FILTER = ["-W", "ignore:Function `dev_command` is superseded"]


def dagster_dev_command(port: str, workspace: Path = PROJECT_ROOT / "workspace.yaml") -> list[str]:
    """`dagster dev` on 127.0.0.1:`port` for `workspace`, as `eagle3 ui` starts it."""
    return [
        sys.executable,
        *DAGSTER_DEV_WARNING_FILTER,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(workspace),
        "-h",
        "127.0.0.1",
        "-p",
        port,
    ]


def run(args: argparse.Namespace) -> int:
    """`eagle3 ui` with its parsed arguments (app/cli.py declares them); the exit code."""
    s = settings()  # validated before the UI starts
    home = ensure_dagster_home(s.dagster.home)
    import time

    from ..ingest import load_source_specs
    from ..profiles import active_profile
    from ..sim.process import die_with_parent

    load_source_specs(s.storage.sources_dir)  # a bad source YAML: one line per problem, not a failed code location
    # EAGLE3_MODEL names no profile: one line
    active_profile(s.model.name, s.storage.models_dir, s.model.tokenizer_override)
    with StopOnSignal() as stopper, sglang_endpoint(s) as url:
        # `dagster dev` and the runs it starts get the instance and the URL in their own environment
        env = child_process_env({"DAGSTER_HOME": str(home), "EAGLE3_SGLANG_URL": url})
        cmd = dagster_dev_command(args.port)
        print(f"[ui] Dagster UI on http://127.0.0.1:{args.port}  (Ctrl-C to stop)", flush=True)
        proc = subprocess.Popen(cmd, env=env, cwd=PROJECT_ROOT, preexec_fn=die_with_parent(signal.SIGTERM))
        deadline = None
        try:
            while proc.poll() is None:
                if stopper.requested and deadline is None:
                    # A Ctrl-C in a terminal reached `dagster dev` too; a SIGTERM only us: pass it on.
                    print("[ui] stopping Dagster (webserver, daemon, code server; at most 20 s)", flush=True)
                    proc.send_signal(signal.SIGTERM)
                    deadline = time.monotonic() + 20
                if deadline is not None and time.monotonic() > deadline:
                    proc.kill()
                time.sleep(0.2)
        except KeyboardInterrupt:  # a second signal: do not wait any longer
            proc.kill()
        proc.wait()
        return 0 if stopper.requested else proc.returncode
