"""A journal test double: the real SQLite journal (actors/journal.py), failing on demand.

Everything goes to a real SQLite file as in `toolwire serve`; the double only makes chosen
operations fail the way SQLite fails them:

- a read-back (`read_results`) raises SQLite's error before it reads, `times` times;
- a change of a chosen kind (`write`, `touch`, `delete`, `approve_tool`, `forget_approvals`,
  `mark_closed`, `forget_closed`), optionally only for one chat or call, makes every commit
  holding it fail, as a commit SQLite refuses does: on the loop's thread or the writer's,
  whole batch first and then one change at a time (the journal's own retry);
- `fail_every_write` is a disk that takes nothing any more (full, read-only, gone): every
  commit fails, the probe too.

Failures are raised inside `_commit`, the one call every commit goes through (it runs the
journal's `commit_statements`, which the journal benchmark's bound replaces), so the journal's
own handling of them is what runs.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolwire.actors import journal as journal_module
from toolwire.actors.journal import SqliteJournal
from toolwire.actors.results import Result

# The statement of each kind of change, as the journal queues it.
KINDS: dict[str, str] = {
    "write": journal_module._UPSERT,
    "touch": journal_module._TOUCH,
    "delete": journal_module._DELETE,
    "approve_tool": journal_module._APPROVE_TOOL,
    "forget_approvals": journal_module._FORGET_APPROVALS,
    "mark_closed": journal_module._MARK_CLOSED,
    "forget_closed": journal_module._FORGET_CLOSED,
}


def disk_io_error() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("disk I/O error")


@dataclass
class _Fault:
    kind: str
    error: BaseException
    chat_id: str | None
    call_id: str | None
    times: int | None  # None: until cleared

    def matches(self, sql: str, params: tuple[Any, ...]) -> bool:
        if KINDS[self.kind] is not sql:
            return False
        chat_id, call_id = _keys(sql, params)
        return (self.chat_id is None or self.chat_id == chat_id) and (
            self.call_id is None or self.call_id == call_id
        )


def _keys(sql: str, params: tuple[Any, ...]) -> tuple[str | None, str | None]:
    if sql is journal_module._TOUCH:
        return params[1], params[2]
    if sql in (journal_module._UPSERT, journal_module._DELETE):
        return params[0], params[1]
    return (params[0] if params else None), None


class FaultyJournal(SqliteJournal):
    def __init__(self, path: Path, sync: str = "full") -> None:
        super().__init__(path, sync)
        # Commits run on the loop's thread and on the writer's: the faults are shared.
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._read_faults: list[BaseException] = []
        self._every_write: BaseException | None = None
        self.reads_failed = 0
        self.commits_failed = 0
        # Retries without the real pauses (the journal's own ones are for real disks).
        self.write_retry_delays_s = (0.0, 0.0)

    # What to fail

    def fail_reads(self, error: BaseException | None = None, *, times: int = 1) -> None:
        """The next `times` read-backs raise `error` (SQLite's disk I/O error by default)."""
        with self._lock:
            self._read_faults.extend([error or disk_io_error()] * times)

    def fail(
        self,
        kind: str,
        error: BaseException | None = None,
        *,
        chat_id: str | None = None,
        call_id: str | None = None,
        times: int | None = None,
    ) -> None:
        """Every commit holding a change of `kind` (of that chat or call, when named) fails
        with `error`, for the next `times` such changes (None: until `clear`)."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; use one of {sorted(KINDS)}")
        with self._lock:
            self._faults.append(_Fault(kind, error or disk_io_error(), chat_id, call_id, times))

    def fail_every_write(self, error: BaseException | None = None) -> None:
        """The disk takes nothing any more: every commit fails."""
        self._every_write = error or sqlite3.OperationalError("database or disk is full")

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._read_faults.clear()
            self._every_write = None

    # Where it fails

    async def read_results(self, keys: Sequence[tuple[str, str]]) -> list[Result | None]:
        with self._lock:
            error = self._read_faults.pop(0) if self._read_faults else None
        if error is not None:
            self.reads_failed += 1
            raise error
        return await super().read_results(keys)

    def _commit(self, batch: list[tuple[int, str, tuple[Any, ...]]]) -> None:
        error = self._every_write
        if error is None:
            with self._lock:
                for fault in self._faults:
                    if any(fault.matches(sql, params) for _, sql, params in batch):
                        error = fault.error
                        # A change counts once it is refused on its own (the journal tries
                        # the whole batch first, then each change).
                        if len(batch) == 1 and fault.times is not None:
                            fault.times -= 1
                            if fault.times == 0:
                                self._faults.remove(fault)
                        break
        if error is not None:
            self.commits_failed += 1
            raise error
        super()._commit(batch)
