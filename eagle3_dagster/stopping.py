"""A process-wide "stop" request (Ctrl-C / SIGTERM on `eagle3 demo`), honoured by long-running stages.

The demo runs the Dagster graph on a worker thread and keeps the signals on the main thread (Dagster
installs its own interrupt handlers only on the main thread). A signal calls `request_stop()`: every
registered asyncio task (a generation shard) is cancelled at once through its own loop — the client
then aborts its in-flight requests and stores what was answered — and `stop_requested()` tells the
runner to start nothing further.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


class StopRequested(RuntimeError):
    """The work was stopped on request (Ctrl-C / SIGTERM); what was stored is kept, a rerun resumes."""


_lock = threading.Lock()
_event = threading.Event()
_reason = {"why": ""}
_tasks: set[tuple[asyncio.AbstractEventLoop, asyncio.Task]] = set()


def request_stop(why: str = "stop requested") -> None:
    with _lock:
        _reason["why"] = why
        _event.set()
        todo = list(_tasks)
    for loop, task in todo:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop is already closed
            pass


def stop_requested() -> bool:
    return _event.is_set()


def stop_reason() -> str:
    return _reason["why"]


def reset() -> None:
    """Forget an earlier request (tests, or a long-lived process that starts over)."""
    with _lock:
        _event.clear()
        _reason["why"] = ""


@contextlib.contextmanager
def cancellable() -> Iterator[None]:
    """Inside a coroutine: the current task is cancelled when a stop is requested (now or later)."""
    task = asyncio.current_task()
    assert task is not None, "cancellable() needs a running task"
    entry = (asyncio.get_running_loop(), task)
    with _lock:
        _tasks.add(entry)
    try:
        if _event.is_set():
            raise StopRequested(_reason["why"] or "stop requested")
        yield
    finally:
        with _lock:
            _tasks.discard(entry)
