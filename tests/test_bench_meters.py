"""The journal benchmark's instruments (issue 14): the bound that skips every commit's statements
but nothing else, and the split of a server's CPU by thread. Both measure a real journal and a
real process; a benchmark row built on them is only as true as they are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.commit_threads import CommitThreads
from toolwire.actors.journal import JournalRow, SqliteJournal, run_commit_statements
from toolwire.benchmarks.procs import CpuMeter
from toolwire.benchmarks.toolwire_server import skip_statements, skipped_commits_journal


def _row(call_id: str) -> JournalRow:
    return JournalRow(
        chat_id="chat", call_id=call_id, state="done", tool="read_file", fingerprint=b"f",
        args={}, touched_at_ms=1,
    )  # fmt: skip


def _stored_ids(path: Path) -> list[str]:
    reopened = SqliteJournal(path)
    try:
        return sorted(row.call_id for row in reopened.load())
    finally:
        reopened.close()


@pytest.mark.parametrize("on_loop", [True, False])
async def test_skipped_commits_release_their_waiters_and_write_nothing(
    tmp_path: Path, on_loop: bool
) -> None:
    paths = {kind: tmp_path / kind / "journal.sqlite3" for kind in ("real", "skipped")}
    for kind, path in paths.items():
        threads = CommitThreads(skip_statements if kind == "skipped" else run_commit_statements)
        # Every commit to the writer thread, or (whatever the disk: on a busy machine a slow
        # commit would rightly move to the thread) every commit of the idle loop on it.
        bound = float("inf") if on_loop else 0.0
        journal = SqliteJournal(path, inline_max_commit_s=bound, commit_statements=threads)
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            for i in range(3):
                await journal.wait_durable(journal.write(_row(f"call-{i}")))
            assert (threads.on_loop, threads.on_thread) == ((3, 0) if on_loop else (0, 3))
            nursery.cancel_scope.cancel()
        journal.close()
    # The same calls, the same commit path: only the real journal holds them afterwards.
    assert _stored_ids(paths["real"]) == ["call-0", "call-1", "call-2"]
    assert _stored_ids(paths["skipped"]) == []


async def test_the_benchmark_journal_skips_its_commits_and_no_more(tmp_path: Path) -> None:
    """What `toolwire_server --skip-commits` runs: waiters released, the file made, nothing
    in it."""
    path = tmp_path / "journal.sqlite3"
    journal = skipped_commits_journal(path, "normal")
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for i in range(3):
            await journal.wait_durable(journal.write(_row(f"call-{i}")))
        assert journal.failure is None
        nursery.cancel_scope.cancel()
    journal.close()
    assert path.exists()
    assert _stored_ids(path) == []


# A process whose main thread blocks on stdin while a second thread burns CPU, then parks (a
# thread that ended is no longer in /proc: the meter must see it alive).
_SPINNER = """
import sys, threading, time
def spin():
    while time.thread_time() < 0.3:
        pass
    print("spun", flush=True)
    threading.Event().wait()
print("ready", flush=True)
sys.stdin.readline()
threading.Thread(target=spin, daemon=True).start()
sys.stdin.readline()
"""


def test_the_cpu_meter_splits_a_server_by_thread() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPINNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"  # its start-up is not in the section
        meter = CpuMeter(proc.pid)
        meter.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "spun\n"
        meter.stop()
        threads = meter.server_threads
        assert threads is not None
        assert threads.others_cpu_s >= 0.25  # the spinning thread's 0.3 s (ticks: 10 ms)
        assert threads.main_cpu_s < 0.05  # blocked on stdin all along
        assert meter.server_s >= 0.25
    finally:
        proc.kill()
        proc.wait()
