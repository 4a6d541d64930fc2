"""The run's rows in memory, spilled to the shard store as atomic Parquet chunks.

Every answered sample goes into one buffer; the buffer is written as one chunk when it holds
`flush_every_n` rows (by the worker that filled it), on a timer (`flush_every_s`) and at the end.
errors.parquet is rewritten whole, so only on the timer and at the end. One lock orders every
write: a flush started by the timer finishes before the run cancels the timer.

Before rows are written, `confirm` (the endpoint pool's confirm_serving) reads again what the endpoints
that answered them serve: a row names the drafter of its endpoint, which its answer does not say. When an
endpoint's drafter changed, its rows in the buffer are not written (which drafter served them is not known)
and the flush raises ServingChangedError once: the run stops at the change, the rerun sends them again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .endpoint_info import ServingChangedError
from .rows import ErrorRow, SampleRow


class ChunkSink(Protocol):
    """A table store: each chunk written is a list of rows (dicts of the table's columns)."""

    def write_chunk(self, rows: list[dict[str, Any]]) -> Any: ...


class ErrorSink(ChunkSink, Protocol):
    def write_errors(self, rows: list[dict[str, Any]]) -> Any: ...


def split_turn_rows(rows: list[SampleRow]) -> tuple[list[SampleRow], list[SampleRow]]:
    """(sample rows, conversation-turn rows): turns are stored apart, in the shard's turns/ store."""
    turns = [r for r in rows if r.turn is not None]
    if not turns:
        return rows, []
    return [r for r in rows if r.turn is None], turns


class ChunkFlusher:
    """The buffer of stored rows and the run's error rows, and when and how they are written."""

    def __init__(
        self,
        store: ErrorSink,
        turn_store: ChunkSink | None,
        errors: list[ErrorRow],
        *,
        clock: Callable[[], float] = time.monotonic,
        confirm: Callable[[set[str]], Awaitable[dict[str, str]]] | None = None,
    ) -> None:
        self.store = store
        self.turn_store = turn_store
        self.rows: list[SampleRow] = []
        self.errors = errors  # every error row of the shard, carried ones first; appended by the workers
        self.lock = asyncio.Lock()
        self._clock = clock
        self._errors_written = -1  # never written: the first flush with errors writes the file
        self._confirm = confirm
        self.unconfirmed = 0  # rows not written: their endpoint's drafter changed before they were confirmed
        self._stopped = False  # ServingChangedError raised once; later flushes only leave those rows out
        self.last_flush = self.last_errors_write = clock()

    def errors_pending(self) -> bool:
        return len(self.errors) != self._errors_written

    def due(self, every_s: float) -> tuple[bool, bool]:
        """(rows due, errors due): what has waited `every_s` since it was last written."""
        now = self._clock()
        rows_due = bool(self.rows) and now - self.last_flush >= every_s
        errors_due = self.errors_pending() and now - self.last_errors_write >= every_s
        return rows_due, errors_due

    async def flush(self, *, min_rows: int = 1, with_errors: bool = False, force_errors: bool = False) -> None:
        """Write the buffer as one chunk; errors.parquet when asked and changed (or forced)."""
        async with self.lock:
            errors_due = force_errors or (with_errors and self.errors_pending())
            if len(self.rows) < min_rows and not errors_due:
                return  # another worker flushed while we waited for the lock
            rows, self.rows = self.rows, []
            self.last_flush = self._clock()
            rows, stop = await self._confirmed(rows)
            if rows:
                await self._write_rows(rows)
            if errors_due:
                snapshot = [e.as_row() for e in self.errors]
                await asyncio.to_thread(self.store.write_errors, snapshot)
                self._errors_written = len(snapshot)
                self.last_errors_write = self._clock()
            if stop is not None:
                raise stop

    async def _confirmed(self, rows: list[SampleRow]) -> tuple[list[SampleRow], Exception | None]:
        """The rows whose endpoints still serve what their rows name, and the error that stops the run (once)
        when an endpoint changed."""
        if not rows or self._confirm is None:
            return rows, None
        changed = await self._confirm({str(r.endpoint) for r in rows})
        if not changed:
            return rows, None
        keep = [r for r in rows if r.endpoint not in changed]
        self.unconfirmed += len(rows) - len(keep)
        if self._stopped:
            return keep, None
        self._stopped = True
        said = "; ".join(f"endpoint {name}: {why}" for name, why in changed.items())
        return keep, ServingChangedError(
            f"{said}. The run stops here: answers do not say which drafter served them, so the "
            f"{self.unconfirmed} answer(s) of that endpoint since its drafter was last confirmed are not stored; "
            "rerun to generate them under what it serves now (each row then names it)"
        )

    async def _write_rows(self, rows: list[SampleRow]) -> None:
        samples, turns = split_turn_rows(rows)
        if turns:
            if self.turn_store is None:
                raise RuntimeError("conversation turn rows without a turn store")
            await asyncio.to_thread(self.turn_store.write_chunk, [r.as_row() for r in turns])
        if samples:
            await asyncio.to_thread(self.store.write_chunk, [r.as_row() for r in samples])

    async def run_timer(self, every_s: float) -> None:
        """Background task: flush what has waited `every_s` (checked at least once a second)."""
        while True:
            await asyncio.sleep(min(1.0, every_s))
            rows_due, errors_due = self.due(every_s)
            if rows_due or errors_due:
                await self.flush(with_errors=errors_due)
