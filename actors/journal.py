"""The durable record store: at most once across agent restarts.

The chat actors keep their records in memory and write every change that matters here. Writes
are queued synchronously (no `await` inside a record transition) and one writer task commits
them in groups (group commit: one transaction and one fsync for everything queued meanwhile),
on a thread of its own so SQLite never blocks the trio loop. A caller that must not act before a
change is durable (start an effect, reply with a result, confirm a cancel) hands the journal a
callback with `when_durable(seq, fn)`: the writer calls every callback a commit covers right
after that commit, on the loop, in one go (no task and no thread hop per call). A task that is
running anyway may await `wait_durable(seq)` instead; everything else goes on.

A journal that `keeps_results` is also where finished results live: once a result is durable
the chat actors drop it from the heap (an LRU keeps the recent ones, `actors/result_cache.py`)
and `read_results` reads it back, on a worker thread like the commits, when a repeat, an attach,
a cancel or a turn needs it. So memory grows with the number of records, not with their results.

`MemoryJournal` keeps nothing and is always durable: for tests, simulations and benchmarks
(`--journal memory`), and the zero-cost baseline the journal benchmark compares against. With it
the records themselves hold their results, as they must: nothing else does.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import queue
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio

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


class JournalError(Exception):
    """The journal cannot be opened or read: the agent must stop, never silently reset."""


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

    @abstractmethod
    async def wait_durable(self, seq: int) -> None: ...

    def when_durable(self, seq: int, fn: Callable[[], None]) -> None:
        """Call `fn` (synchronously, on the loop) once change `seq` is durable: right after the
        commit that covers it, together with every other callback that commit covers, or at
        once when it is durable already. Never called if the agent dies first."""
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


class _SavedResult(msgspec.Struct):
    """A journal row read for its result only: msgspec skips the other fields unread."""

    result: Result | None = None


_result_decoder = msgspec.msgpack.Decoder(_SavedResult)

_UPSERT = (
    "INSERT INTO calls (chat_id, call_id, row, touched_at_ms) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (chat_id, call_id) DO UPDATE SET row = excluded.row, "
    "touched_at_ms = excluded.touched_at_ms"
)
_TOUCH = "UPDATE calls SET touched_at_ms = ? WHERE chat_id = ? AND call_id = ?"
_DELETE = "DELETE FROM calls WHERE chat_id = ? AND call_id = ?"
_SELECT_ROW = "SELECT row FROM calls WHERE chat_id = ? AND call_id = ?"
_APPROVE_TOOL = "INSERT OR IGNORE INTO chat_approvals (chat_id, tool) VALUES (?, ?)"
_FORGET_APPROVALS = "DELETE FROM chat_approvals WHERE chat_id = ?"
_MARK_CLOSED = "INSERT OR IGNORE INTO closed_chats (chat_id, closed_at_ms) VALUES (?, ?)"
_FORGET_CLOSED = "DELETE FROM closed_chats WHERE chat_id = ?"


class SqliteJournal(Journal):
    """Records in SQLite (WAL mode) under the state dir, one row per (chat_id, call_id)."""

    keeps_results = True
    commit_durations: Durations

    def __init__(self, path: Path, sync: str = "full") -> None:
        if sync not in SYNC_LEVELS:
            raise ValueError(f"unknown sync level {sync!r}; use {' or '.join(SYNC_LEVELS)}")
        self.path = path
        self.sync = sync
        # Reads use a connection of their own: in WAL mode it sees the last commit without
        # waiting for the writer, and the writer's connection stays the writer thread's alone.
        self._reader: sqlite3.Connection | None = None
        self._read_limiter = trio.CapacityLimiter(1)
        self._ops: list[tuple[int, str, tuple[Any, ...]]] = []
        # Batches handed to the writer thread (None stops it): one at a time, taken by the
        # writer task on the loop, so a batch holds every change queued in a scheduling round.
        self._batches: queue.SimpleQueue[list[tuple[int, str, tuple[Any, ...]]] | None] = (
            queue.SimpleQueue()
        )
        self._queued_seq = 0  # sequence number of the newest queued change
        self._durable_seq = 0  # sequence number of the newest committed change
        self._committed = trio.Event()
        self._waiters = CommitWaiters()
        self._wakeup = trio.Event()
        # Set (from the writer thread, through the trio token) when a commit landed or failed:
        # one event per commit.
        self._landed = trio.Event()
        self._failed: BaseException | None = None
        self.commit_durations = Durations()
        self._db = self._open(path, sync)

    @staticmethod
    def _open(path: Path, sync: str) -> sqlite3.Connection:
        # Records hold commands, args and outputs: private to this user, like the token.
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():
            path.touch(mode=0o600)
        try:
            db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            # WAL: readers never block the writer, and a commit is one append + fsync.
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed transaction survives power loss, not only a process crash;
            # NORMAL: only a process crash (see SYNC_LEVELS).
            db.execute(f"PRAGMA synchronous={sync.upper()}")
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
        return db

    def _queue(self, sql: str, params: tuple[Any, ...]) -> int:
        if self._failed is not None:
            raise JournalError(f"journal {self.path} failed: {self._failed}") from self._failed
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
        return seq <= self._durable_seq

    async def wait_durable(self, seq: int) -> None:
        while seq > self._durable_seq:
            if self._failed is not None:
                raise JournalError(f"journal {self.path} failed: {self._failed}")
            await self._committed.wait()
        await trio.lowlevel.checkpoint()

    def when_durable(self, seq: int, fn: Callable[[], None]) -> None:
        if seq <= self._durable_seq:
            fn()
        else:
            self._waiters.add(seq, fn)

    def load(self) -> list[JournalRow]:
        try:
            rows = self._db.execute("SELECT row FROM calls").fetchall()
            return [_row_decoder.decode(blob) for (blob,) in rows]
        except (sqlite3.DatabaseError, msgspec.DecodeError) as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc

    def recover(self) -> Iterator[JournalRow]:
        # One row at a time off a cursor (SQLite sorts on disk if it must): decoding every row
        # with its result at once would leave the heap holding hundreds of megabytes of
        # freed memory after the records dropped their results (100,000 records: 283 MiB).
        try:
            for (blob,) in self._db.execute(
                "SELECT row FROM calls ORDER BY touched_at_ms, chat_id, call_id"
            ):
                yield _row_decoder.decode(blob)
        except (sqlite3.DatabaseError, msgspec.DecodeError) as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc

    async def read_results(self, keys: Sequence[tuple[str, str]]) -> list[Result | None]:
        if self._failed is not None:
            raise JournalError(f"journal {self.path} failed: {self._failed}") from self._failed
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
                    await self._wakeup.wait()
                    self._wakeup = trio.Event()
                    continue
                batch = self._ops[:MAX_BATCH]
                del self._ops[:MAX_BATCH]
                last = batch[-1][0]
                self._batches.put(batch)
                del batch  # the thread's now; not kept here while idle (megabytes of rows)
                # Not cancellable: a commit half-way would leave waiters not knowing the truth.
                with trio.CancelScope(shield=True):
                    await self._landed.wait()
                self._landed = trio.Event()
                if self._failed is not None:
                    self._committed.set()
                    raise JournalError(
                        f"journal {self.path}: write failed: {self._failed}"
                    ) from self._failed
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

    def _writer_thread(self, token: trio.lowlevel.TrioToken) -> None:
        while True:
            batch = self._batches.get()
            if batch is None:
                return
            started = time.perf_counter()
            seconds: float | None = None
            try:
                self._commit(batch)
                seconds = time.perf_counter() - started
            except sqlite3.Error as exc:
                self._failed = exc
            del batch
            try:
                token.run_sync_soon(self._on_landed, seconds)
            except trio.RunFinishedError:
                return

    def _on_landed(self, seconds: float | None) -> None:
        # On the loop: the event the writer task waits on now (it replaces it after waking),
        # and the commit's duration (None: it failed) for toolwire_journal_commit_seconds,
        # observed here so that the histogram is only ever touched from the trio thread.
        if seconds is not None:
            self.commit_durations.observe(seconds)
        self._landed.set()

    def _commit(self, batch: list[tuple[int, str, tuple[Any, ...]]]) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            # One executemany per run of the same statement: a pipelined window is mostly
            # upserts back to back, and binding them in C is several times cheaper.
            i = 0
            while i < len(batch):
                sql = batch[i][1]
                j = i + 1
                while j < len(batch) and batch[j][1] is sql:
                    j += 1
                if j == i + 1:
                    db.execute(sql, batch[i][2])
                else:
                    db.executemany(sql, [op[2] for op in batch[i:j]])
                i = j
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._db.close()


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
    "CommitWaiters",
    "Journal",
    "JournalError",
    "JournalRow",
    "MemoryJournal",
    "SqliteJournal",
    "open_journal",
]
