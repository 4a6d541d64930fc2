"""An exclusive, owner-naming lock per data directory (publishing a snapshot, a whole `eagle3 demo`).

Local data dir: `fcntl.flock` on a file inside it (e.g. `snapshots/.publish.lock`). The kernel
releases the lock when its holder exits, however it exits (SIGKILL included), so a killed run never
leaves a lock behind. The holder writes who it is (pid, host, run id, what, since) into the file;
a process that cannot take the lock reports that owner and the lock path in one line
(`DataDirLocked`). The file itself is never deleted (deleting a flock'ed file lets two processes
lock two different inodes).

Object storage has no lock primitive pyarrow/fsspec can use (no atomic create-if-absent across
stores), so the lock is a local file keyed by the data URI, in `local_lock_dir` (callers pass the
work dir's `locks/`, as the generation shard locks do; else `<tmp>/eagle3-locks-<uid>/`): it
excludes processes on THIS host only. Callers say so loudly (`DataDirLock.scope`, the warning line
of `host_only_warning`); run one publisher per object-storage data dir across hosts.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .paths import DataPath, PathLike, as_data_path


class DataDirLocked(RuntimeError):
    """The lock is held by another process: the message is one line naming it and the lock file."""

    def __init__(self, message: str, lock_path: Path, owner: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.lock_path = lock_path
        self.owner = owner


def lock_file_for(data_dir: PathLike, rel: str, local_lock_dir: Path | None = None) -> tuple[Path, bool]:
    """(the lock file, True when it excludes every process on the data dir / False: this host only)."""
    dp = as_data_path(data_dir)
    if dp.is_local:
        return (dp / rel).local_path, True
    key = hashlib.sha256(f"{dp}/{rel}".encode()).hexdigest()[:16]
    name = rel.replace("/", "_").lstrip(".")
    folder = (
        Path(local_lock_dir)
        if local_lock_dir is not None
        else Path(tempfile.gettempdir()) / f"eagle3-locks-{os.getuid()}"
    )
    return folder / f"{name}-{key}.lock", False


# How long a waiter gives a new holder to write its owner before saying it waits for an unknown process.
OWNER_GRACE_S = 1.0


def describe_owner(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "an unknown process (no owner written yet)"
    parts = [f"pid {owner.get('pid')} on host {owner.get('host')}"]
    if owner.get("run_id"):
        parts.append(f"run {owner['run_id']}")
    if owner.get("what"):
        parts.append(str(owner["what"]))
    if owner.get("since"):
        parts.append(f"since {owner['since']}")
    return ", ".join(parts)


def owner_record(what: str, run_id: str | None = None) -> dict[str, Any]:
    """What a lock holder writes into its lock file: pid, host, run id, what, since."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "run_id": run_id,
        "what": what,
        "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def read_owner(path: Path) -> dict[str, Any] | None:
    """The owner a lock file names (None: empty, unreadable, or being written right now)."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
        return json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None


def _read_owner(fh: IO[str]) -> dict[str, Any] | None:
    try:
        fh.seek(0)
        raw = fh.read()
        return json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None  # being written by the holder right now


@dataclass(frozen=True)
class LockOptions:
    """How a holder takes a data dir lock: `run_id` is written into it (named to whoever has to wait);
    `wait_s` 0 fails at once when held, > 0 waits up to that many seconds polling every `poll_s` (calling
    `on_wait` once with the line naming the holder), then fails with `DataDirLocked`; `local_lock_dir`:
    where the lock file goes when the data dir is object storage (this host only)."""

    run_id: str | None = None
    wait_s: float = 0.0
    on_wait: Callable[[str], None] | None = None
    poll_s: float = 0.2
    local_lock_dir: Path | None = None


class DataDirLock:
    """`with DataDirLock(data_dir, "snapshots/.publish.lock", what=..., options=...):` one holder at a time
    (`options`: LockOptions)."""

    def __init__(self, data_dir: PathLike, rel: str, *, what: str, options: LockOptions = LockOptions()) -> None:
        self.data_dir: DataPath = as_data_path(data_dir)
        self.path, self.covers_all_hosts = lock_file_for(self.data_dir, rel, options.local_lock_dir)
        self.what = what
        self.run_id = options.run_id
        self.wait_s = options.wait_s
        self.on_wait = options.on_wait
        self.poll_s = options.poll_s
        self._fh: IO[str] | None = None

    @property
    def scope(self) -> str:
        return "every process on the data dir" if self.covers_all_hosts else "processes on this host only"

    def host_only_warning(self) -> str | None:
        """The warning line for an object-storage data dir (None when the lock covers every host)."""
        if self.covers_all_hosts:
            return None
        return (
            f"{self.what}: data dir {self.data_dir} is object storage, which has no lock: {self.path} excludes "
            "processes on this host only; do not run a second one on another host against the same data dir"
        )

    def _held_line(self, owner: dict[str, Any] | None, waited: float) -> str:
        held = f"{self.what}: data dir {self.data_dir} is locked by {describe_owner(owner)} (lock {self.path})"
        return held + (f"; gave up after waiting {waited:.0f}s" if waited else "")

    def acquire(self) -> DataDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")  # never truncated before we hold it: a waiter reads the owner
        t0 = time.monotonic()
        told = False
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    fh.close()
                    raise
            waited = time.monotonic() - t0
            owner = _read_owner(fh)
            if waited >= self.wait_s:
                fh.close()
                raise DataDirLocked(self._held_line(owner, waited if self.wait_s else 0), self.path, owner)
            # the holder writes its owner just after taking the lock: name it rather than "an unknown process"
            if not told and self.on_wait is not None and (owner is not None or waited >= OWNER_GRACE_S):
                self.on_wait(self._held_line(owner, 0) + f"; waiting up to {self.wait_s:.0f}s")
                told = True
            time.sleep(self.poll_s)
        owner = owner_record(self.what, self.run_id)
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(owner) + "\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        try:
            fh.seek(0)
            fh.truncate()  # no owner named while nobody holds it
            fh.flush()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def __enter__(self) -> DataDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
