"""The durable record store: at most once across agent restarts.

The chat actors keep their records in memory and write every change that matters here. Writes
are queued synchronously (no `await` inside a record transition) and one writer task commits
them in groups (group commit: one transaction and one fsync for everything queued meanwhile).
A commit runs on a thread of its own, so that SQLite never blocks the trio loop while the loop
has other work; when the loop has nothing else to run, the batch is small and commits have been
fast, it runs on the loop's thread instead, saving the two thread hand-overs (INLINE_MAX_ROWS).
Checkpoints of the WAL run on the writer thread between commits, never inside one. A caller
that must not act before a change is durable (start an effect, reply with a result, confirm a
cancel) hands the journal a callback with `when_durable(seq, fn)`: the writer calls every
callback a commit covers right after that commit, on the loop, in one go (no task and no thread
hop per call). A task that is running anyway may await `wait_durable(seq)` instead; everything
else goes on.

A journal that `keeps_results` is also where finished results live: once a result is durable
the chat actors drop it from the heap (an LRU keeps the recent ones, `actors/result_cache.py`)
and `read_results` reads it back, on a worker thread like the commits, when a repeat, an attach,
a cancel or a turn needs it. So memory grows with the number of records, not with their results.

`MemoryJournal` keeps nothing and is always durable: for tests, simulations and benchmarks
(`--journal memory`), and the zero-cost baseline the journal benchmark compares against. With it
the records themselves hold their results, as they must: nothing else does.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import os
import queue
import sqlite3
import sys
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio

from toolwire.actors.big_writes import BIG_WRITES, BigWrites
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.metrics import Durations
from toolwire.actors.results import Result

log = logging.getLogger("toolwire.journal")

# 2 added `chat_approvals` (approve with scope "chat", PROTOCOL.md 9.5); 3 added `closed_chats`
# (close_chat, 9.6). An older journal is upgraded in place when opened: each new table starts
# empty (no chat had such an approval; no close was kept across a restart before).
SCHEMA_VERSION = 3
_UPGRADABLE = ("1", "2")

# `toolwire serve --sync`: what a commit waits for (SQLite's `synchronous`, in WAL mode).
# FULL: the WAL is fsynced at every commit, so a commit survives a power loss or a kernel crash.
# NORMAL: the WAL is fsynced only at checkpoints, so a commit survives a crash of the agent (the
# kernel holds the write) but the last commits may be lost with the machine.
SYNC_LEVELS = ("full", "normal")

# A group commit takes everything queued while the previous one was on disk, but at most this
# many changes, so one transaction's latency stays bounded under a flood of calls.
MAX_BATCH = 4096

# Consecutive upserts go to SQLite as one multi-row statement of at most this many rows (4
# parameters each, far below SQLite's limit): the writer then binds a whole group under the GIL
# once and steps it once, instead of taking the GIL back from the event loop after every row.
UPSERT_ROWS_PER_STATEMENT = 256
# A batch of nothing but at most this many upserts (a pipelined window's results) is one
# statement of exactly that many rows, in autocommit: the whole commit is one call into SQLite,
# and the writer thread takes the GIL back once for it instead of at every statement. (At most
# this many statements of this kind are kept prepared.)
SINGLE_STATEMENT_ROWS = 64

# A commit runs on the event loop's own thread, without the two thread hand-overs (about
# 50 µs each on a virtual machine), when the loop has nothing else to run, the batch is small,
# and commits have been fast: their moving average (each new one weighs COMMIT_AVERAGE_WEIGHT)
# is below INLINE_MAX_COMMIT_S. A disk that turns slow can stall the loop once, for one commit;
# from then on commits go to the writer thread until their average is low again. And none runs
# there while a file tool writes a big file (actors/big_writes.py): its fsync is then this
# commit's wait too, tens to hundreds of milliseconds, known before the commit starts.
INLINE_MAX_ROWS = 64
INLINE_MAX_COMMIT_S = 0.001
COMMIT_AVERAGE_WEIGHT = 0.1

# The WAL is checkpointed (copied into the database file) by the writer thread, right after
# the commit that brings it to about this many pages, never inside a commit: SQLite's automatic
# checkpoint (at 1,000 pages by default) runs inside whichever commit crossed its threshold,
# making that call wait (and an inline commit stall the loop) for milliseconds. Pages are
# estimated: each change one page of its own (a random call id lands on a page of its own) and
# each commit two more. A WAL that stays small is also rewritten in place from its start after
# each checkpoint, and a commit that does not grow the file is about twice as fast to fsync.
CHECKPOINT_PAGES = 1000

# A batch that fails is tried again one change at a time, so that a change SQLite refuses on
# its own (a corrupt page under its key, a row past SQLite's length limit) fails only its own
# call. When every change of it fails, a probe write tells a journal that refuses these changes
# from one that cannot write at all (a full disk, an I/O error, a file made read-only); the
# probe is tried again after these pauses before the journal gives up and the agent stops: a
# disk full for a moment (a log being rotated) costs the waiting calls about half a second, not
# every command of the agent. (SQLite's own busy handler likewise retries for a bounded time.)
WRITE_RETRY_DELAYS_S = (0.1, 0.4)

# A commit checks that the journal's files are still the ones at its path (deleted or
# replaced under a running agent: see `_replaced`) before it counts as durable, unless the last
# check was less than IDENTITY_CHECK_MIN_GAP_S ago. The check is two stat calls, 5-40 µs on the
# 2-core benchmark machine against 100-250 µs for a commit; checked at every commit, it took
# 8-23% of a stream of back-to-back commits, at most a hundred a second 0.3%. So every commit of
# an agent at rest checks (no call's start counts that went into a journal already gone), and a
# journal lost under a busy agent is found within 10 ms of commits. While no commit runs, the
# journal checks every IDENTITY_CHECK_INTERVAL_S, so that an idle agent does not run on for
# long on a journal that is gone.
IDENTITY_CHECK_MIN_GAP_S = 0.01
IDENTITY_CHECK_INTERVAL_S = 5.0

# How many refused changes the journal remembers, for `failed(seq)`: the chats ask right after
# the commit that refused them, so only the newest matter.
FAILED_CHANGES_KEPT = 4096

# One group commit's changes, in order: (sequence number, SQL, parameters).
CommitBatch = list[tuple[int, str, tuple[Any, ...]]]
_Batch = CommitBatch
# What runs a commit's statements on the writer's connection (see `run_commit_statements`).
CommitStatements = Callable[[sqlite3.Connection, CommitBatch], None]
# A change the journal refused, with SQLite's error.
_Refused = list[tuple[tuple[int, str, tuple[Any, ...]], Exception]]


class JournalError(Exception):
    """The journal cannot be opened, read or written: the agent must stop, never silently
    reset."""


class CommitWaiters:
    """Callbacks waiting for a journal sequence number to be durable, released in sequence
    order by the writer right after the commit that covers them."""

    def __init__(self) -> None:
        # A heap: a task may register for an older change after a newer one was registered.
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._order = itertools.count()  # ties keep their registration order

    def add(self, seq: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (seq, next(self._order), fn))

    def release(self, durable_seq: int) -> None:
        """Call every callback up to `durable_seq`. One that fails is logged: it must not stop
        the writer (and with it every other chat's durability)."""
        heap = self._heap
        while heap and heap[0][0] <= durable_seq:
            fn = heapq.heappop(heap)[2]
            try:
                fn()
            except Exception:
                log.exception("a journal commit callback failed")

    def clear(self) -> None:
        self._heap.clear()


class Journal(ABC):
    """What the chat actors need of a durable store."""

    # False for MemoryJournal: the actors skip building rows nobody keeps.
    enabled = True
    # True when `read_results` can give back every durable result of a record still journaled:
    # the chat actors then keep finished results off the heap.
    keeps_results = False
    # How long each group commit took (`toolwire_journal_commit_seconds`); None: never commits.
    commit_durations: Durations | None = None
    # Called (on the loop, with `failure`) the moment the journal can no longer write, before
    # any change is failed: the agent says why and stops taking requests first (agent.py).
    on_failure: Callable[[str], None] | None = None

    @abstractmethod
    def write(self, row: JournalRow) -> int:
        """Queue an upsert of the record's current state; returns its sequence number."""

    @abstractmethod
    def touch(self, chat_id: str, call_id: str, wall_ms: int) -> None:
        """Queue a new last-touch time (no one waits for it to be durable)."""

    @abstractmethod
    def delete(self, chat_id: str, call_id: str) -> None:
        """Queue the removal of a forgotten record."""

    @abstractmethod
    def approve_tool(self, chat_id: str, tool: str) -> int:
        """Queue "every call of `tool` in `chat_id` is approved" (`approve` with scope "chat");
        returns its sequence number."""

    @abstractmethod
    def forget_approvals(self, chat_id: str) -> None:
        """Queue the removal of every tool approved in `chat_id` (its last record is gone)."""

    @abstractmethod
    def load_approvals(self) -> list[tuple[str, str]]:
        """Every `(chat_id, tool)` approved, for recovery at start (after the records)."""

    @abstractmethod
    def mark_closed(self, chat_id: str, closed_at_ms: int) -> int:
        """Queue "`chat_id` is closed" (`close_chat`, 9.6); returns its sequence number."""

    @abstractmethod
    def forget_closed(self, chat_id: str) -> None:
        """Queue the removal of the chat's close (its records are all forgotten)."""

    @abstractmethod
    def load_closed(self) -> list[str]:
        """Every closed chat's id, for recovery at start (after the records)."""

    @property
    def queued_seq(self) -> int:
        """The sequence number of the last write queued (0 when none): waiting for it to be
        durable waits for everything queued so far."""
        return 0

    @abstractmethod
    def is_durable(self, seq: int) -> bool: ...

    def failed(self, seq: int) -> BaseException | None:
        """Why change `seq` will never be durable (the journal refused it, or can no longer
        write at all), or None: it is durable, or may still become so."""
        return None

    @property
    def failure(self) -> str | None:
        """Why the journal can no longer write at all (None while it can): every change from
        then on is refused, and the agent must stop (actors/agent.py)."""
        return None

    @abstractmethod
    async def wait_durable(self, seq: int) -> None: ...

    def when_durable(self, seq: int, fn: Callable[[], None]) -> None:
        """Call `fn` (synchronously, on the loop) once change `seq` is durable or `failed`:
        right after the commit that covers it, together with every other callback that commit
        covers, or at once when it is durable already. Never called if the agent dies first."""
        fn()

    @abstractmethod
    def load(self) -> list[JournalRow]:
        """Every record, for recovery at start (before the writer runs)."""

    def recover(self) -> Iterator[JournalRow]:
        """Every record in touch order (oldest first), for recovery at start. A store may read
        them one at a time, so that recovering many records never holds them all at once."""
        return iter(sorted(self.load(), key=lambda row: row.touched_at_ms))

    async def read_results(self, keys: Sequence[tuple[str, str]]) -> list[Result | None]:
        """The committed result of each `(chat_id, call_id)`, None where there is none. Only
        for a journal that `keeps_results`; callers ask only for results already durable."""
        raise NotImplementedError(f"{type(self).__name__} does not keep results")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task; runs in the agent's nursery until cancelled."""
        task_status.started()
        await trio.sleep_forever()

    def close(self) -> None:  # noqa: B027 - a store with nothing to release needs no override
        """Release the store (after the writer has stopped)."""


class MemoryJournal(Journal):
    enabled = False

    def write(self, row: JournalRow) -> int:
        return 0

    def touch(self, chat_id: str, call_id: str, wall_ms: int) -> None:
        pass

    def delete(self, chat_id: str, call_id: str) -> None:
        pass

    def is_durable(self, seq: int) -> bool:
        return True

    async def wait_durable(self, seq: int) -> None:
        await trio.lowlevel.checkpoint()

    def load(self) -> list[JournalRow]:
        return []

    def approve_tool(self, chat_id: str, tool: str) -> int:
        return 0

    def forget_approvals(self, chat_id: str) -> None:
        pass

    def load_approvals(self) -> list[tuple[str, str]]:
        return []

    def mark_closed(self, chat_id: str, closed_at_ms: int) -> int:
        return 0

    def forget_closed(self, chat_id: str) -> None:
        pass

    def load_closed(self) -> list[str]:
        return []


_row_encoder = msgspec.msgpack.Encoder()
_row_decoder = msgspec.msgpack.Decoder(JournalRow)


def _decode_row(blob: bytes, touched_at_ms: int) -> JournalRow:
    # A touch updates the column alone (the row is not rewritten for it): the column holds the
    # last use, and the record's age after a restart counts from there.
    row = _row_decoder.decode(blob)
    if row.touched_at_ms != touched_at_ms:
        row.touched_at_ms = touched_at_ms
    return row


class _SavedResult(msgspec.Struct):
    """A journal row read for its result only: msgspec skips the other fields unread."""

    result: Result | None = None


_result_decoder = msgspec.msgpack.Decoder(_SavedResult)

_UPSERT = (
    "INSERT INTO calls (chat_id, call_id, row, touched_at_ms) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (chat_id, call_id) DO UPDATE SET row = excluded.row, "
    "touched_at_ms = excluded.touched_at_ms"
)
_UPSERT_MANY_HEAD = "INSERT INTO calls (chat_id, call_id, row, touched_at_ms) VALUES "
_UPSERT_MANY_TAIL = _UPSERT[_UPSERT.index(" ON CONFLICT") :]
_TOUCH = "UPDATE calls SET touched_at_ms = ? WHERE chat_id = ? AND call_id = ?"
_DELETE = "DELETE FROM calls WHERE chat_id = ? AND call_id = ?"
_SELECT_ROW = "SELECT row FROM calls WHERE chat_id = ? AND call_id = ?"
_APPROVE_TOOL = "INSERT OR IGNORE INTO chat_approvals (chat_id, tool) VALUES (?, ?)"
_FORGET_APPROVALS = "DELETE FROM chat_approvals WHERE chat_id = ?"
_MARK_CLOSED = "INSERT OR IGNORE INTO closed_chats (chat_id, closed_at_ms) VALUES (?, ?)"
_FORGET_CLOSED = "DELETE FROM closed_chats WHERE chat_id = ?"
# A write of nothing that matters, to tell "these changes are refused" from "nothing can be
# written" (WRITE_RETRY_DELAYS_S); also the check at open that the journal can be written.
_PROBE = (
    "INSERT INTO meta (key, value) VALUES ('probed_at_ms', ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)

# What each kind of change is, for the log line of one the journal refused, and what losing
# it means (the row on disk stays as it was before it).
_WHAT: dict[str, tuple[str, str]] = {
    _UPSERT: ("the row of", "the call is ended by its chat"),
    _TOUCH: ("the touch of", "after a restart its age counts from its previous touch"),
    _DELETE: ("the delete of", "after a restart the record comes back with its saved result"),
    _APPROVE_TOOL: (
        "the chat-wide approval of",
        "after a restart that tool's calls ask for approval again",
    ),
    _FORGET_APPROVALS: ("forgetting the approvals of", "recovery drops them at the next start"),
    _MARK_CLOSED: ("the close of", "after a restart the chat is open again"),
    _FORGET_CLOSED: ("the reopening of", "recovery drops the close at the next start"),
}


def _describe(op: tuple[int, str, tuple[Any, ...]]) -> tuple[str, str, str | None, str]:
    """(what, chat_id, call_id or None, consequence) of one queued change."""
    _, sql, params = op
    what, consequence = _WHAT.get(sql, ("a change of", ""))
    if sql is _UPSERT or sql is _DELETE:
        return what, str(params[0]), str(params[1]), consequence
    if sql is _TOUCH:
        return what, str(params[1]), str(params[2]), consequence
    if sql is _APPROVE_TOOL:
        return f"{what} {params[1]} in", str(params[0]), None, consequence
    return what, str(params[0]) if params else "", None, consequence


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


class SqliteJournal(Journal):
    """Records in SQLite (WAL mode) under the state dir, one row per (chat_id, call_id)."""

    keeps_results = True
    commit_durations: Durations

    def __init__(
        self,
        path: Path,
        sync: str = "full",
        *,
        inline_max_commit_s: float = INLINE_MAX_COMMIT_S,
        commit_statements: CommitStatements | None = None,
        write_retry_delays_s: Sequence[float] = WRITE_RETRY_DELAYS_S,
        identity_check_min_gap_s: float = IDENTITY_CHECK_MIN_GAP_S,
        identity_check_interval_s: float = IDENTITY_CHECK_INTERVAL_S,
        big_writes: BigWrites = BIG_WRITES,
    ) -> None:
        """`inline_max_commit_s`: commits run on the loop's thread only while they average
        less than this (INLINE_MAX_COMMIT_S); 0 sends every commit to the writer thread,
        `inf` lets the loop's idleness and the batch's size alone decide.

        `write_retry_delays_s`: when every change of a batch is refused and the probe fails
        too, the journal tries again after each of these pauses before it gives up
        (WRITE_RETRY_DELAYS_S); each >= 0 and finite, empty for no second try.

        `identity_check_min_gap_s`: a commit checks that the journal's files are still the ones
        at its path unless the last check was less than this ago (IDENTITY_CHECK_MIN_GAP_S);
        0 checks at every commit. `identity_check_interval_s`: how often an idle journal checks
        (IDENTITY_CHECK_INTERVAL_S); > 0, `inf` for never.

        `big_writes`: while it says a big write is running, no commit runs on the loop's
        thread (the process's own count, BIG_WRITES, unless a test gives its own).

        `commit_statements`: runs every commit's statements, on the loop's thread or the
        writer thread, inside the journal's whole commit path (batching, the choice of thread,
        retries, the identity check, the release of waiters); `run_commit_statements` when
        None. The seam for instruments: the journal benchmark's bound skips the statements
        (benchmarks/toolwire_server.py); a replacement that skips them loses every change.
        """
        if sync not in SYNC_LEVELS:
            raise ValueError(f"unknown sync level {sync!r}; use {' or '.join(SYNC_LEVELS)}")
        if not inline_max_commit_s >= 0:
            raise ValueError(
                f"inline_max_commit_s must be >= 0 seconds, got {inline_max_commit_s!r}"
            )
        write_retry_delays_s = tuple(write_retry_delays_s)
        if not all(0 <= delay < math.inf for delay in write_retry_delays_s):
            raise ValueError(
                "write_retry_delays_s must be pauses of >= 0 finite seconds, "
                f"got {write_retry_delays_s!r}"
            )
        if not identity_check_min_gap_s >= 0:
            raise ValueError(
                f"identity_check_min_gap_s must be >= 0 seconds, got {identity_check_min_gap_s!r}"
            )
        if not identity_check_interval_s > 0:
            raise ValueError(
                f"identity_check_interval_s must be > 0 seconds, got {identity_check_interval_s!r}"
            )
        self.path = path
        self.sync = sync
        # Reads use a connection of their own: in WAL mode it sees the last commit without
        # waiting for the writer, and the writer's connection stays the writer thread's alone.
        self._reader: sqlite3.Connection | None = None
        self._read_limiter = trio.CapacityLimiter(1)
        self._ops: list[tuple[int, str, tuple[Any, ...]]] = []
        # Batches handed to the writer thread (None stops it): one at a time, taken by the
        # writer task on the loop, so a batch holds every change queued in a scheduling round.
        # Each with whether the thread checkpoints the WAL after committing it.
        self._batches: queue.SimpleQueue[tuple[_Batch, bool] | None] = queue.SimpleQueue()
        # False from a hand-over until the thread is done with it, its checkpoint included:
        # the writer's connection is then the thread's, and no commit runs inline.
        self._thread_idle = True
        self._wal_pages = 0  # estimated pages in the WAL since the last checkpoint
        self._queued_seq = 0  # sequence number of the newest queued change
        self._durable_seq = 0  # sequence number of the newest committed change
        self._committed = trio.Event()
        self._waiters = CommitWaiters()
        self._wakeup = trio.Event()
        # Set (from the writer thread, through the trio token) when a commit landed or failed:
        # one event per commit.
        self._landed = trio.Event()
        # What the writer thread reports with it: the changes it refused, and the error that
        # ended the journal's writing (None: it writes on).
        self._landing: tuple[_Refused, BaseException | None] = ([], None)
        # Set once the journal can no longer write at all (every change from then on is
        # refused), with `failure` saying why; the agent stops then (`on_failure`).
        self._failed: BaseException | None = None
        self._failure: str | None = None
        # Changes refused one by one (the journal still writes others): seq -> SQLite's error.
        self._refused: dict[int, BaseException] = {}
        self._write_retry_delays_s = write_retry_delays_s
        self._identity_check_interval_s = identity_check_interval_s
        self._identity_check_min_gap_s = identity_check_min_gap_s
        self._identity_checked_at = -math.inf  # time.monotonic() of the last check
        self.commit_durations = Durations()
        # Commits on the loop's thread: see INLINE_MAX_ROWS.
        self._inline_max_commit_s = inline_max_commit_s
        self._commit_average_s = 0.0
        self._big_writes = big_writes
        self._commit_statements = commit_statements or run_commit_statements
        # Whether this start created the journal file, and whether the state dir shows it
        # last held another one (see `_check_lineage`).
        try:
            self.created = not path.exists()
        except OSError:
            self.created = False  # _open names the problem
        self._db = self._open(path, sync)
        self.lineage_broken = self._check_lineage()
        # The files SQLite has open, as (st_dev, st_ino): a journal deleted or replaced under
        # the agent is found by comparing them with what the paths name now (`_replaced`).
        self._wal_path = path.with_name(path.name + "-wal")
        self._identities = [
            (where, found)
            for where in (path, self._wal_path)
            if (found := _identity(where)) is not None
        ]

    @staticmethod
    def _open(path: Path, sync: str) -> sqlite3.Connection:
        # Records hold commands, args and outputs: private to this user, like the token.
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not path.exists():
                path.touch(mode=0o600)
            if not path.is_file():
                raise JournalError(f"journal {path} is not a file")
            for where in (path, path.parent):
                # SQLite would open a read-only file read-only and fail only at the first
                # write; the WAL and its index are created next to the file.
                if not os.access(where, os.W_OK):
                    raise JournalError(
                        f"journal {path} cannot be written: {where} is read-only for this user"
                    )
        except OSError as exc:
            raise JournalError(f"journal {path} cannot be created: {_os_error(exc)}") from exc
        try:
            db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            # WAL: readers never block the writer, and a commit is one append + fsync.
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed transaction survives power loss, not only a process crash;
            # NORMAL: only a process crash (see SYNC_LEVELS).
            db.execute(f"PRAGMA synchronous={sync.upper()}")
            # Checkpoints are the writer thread's, between commits (CHECKPOINT_PAGES).
            db.execute("PRAGMA wal_autocheckpoint=0")
            check = db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise JournalError(f"journal {path} is corrupt: {check}")
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            db.execute(
                "CREATE TABLE IF NOT EXISTS calls (chat_id TEXT NOT NULL, call_id TEXT NOT NULL, "
                "row BLOB NOT NULL, touched_at_ms INTEGER NOT NULL, "
                "PRIMARY KEY (chat_id, call_id)) WITHOUT ROWID"
            )
            # One row per tool a chat approved with scope "chat" (PROTOCOL.md 9.5).
            db.execute(
                "CREATE TABLE IF NOT EXISTS chat_approvals (chat_id TEXT NOT NULL, "
                "tool TEXT NOT NULL, PRIMARY KEY (chat_id, tool)) WITHOUT ROWID"
            )
            # One row per closed chat (PROTOCOL.md 9.6), until its records are all forgotten.
            db.execute(
                "CREATE TABLE IF NOT EXISTS closed_chats (chat_id TEXT PRIMARY KEY, "
                "closed_at_ms INTEGER NOT NULL) WITHOUT ROWID"
            )
            found = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if found is None:
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif found[0] in _UPGRADABLE:
                # Versions 1 and 2 lack only tables created just above (SCHEMA_VERSION).
                db.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION),),
                )
            elif found[0] != str(SCHEMA_VERSION):
                raise JournalError(
                    f"journal {path} has schema version {found[0]}; this agent reads "
                    f"version {SCHEMA_VERSION}"
                )
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"journal {path} is unreadable: {exc}") from exc
        try:
            # A journal that can be read but not written (a read-only file, directory or
            # mount; a full disk) fails the start here, before "ready", never at the first
            # call.
            db.execute(_PROBE, (int(time.time() * 1000),))
        except sqlite3.Error as exc:
            db.close()
            raise JournalError(f"journal {path} cannot be written: {exc}") from exc
        return db

    def _check_lineage(self) -> bool:
        """Whether this journal is not the one the state dir last used: True, with a warning,
        when the id file next to it names another journal (deleted and created anew, or
        replaced by a copy). Each journal gets an id when it is created, kept in its `meta`
        table and in `<journal>.id`; the next start compares the two. "0 records recovered"
        after a journal was lost then does not pass for a first start."""
        marker = self.path.with_name(self.path.name + ".id")
        try:
            found = self._db.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
            if found is None:
                journal_id = str(uuid.uuid4())
                self._db.execute(
                    "INSERT INTO meta (key, value) VALUES ('journal_id', ?)", (journal_id,)
                )
            else:
                journal_id = str(found[0])
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path} cannot be written: {exc}") from exc
        try:
            seen = marker.read_text().strip() if marker.exists() else ""
            if seen != journal_id:
                temporary = marker.with_name(marker.name + ".tmp")
                temporary.write_text(journal_id + "\n")
                temporary.replace(marker)
        except OSError as exc:
            raise JournalError(
                f"journal {self.path}: its id file cannot be written: {_os_error(exc)}"
            ) from exc
        if seen and seen != journal_id:
            how = "a new, empty journal file was created" if self.created else "another file"
            log.warning(
                "journal %s is not the journal this state dir last used (%s, where journal %s "
                "was): the calls saved before are not in it, so a repeat of one of their ids "
                "runs again",
                self.path,
                how,
                seen,
                extra={"journal": str(self.path), "journal_id": journal_id, "was": seen},
            )
            return True
        return False

    def _queue(self, sql: str, params: tuple[Any, ...]) -> int:
        if self._failure is not None:
            raise JournalError(self._failure) from self._failed
        self._queued_seq += 1
        self._ops.append((self._queued_seq, sql, params))
        self._wakeup.set()
        return self._queued_seq

    def write(self, row: JournalRow) -> int:
        return self._queue(
            _UPSERT, (row.chat_id, row.call_id, _row_encoder.encode(row), row.touched_at_ms)
        )

    def touch(self, chat_id: str, call_id: str, wall_ms: int) -> None:
        self._queue(_TOUCH, (wall_ms, chat_id, call_id))

    def delete(self, chat_id: str, call_id: str) -> None:
        self._queue(_DELETE, (chat_id, call_id))

    def approve_tool(self, chat_id: str, tool: str) -> int:
        return self._queue(_APPROVE_TOOL, (chat_id, tool))

    def forget_approvals(self, chat_id: str) -> None:
        self._queue(_FORGET_APPROVALS, (chat_id,))

    def mark_closed(self, chat_id: str, closed_at_ms: int) -> int:
        return self._queue(_MARK_CLOSED, (chat_id, closed_at_ms))

    def forget_closed(self, chat_id: str) -> None:
        self._queue(_FORGET_CLOSED, (chat_id,))

    def load_closed(self) -> list[str]:
        try:
            rows = self._db.execute("SELECT chat_id FROM closed_chats ORDER BY chat_id").fetchall()
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc
        return [str(chat_id) for (chat_id,) in rows]

    def load_approvals(self) -> list[tuple[str, str]]:
        try:
            rows = self._db.execute(
                "SELECT chat_id, tool FROM chat_approvals ORDER BY chat_id, tool"
            ).fetchall()
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc
        return [(str(chat_id), str(tool)) for chat_id, tool in rows]

    @property
    def queued_seq(self) -> int:
        return self._queued_seq

    def is_durable(self, seq: int) -> bool:
        return seq <= self._durable_seq and not (self._refused and seq in self._refused)

    def failed(self, seq: int) -> BaseException | None:
        if self._refused:
            found = self._refused.get(seq)
            if found is not None:
                return found
        if self._failed is not None and seq > self._durable_seq:
            return self._failed
        return None

    @property
    def failure(self) -> str | None:
        return self._failure

    async def wait_durable(self, seq: int) -> None:
        while seq > self._durable_seq:
            if self._failure is not None:
                raise JournalError(self._failure) from self._failed
            await self._committed.wait()
        refused = self.failed(seq)
        if refused is not None:
            raise JournalError(f"journal {self.path} refused change {seq}: {refused}")
        await trio.lowlevel.checkpoint()

    def when_durable(self, seq: int, fn: Callable[[], None]) -> None:
        if seq <= self._durable_seq or self._failed is not None:
            fn()
        else:
            self._waiters.add(seq, fn)

    def load(self) -> list[JournalRow]:
        try:
            rows = self._db.execute("SELECT row, touched_at_ms FROM calls").fetchall()
            return [_decode_row(blob, touched_at_ms) for blob, touched_at_ms in rows]
        except (sqlite3.DatabaseError, msgspec.DecodeError) as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc

    def recover(self) -> Iterator[JournalRow]:
        # One row at a time off a cursor (SQLite sorts on disk if it must): decoding every row
        # with its result at once would leave the heap holding hundreds of megabytes of
        # freed memory after the records dropped their results (100,000 records: 283 MiB).
        try:
            for blob, touched_at_ms in self._db.execute(
                "SELECT row, touched_at_ms FROM calls ORDER BY touched_at_ms, chat_id, call_id"
            ):
                yield _decode_row(blob, touched_at_ms)
        except (sqlite3.DatabaseError, msgspec.DecodeError) as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc

    async def read_results(self, keys: Sequence[tuple[str, str]]) -> list[Result | None]:
        if self._failure is not None:
            raise JournalError(self._failure) from self._failed
        if not keys:
            return []
        # A worker thread, like the commits: even a point read may wait for the disk, and the
        # loop must not. One hop reads a whole batch (a turn's calls).
        return await trio.to_thread.run_sync(
            self._read_results, list(keys), limiter=self._read_limiter
        )

    def _read_results(self, keys: list[tuple[str, str]]) -> list[Result | None]:
        try:
            db = self._reader
            if db is None:
                db = self._reader = sqlite3.connect(
                    self.path, check_same_thread=False, isolation_level=None
                )
                db.execute("PRAGMA query_only=1")
            found: list[Result | None] = []
            for key in keys:
                row = db.execute(_SELECT_ROW, key).fetchone()
                found.append(None if row is None else _result_decoder.decode(row[0]).result)
            return found
        except (sqlite3.DatabaseError, msgspec.DecodeError) as exc:
            raise JournalError(f"journal {self.path}: read failed: {exc}") from exc

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A thread of its own rather than `trio.to_thread` per commit: that cost a thread
        # handoff (and on the loop, about a tenth of its time under pipelined load) per commit.
        token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(
            target=self._writer_thread, args=(token,), name="toolwire-journal", daemon=True
        )
        thread.start()
        task_status.started()
        try:
            while True:
                if not self._ops:
                    with trio.move_on_after(self._identity_check_interval_s) as idle:
                        await self._wakeup.wait()
                    if idle.cancelled_caught:
                        replaced = self._replaced()
                        if replaced is not None:
                            self._fail(JournalError(replaced))
                            return
                        continue
                    self._wakeup = trio.Event()
                    continue
                if self._may_commit_inline(len(self._ops)) and not _loop_idle():
                    # What else is runnable (the sender of this very call's `accepted`, a
                    # reader with more requests) goes first, once: then the loop may be idle,
                    # and what they queued meanwhile joins this commit.
                    await trio.lowlevel.cancel_shielded_checkpoint()
                batch = self._ops[:MAX_BATCH]
                del self._ops[:MAX_BATCH]
                last = batch[-1][0]
                self._wal_pages += 2 + len(batch)
                checkpoint = self._wal_pages >= CHECKPOINT_PAGES
                if checkpoint:
                    self._wal_pages = 0
                landing = None
                if not checkpoint and self._may_commit_inline(len(batch)) and _loop_idle():
                    # None: it failed, and the writer thread tries again (WRITE_RETRY_DELAYS_S).
                    landing = self._commit_inline(batch)
                if landing is None:
                    self._thread_idle = False
                    self._batches.put((batch, checkpoint))
                    del batch  # the thread's now; not kept here while idle (megabytes of rows)
                    # Not cancellable: a commit half-way would leave waiters not knowing the
                    # truth.
                    with trio.CancelScope(shield=True):
                        await self._landed.wait()
                    self._landed = trio.Event()
                    landing = self._landing
                else:
                    del batch
                refused, fatal = landing
                self._landing = ([], None)
                for op, error in refused:
                    self._refuse(op, error)
                if fatal is not None:
                    self._fail(fatal)
                    return
                self._durable_seq = last
                self._committed.set()
                self._committed = trio.Event()
                # A commit that lands after the agent began to stop releases nothing: a
                # callback may start an effect (the durable start of a write_file), and a
                # stopping agent starts none (recovery finds the start: `unknown`).
                await trio.lowlevel.checkpoint_if_cancelled()
                self._waiters.release(last)
        finally:
            self._batches.put(None)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join)

    def _may_commit_inline(self, rows: int) -> bool:
        """Whether a batch of `rows` may commit on the loop's thread once nothing else is
        runnable (a commit blocks the loop for as long as it takes): a small batch, a disk that
        has been fast, the writer thread done with the connection, and no big file being
        written (its fsync would make this commit's wait, actors/big_writes.py)."""
        return (
            rows <= INLINE_MAX_ROWS
            and self._thread_idle
            and self._commit_average_s < self._inline_max_commit_s
            and not self._big_writes.busy()
        )

    def _commit_inline(self, batch: _Batch) -> tuple[_Refused, BaseException | None] | None:
        started = time.perf_counter()
        try:
            self._commit(batch)
        except Exception:
            self._roll_back()
            return None
        self._commit_took(time.perf_counter() - started)
        replaced = self._replaced_lately()
        return [], None if replaced is None else JournalError(replaced)

    def _commit_or_refuse(self, batch: _Batch) -> tuple[float | None, _Refused, Exception | None]:
        """On the writer thread: commit the batch, or else each of its changes that SQLite
        takes (WRITE_RETRY_DELAYS_S). Returns the commit's duration (None: it failed), the
        changes refused, and the error that ends the journal's writing (None: it writes)."""
        started = time.perf_counter()
        try:
            self._commit(batch)
        except Exception as exc:
            self._roll_back()
            refused, fatal = self._commit_one_by_one(batch, exc)
            return None, refused, fatal
        seconds = time.perf_counter() - started
        # After the commit, before it counts as durable: a commit that went into a file no
        # longer at the journal's path is lost at the next start, and no effect may follow it.
        replaced = self._replaced_lately()
        return seconds, [], None if replaced is None else JournalError(replaced)

    def _commit_one_by_one(
        self, batch: _Batch, error: Exception
    ) -> tuple[_Refused, Exception | None]:
        for delay in (0.0, *self._write_retry_delays_s):
            if delay:
                time.sleep(delay)  # the writer thread's own: the loop and the reads go on
            refused: _Refused = []
            for op in batch:
                try:
                    self._commit([op])
                except Exception as exc:
                    self._roll_back()
                    refused.append((op, exc))
            if len(refused) < len(batch) or self._probe() is None:
                replaced = self._replaced()
                return refused, None if replaced is None else JournalError(replaced)
            error = refused[-1][1]
        return [], error

    def _probe(self) -> Exception | None:
        try:
            self._commit([(0, _PROBE, (int(time.time() * 1000),))])
        except Exception as exc:
            self._roll_back()
            return exc
        return None

    def _roll_back(self) -> None:
        """Leave no transaction open after a failed commit (SQLite rolls back some errors
        itself, not all): the next commit then starts clean."""
        try:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.Error:
            log.exception("rolling back a failed commit of the journal %s failed", self.path)

    def _replaced_lately(self) -> str | None:
        """`_replaced`, unless it was checked less than `identity_check_min_gap_s` ago."""
        now = time.monotonic()
        if now - self._identity_checked_at < self._identity_check_min_gap_s:
            return None
        self._identity_checked_at = now
        return self._replaced()

    def _replaced(self) -> str | None:
        """Why the journal's files are no longer the ones at its path (deleted, moved away or
        replaced under the agent), or None. SQLite would go on writing into the unlinked
        file, and the next start would find an empty journal and run old calls again."""
        for where, identity in self._identities:
            try:
                now = _identity(where)
            except OSError as exc:
                return f"journal {self.path}: {where} cannot be checked: {_os_error(exc)}"
            if now is None:
                return f"journal {self.path}: {where} was deleted under the running agent"
            if now != identity:
                return f"journal {self.path}: {where} was replaced under the running agent"
        return None

    def _refuse(self, op: tuple[int, str, tuple[Any, ...]], error: BaseException) -> None:
        """On the loop: one change the journal refused while it writes others. Its chat is
        told through `failed(seq)` (a row or a close it waits for); every refusal is logged
        here, with what losing it means."""
        refused = self._refused
        refused[op[0]] = error
        if len(refused) > FAILED_CHANGES_KEPT:
            del refused[next(iter(refused))]
        what, chat_id, call_id, consequence = _describe(op)
        where = f"chat {chat_id!r}" if call_id is None else f"{chat_id}/{call_id}"
        log.error(
            "the journal refused %s %s (%s); %s",
            what,
            where,
            error,
            consequence,
            extra={"chat_id": chat_id, "call_id": call_id},
        )

    def _fail(self, error: BaseException) -> None:
        """On the loop: the journal can no longer write. Every change not yet durable is
        failed (its waiters are released and see `failed(seq)`), every later one refused; the
        agent, told first through `on_failure`, stops."""
        self._failed = error
        text = str(error)
        self._failure = (
            text
            if text.startswith(f"journal {self.path}")
            else (f"journal {self.path} cannot be written: {text}")
        )
        if self.on_failure is not None:
            self.on_failure(self._failure)
        self._committed.set()
        self._waiters.release(sys.maxsize)

    def _commit_took(self, seconds: float) -> None:
        self.commit_durations.observe(seconds)
        self._commit_average_s += COMMIT_AVERAGE_WEIGHT * (seconds - self._commit_average_s)

    def _writer_thread(self, token: trio.lowlevel.TrioToken) -> None:
        while True:
            job = self._batches.get()
            if job is None:
                return
            batch, checkpoint = job
            del job
            seconds, refused, fatal = self._commit_or_refuse(batch)
            del batch
            try:
                # The commit's waiters go first: the checkpoint after it delays none of them.
                checkpoint = checkpoint and seconds is not None  # none after a failed commit
                token.run_sync_soon(self._on_landed, seconds, not checkpoint, refused, fatal)
                if checkpoint:
                    self._checkpoint()
                    token.run_sync_soon(self._on_thread_idle)
            except trio.RunFinishedError:
                return

    def _checkpoint(self) -> None:
        # PASSIVE: copies what no reader still needs and never waits for one. A failure loses
        # nothing (the changes stay in the WAL); the next checkpoint tries again.
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            log.exception("checkpointing the journal %s failed", self.path)

    def _on_landed(
        self,
        seconds: float | None,
        idle: bool,
        refused: _Refused,
        fatal: BaseException | None,
    ) -> None:
        # On the loop: the event the writer task waits on now (it replaces it after waking),
        # and the commit's duration (None: it failed) for toolwire_journal_commit_seconds,
        # observed here so that the histogram is only ever touched from the trio thread.
        if seconds is not None:
            self._commit_took(seconds)
        self._thread_idle = idle
        self._landing = (refused, fatal)
        self._landed.set()

    def _on_thread_idle(self) -> None:
        self._thread_idle = True

    def _commit(self, batch: _Batch) -> None:
        # Every commit, on the loop or on the writer thread, is this one call.
        self._commit_statements(self._db, batch)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._db.close()


