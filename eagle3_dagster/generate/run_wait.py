"""One bounded endpoint wait per graph run, not one per shard.

When no endpoint becomes routable (the fleet is down, no worker alive behind a router), the first
shard that waits `wait_for_endpoint_s` in vain writes the line it fails with to a small file shared by
every shard of the same graph run (`EndpointWaitRecord`). Every other shard of that run, waiting
at the same time or starting later, reads it and fails at once with the same line (and says it was
not waited again) instead of waiting its own full period: 4 shards x 600 s become one 600 s.

Only a failed wait is recorded: a shard whose endpoint answered records nothing, and a new run
(a new run id / graph run) waits afresh. The file lives in the work dir, which is local: processes
on one machine (the demo, the multiprocess executor, concurrent backfill runs) share the record;
separate machines each wait once.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

ENDPOINT_WAIT_FILE = "endpoint-wait.txt"


@dataclass(frozen=True)
class EndpointWaitRecord:
    """The outcome of the run's endpoint wait, when it ran out: one line in `path`."""

    path: Path

    def failed_wait(self) -> str | None:
        """The line the run's first failed endpoint wait ended with, or None when no wait failed yet."""
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return text or None

    def record(self, line: str) -> str:
        """Record a failed wait (the first one wins: concurrent shards keep one line); the line now on record."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}")
        tmp.write_text(" ".join(line.split()) + "\n", encoding="utf-8")
        try:
            os.link(tmp, self.path)  # atomic and exclusive: an existing record is never overwritten
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        return self.failed_wait() or line


def endpoint_wait_record(work_dir: Path, run_key: str) -> EndpointWaitRecord:
    """The record of one graph run (`run_key`: the graph run's tag, a backfill id or a run id) in the work dir."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_key) or "run"
    return EndpointWaitRecord(work_dir / "runs" / safe / ENDPOINT_WAIT_FILE)
