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

Failures are raised inside the journal's public seam `commit_statements`, the one call every
commit goes through (on either thread, the probe too), so the journal's own handling of them
is what runs. A change is known by its statement's verb and table (the seam hands over each
change's SQL and parameters): should the journal's statements change, a fault of their kind
never fires and the test that expects it fails.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolwire.actors.journal import CommitBatch, SqliteJournal, run_commit_statements
from toolwire.actors.results import Result

# Each kind of change, by how its statement begins (its verb and table).
KINDS: dict[str, str] = {
    "write": "INSERT INTO calls ",
    "touch": "UPDATE calls ",
    "delete": "DELETE FROM calls ",
    "approve_tool": "INSERT OR IGNORE INTO chat_approvals ",
    "forget_approvals": "DELETE FROM chat_approvals ",
    "mark_closed": "INSERT OR IGNORE INTO closed_chats ",
    "forget_closed": "DELETE FROM closed_chats ",
}


def kind_of(sql: str) -> str | None:
    """The kind of change `sql` makes; None for the journal's probe (a write to `meta`)."""
    return next((kind for kind, head in KINDS.items() if sql.startswith(head)), None)


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
        if kind_of(sql) != self.kind:
            return False
        chat_id, call_id = _keys(self.kind, params)
        return (self.chat_id is None or self.chat_id == chat_id) and (
            self.call_id is None or self.call_id == call_id
        )


def _keys(kind: str, params: tuple[Any, ...]) -> tuple[str | None, str | None]:
    if kind == "touch":  # (touched_at_ms, chat_id, call_id)
        return params[1], params[2]
    if kind in ("write", "delete"):  # (chat_id, call_id, ...)
        return params[0], params[1]
    return (params[0] if params else None), None


class FaultyJournal(SqliteJournal):
    def __init__(self, path: Path, sync: str = "full") -> None:
        # Commits run on the loop's thread and on the writer's: the faults are shared.
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._read_faults: list[BaseException] = []
        self._every_write: BaseException | None = None
        self.reads_failed = 0
        self.commits_failed = 0
        super().__init__(
            path,
            sync,
            commit_statements=self._run_or_fail,
            # Retries without the real pauses (the journal's own ones are for real disks).
            write_retry_delays_s=(0.0, 0.0),
        )

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

    def _run_or_fail(self, db: sqlite3.Connection, batch: CommitBatch) -> None:
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
        run_commit_statements(db, batch)