def run_commit_statements(db: sqlite3.Connection, batch: CommitBatch) -> None:
    """Apply a commit's changes, in order, as one transaction on the writer's connection
    (`db`, in autocommit mode): the journal's own `commit_statements`."""
    if len(batch) == 1:
        # One statement is a transaction of its own (the connection is in autocommit
        # mode): the same commit, without a BEGIN and a COMMIT to step through.
        db.execute(batch[0][1], batch[0][2])
        return
    if len(batch) <= SINGLE_STATEMENT_ROWS and all(op[1] is _UPSERT for op in batch):
        db.execute(_upsert_sql(len(batch)), [value for op in batch for value in op[2]])
        return
    db.execute("BEGIN")
    try:
        # One statement per run of upserts (a pipelined window is mostly upserts back to
        # back), one executemany per run of any other statement.
        i = 0
        while i < len(batch):
            sql = batch[i][1]
            j = i + 1
            while j < len(batch) and batch[j][1] is sql:
                j += 1
            if sql is _UPSERT:
                _upsert_run(db, batch, i, j)
            elif j == i + 1:
                db.execute(sql, batch[i][2])
            else:
                db.executemany(sql, [op[2] for op in batch[i:j]])
            i = j
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _os_error(exc: OSError) -> str:
    """An OSError in one line: its text and, when it names one, the file."""
    text = exc.strerror or str(exc)
    return f"{text}: {exc.filename}" if exc.filename else text


