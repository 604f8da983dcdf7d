"""How the SQLite journal commits (issue 14): a group commit applies its changes exactly as one
statement per change would, on the loop's thread only while the loop is idle and commits are
fast, and the WAL is checkpointed between commits so that it stays small."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.commit_threads import CommitThreads
from toolwire.actors.big_writes import BIG_WRITE_BYTES, BigWrites
from toolwire.actors.journal import (
    CHECKPOINT_PAGES,
    INLINE_MAX_ROWS,
    UPSERT_ROWS_PER_STATEMENT,
    CommitBatch,
    JournalRow,
    SqliteJournal,
    run_commit_statements,
)

CHAT = "chat"


def _row(call_id: str, version: int, touched: int) -> JournalRow:
    return JournalRow(
        chat_id=CHAT, call_id=call_id, state="done", tool="read_file", fingerprint=b"f",
        args={"version": version}, touched_at_ms=touched,
    )  # fmt: skip


# A change: ("write", call_id, version), ("touch", call_id, time) or ("delete", call_id, 0).
Change = tuple[str, str, int]
Model = dict[str, tuple[int, int]]  # call_id -> (version, touched_at_ms)


def _apply_to_model(model: Model, change: Change) -> None:
    kind, call_id, value = change
    if kind == "write":
        model[call_id] = (value, value)
    elif kind == "touch" and call_id in model:
        model[call_id] = (model[call_id][0], value)
    elif kind == "delete":
        model.pop(call_id, None)


def _queue(journal: SqliteJournal, change: Change) -> None:
    kind, call_id, value = change
    if kind == "write":
        journal.write(_row(call_id, value, value))
    elif kind == "touch":
        journal.touch(CHAT, call_id, value)
    else:
        journal.delete(CHAT, call_id)


def _stored(path: Path) -> Model:
    reopened = SqliteJournal(path)
    try:
        return {row.call_id: (row.args["version"], row.touched_at_ms) for row in reopened.load()}
    finally:
        reopened.close()


async def _commit_as_one_batch(path: Path, changes: list[Change], *, on_loop: bool) -> None:
    """Queue every change before the writer task runs (so they are one batch), let it commit:
    on the loop's thread (whatever the disk's speed) or on the writer thread."""
    threads = CommitThreads()
    journal = SqliteJournal(
        path, inline_max_commit_s=float("inf") if on_loop else 0.0, commit_statements=threads
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for change in changes:
            _queue(journal, change)
        await journal.wait_durable(journal.queued_seq)
        nursery.cancel_scope.cancel()
    journal.close()
    if changes:
        one_batch_on_loop = on_loop and len(changes) <= INLINE_MAX_ROWS
        assert (threads.on_loop, threads.on_thread) == ((1, 0) if one_batch_on_loop else (0, 1))


changes_strategy = st.lists(
    st.tuples(
        # Mostly writes, so long runs of upserts (several statements of a power-of-two number
        # of rows each, the same record more than once in one statement) are common.
        st.sampled_from(["write"] * 6 + ["touch", "delete"]),
        st.sampled_from([f"call-{i}" for i in range(6)]),
        st.integers(min_value=1, max_value=10_000),
    ),
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(changes=changes_strategy, on_loop=st.booleans())
def test_one_group_commit_applies_its_changes_in_order(
    changes: list[Change], on_loop: bool
) -> None:
    model: Model = {}
    for change in changes:
        _apply_to_model(model, change)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.sqlite3"
        trio.run(lambda: _commit_as_one_batch(path, changes, on_loop=on_loop))
        assert _stored(path) == model


async def test_a_long_run_of_writes_lands_whole_and_the_later_row_wins(tmp_path: Path) -> None:
    # 3 x 256 + 231 rows: full statements, then 128 + 64 + 32 + 4 + 2 + 1; every record is
    # written several times in the run, and each keeps its last row.
    count = 3 * UPSERT_ROWS_PER_STATEMENT + 231
    changes: list[Change] = [("write", f"call-{i % 97}", i + 1) for i in range(count)]
    model: Model = {}
    for change in changes:
        _apply_to_model(model, change)
    path = tmp_path / "journal.sqlite3"
    await _commit_as_one_batch(path, changes, on_loop=False)
    assert _stored(path) == model and len(model) == 97


async def test_an_idle_loop_commits_on_its_own_thread(tmp_path: Path) -> None:
    threads = CommitThreads()
    # Idleness alone decides here: on a loaded machine a fresh WAL's first fsyncs take
    # milliseconds, and a slow disk's own rule (the next test) would send commits to the thread.
    journal = SqliteJournal(
        tmp_path / "journal.sqlite3", inline_max_commit_s=float("inf"), commit_statements=threads
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for i in range(5):
            await journal.wait_durable(journal.write(_row(f"call-{i}", i, i)))
        assert (threads.on_loop, threads.on_thread) == (5, 0)
        nursery.cancel_scope.cancel()
    journal.close()
    assert len(_stored(journal.path)) == 5


async def test_a_busy_loop_a_large_batch_or_a_slow_disk_commit_on_the_writer_thread(
    tmp_path: Path,
) -> None:
    threads = CommitThreads()
    journal = SqliteJournal(
        tmp_path / "journal.sqlite3", inline_max_commit_s=float("inf"), commit_statements=threads
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)

        # Other tasks always runnable: the loop is not idle, and commits must not block it.
        # (The check sees the tasks waiting for the next scheduling round, not those later in
        # the current one: a commit may still run on the loop now and then, never mostly.)
        async def busy() -> None:
            while True:
                await trio.lowlevel.checkpoint()

        for _ in range(20):
            nursery.start_soon(busy)
        for i in range(20):
            await journal.wait_durable(journal.write(_row(f"busy-{i}", i, i)))
        assert threads.on_thread > threads.on_loop
        nursery.cancel_scope.cancel()
    before = threads.on_thread

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for i in range(INLINE_MAX_ROWS + 1):
            journal.write(_row(f"big-{i}", i, i))
        await journal.wait_durable(journal.queued_seq)
        assert threads.on_thread == before + 1
        nursery.cancel_scope.cancel()
    journal.close()
    assert len(_stored(journal.path)) == 20 + INLINE_MAX_ROWS + 1


def _slow_disk(db: sqlite3.Connection, batch: CommitBatch) -> None:
    """A disk that takes 20 ms a commit: 20 times the journal's bound for the loop's thread,
    so one such commit lifts the average (weight 0.1) over it however fast the machine is."""
    time.sleep(0.02)
    run_commit_statements(db, batch)


async def test_a_disk_that_turns_slow_stalls_the_loop_once_then_commits_leave_it(
    tmp_path: Path,
) -> None:
    threads = CommitThreads(_slow_disk)
    journal = SqliteJournal(tmp_path / "journal.sqlite3", commit_statements=threads)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await journal.wait_durable(journal.write(_row("first", 1, 1)))
        assert (threads.on_loop, threads.on_thread) == (1, 0)  # nothing said it was slow yet
        for i in range(3):
            await journal.wait_durable(journal.write(_row(f"slow-{i}", i, i)))
        assert (threads.on_loop, threads.on_thread) == (1, 3)
        nursery.cancel_scope.cancel()
    journal.close()
    assert len(_stored(journal.path)) == 4


def test_a_negative_inline_bound_is_refused(tmp_path: Path) -> None:
    for bad in (-0.001, float("nan")):
        with pytest.raises(ValueError, match="inline_max_commit_s"):
            SqliteJournal(tmp_path / "journal.sqlite3", inline_max_commit_s=bad)
    assert not (tmp_path / "journal.sqlite3").exists()  # refused before the file is made


@pytest.mark.parametrize(
    ("parameter", "bad"),
    [
        ("write_retry_delays_s", (0.1, -0.1)),
        ("write_retry_delays_s", (float("inf"),)),
        ("write_retry_delays_s", (float("nan"),)),
        ("identity_check_min_gap_s", -0.001),
        ("identity_check_min_gap_s", float("nan")),
        ("identity_check_interval_s", 0.0),
        ("identity_check_interval_s", -1.0),
        ("identity_check_interval_s", float("nan")),
    ],
)
def test_a_bad_retry_or_identity_check_timing_is_refused_by_name(
    tmp_path: Path, parameter: str, bad: Any
) -> None:
    with pytest.raises(ValueError, match=parameter):
        SqliteJournal(tmp_path / "journal.sqlite3", **{parameter: bad})
    assert not (tmp_path / "journal.sqlite3").exists()  # refused before the file is made


@pytest.mark.parametrize("on_loop", [True, False], ids=["on-loop", "thread"])
async def test_the_wal_is_checkpointed_between_commits_and_stays_small(
    tmp_path: Path, on_loop: bool
) -> None:
    # Without checkpoints, 2,000 commits of one row each grow the WAL past 16 MB (two pages
    # or more each); SQLite's own checkpoint is off, so the journal's must keep it small.
    path = tmp_path / "journal.sqlite3"
    threads = CommitThreads()
    journal = SqliteJournal(
        path, inline_max_commit_s=float("inf") if on_loop else 0.0, commit_statements=threads
    )
    wal = Path(f"{path}-wal")
    largest = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for i in range(2_000):
            await journal.wait_durable(journal.write(_row(f"call-{i}", i, i)))
            if i % 100 == 0:
                largest = max(largest, os.stat(wal).st_size)
        nursery.cancel_scope.cancel()
    largest = max(largest, os.stat(wal).st_size)
    journal.close()
    if on_loop:  # a commit while the writer thread checkpoints goes to it, most do not
        assert threads.on_loop > threads.on_thread and threads.on_loop + threads.on_thread == 2_000
    else:
        assert (threads.on_loop, threads.on_thread) == (0, 2_000)
    page_with_header = 4096 + 24
    assert largest < 2 * CHECKPOINT_PAGES * page_with_header
    assert len(_stored(path)) == 2_000


async def test_no_commit_runs_on_the_loop_while_a_big_file_is_being_written(
    tmp_path: Path,
) -> None:
    """While a tool writes a big file its fsync makes every commit's wait (issue 26: 8 ms at
    the median, hundreds now and then), so commits leave the loop's thread for that time and
    come back once the write is done."""
    threads = CommitThreads()
    big_writes = BigWrites()
    journal = SqliteJournal(
        tmp_path / "journal.sqlite3",
        inline_max_commit_s=float("inf"),
        commit_statements=threads,
        big_writes=big_writes,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        with big_writes.writing(BIG_WRITE_BYTES):
            for i in range(3):
                await journal.wait_durable(journal.write(_row(f"during-{i}", i, i)))
        assert (threads.on_loop, threads.on_thread) == (0, 3)
        with big_writes.writing(BIG_WRITE_BYTES - 1):  # a small write: not busy
            await journal.wait_durable(journal.write(_row("small", 1, 1)))
        await journal.wait_durable(journal.write(_row("after", 1, 1)))
        assert (threads.on_loop, threads.on_thread) == (2, 3)
        nursery.cancel_scope.cancel()
    journal.close()
    assert len(_stored(journal.path)) == 5
