"""`--record-requests FILE`: the simulator appends one JSON line per /generate item it runs.

Each line is {"rid", "input_ids", "max_new_tokens"}: exactly the ids the server received and the
max_new_tokens it ran with (after its own checks, e.g. --allow-auto-truncate). Tests read it to prove what
a prompt contained (e.g. that a later turn of a regenerated conversation holds the model's own
earlier answers, generate/multiturn.py). Off by default; a real server has no such log.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any


class RequestRecorder:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fh = self.path.open("a", encoding="utf-8")

    def record(self, rid: str, input_ids: Any, max_new_tokens: int | None = None) -> None:
        row = {"rid": rid, "input_ids": list(input_ids), "max_new_tokens": max_new_tokens}
        line = json.dumps(row, separators=(",", ":"))
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()


def read_recorded(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