def _loop_idle() -> bool:
    """No other task of this trio run is waiting to run."""
    return trio.lowlevel.current_statistics().tasks_runnable == 0


def _upsert_run(
    db: sqlite3.Connection, batch: list[tuple[int, str, tuple[Any, ...]]], start: int, end: int
) -> None:
    """Upsert `batch[start:end]` in order, in statements of a power-of-two number of rows (at
    most UPSERT_ROWS_PER_STATEMENT): few distinct statements, so SQLite's statement cache keeps
    them all prepared, and at most a handful per run."""
    while start < end:
        rows = min(UPSERT_ROWS_PER_STATEMENT, 1 << ((end - start).bit_length() - 1))
        params = [value for op in batch[start : start + rows] for value in op[2]]
        db.execute(_upsert_sql(rows), params)
        start += rows


@functools.cache
def _upsert_sql(rows: int) -> str:
    """One upsert of `rows` rows. SQLite applies the VALUES in order, so a record written twice
    in one statement ends as its later row, as with one statement per row."""
    if rows == 1:
        return _UPSERT
    return _UPSERT_MANY_HEAD + ", ".join(["(?, ?, ?, ?)"] * rows) + _UPSERT_MANY_TAIL


def open_journal(kind: str, state_dir: Path | None, sync: str = "full") -> Journal:
    """`--journal memory` or `--journal sqlite` (the default for `toolwire serve`), the latter
    with `--sync full` (the default) or `normal` (see SYNC_LEVELS)."""
    if kind == "memory":
        return MemoryJournal()
    if kind != "sqlite":
        raise ValueError(f"unknown journal kind {kind!r}; use sqlite or memory")
    if state_dir is None:
        raise ValueError("the sqlite journal needs a state dir")
    return SqliteJournal(state_dir / "journal.sqlite3", sync)


def wall_ms_to_monotonic(wall_ms: int, now_wall_ms: int, now_monotonic: float) -> float:
    """Map a journaled wall-clock touch time onto this run's trio clock (for forgetting)."""
    if wall_ms <= 0:
        return -math.inf
    return now_monotonic - max(0, now_wall_ms - wall_ms) / 1000


__all__ = [
    "SYNC_LEVELS",
    "CommitBatch",
    "CommitStatements",
    "CommitWaiters",
    "Journal",
    "JournalError",
    "JournalRow",
    "MemoryJournal",
    "SqliteJournal",
    "open_journal",
    "run_commit_statements",
]
