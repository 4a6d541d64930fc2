"""How `eagle3 demo` stops on a signal, and the one line it ends with when it did.

A stop during publish is honoured at the publish's commit point (publish/snapshot.py `_switch_latest`):
before LATEST is switched, the snapshot is left complete but unpublished and the demo exits 130
saying so; a stop that arrives after LATEST was switched cannot undo it, and the line says the
snapshot was completed and published. Either way the exit code is 130: a stop is never a SUCCESS.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from ..secret import printable


class StopOnSignal:
    """SIGINT (Ctrl-C) and SIGTERM: stop everything within seconds, in order.

    The graph runs on a worker thread (`run`), so the signals stay here on the main thread (Dagster
    installs its own handlers only on the main thread). The first signal marks this process's
    running Dagster run CANCELING and asks every stage to stop (stopping.request_stop: the generation
    client aborts its in-flight requests and stores what was answered); no further run starts; the
    simulator is stopped on the way out. A second signal stops waiting for the cleanup.
    """

    def __init__(self, command: str = "demo") -> None:
        self.command = command  # the `eagle3` command that runs the graph: its lines start with [<command>]
        self.requested = False
        self.instance: Any = None
        self._old: dict[int, Any] = {}
        self._tty_err = 2

    def __call__(self, signo: int, frame: Any) -> None:
        from .. import stopping

        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        name = signal.Signals(signo).name
        # os.write on the terminal's stderr saved at start: a signal handler must not wait on (or re-enter)
        # the buffered sys.stderr, and during a step Dagster's compute-log capture has fd 2 redirected
        os.write(
            self._tty_err,
            f"\n[{self.command}] {name}: stopping (the current run is canceled; a publish stops before LATEST is "
            "switched; no further run starts; a rerun resumes). Again to stop waiting for the cleanup.\n".encode(),
        )
        if self.instance is not None:
            try:
                from ..orchestration.run import cancel_own_runs

                cancel_own_runs(self.instance)
            except Exception as e:
                print(f"[{self.command}] could not mark the run canceled: {e}", file=sys.stderr, flush=True)
        stopping.request_stop(f"{name} received")

    def run(self, fn: Any) -> Any:
        """fn() on a worker thread; this (main) thread waits, handling the signals."""
        import threading

        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["v"] = fn()
            except BaseException as e:
                box["e"] = e

        th = threading.Thread(target=target, name="eagle3-graph", daemon=True)
        th.start()
        while th.is_alive():
            th.join(0.2)
        if "e" in box:
            raise box["e"]
        return box["v"]

    def __enter__(self) -> StopOnSignal:
        self._tty_err = os.dup(2)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, h in self._old.items():
            signal.signal(sig, h)
        os.close(self._tty_err)


def stopped_line(outcome: Any, command: str = "demo") -> str:
    """The last line of `eagle3 demo` / `eagle3 backfill` after a stop: what ran, and whether the snapshot was
    published."""
    rerun = f"rerun `eagle3 {command}` to resume"
    if outcome.publish_success is None:
        return f"[{command}] stopped: the interrupted run is marked canceled, no further run started; {rerun}"
    if outcome.publish_success:
        return (
            f"[{command}] stop requested during publish: the snapshot {outcome.snapshot_version} was completed and "
            f"published (LATEST names it) before the stop was seen; no further run started"
        )
    why = printable("; ".join(outcome.publish_errors)) or "see the publish run in `make ui`"
    return f"[{command}] stopped during publish, nothing published: {why}; {rerun}"
