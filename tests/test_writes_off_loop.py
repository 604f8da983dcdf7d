"""`write_file` and `edit_files` run on worker threads: a write that waits (for the disk, for the
kernel, for another write of its path) holds up no other chat, connection or keepalive, and its
result, and the reply to a cancel of it, still say what happened. Through a real server.

A write is held up for real, and for exactly as long as a test wants: the test takes a write
lease on the file (fcntl F_SETLEASE). The edit's open() of that file then waits in the kernel
until the lease is released, and the kernel tells the lease holder with SIGIO that someone is
waiting: the event that says "the edit is now running, inside its path's lock". No sleep, no
timing: another chat's call is answered, and the agent then says (to an `attach`) that the
held-up calls are still running; only then does the test release the lease.

On the event loop, a held-up write would stall the whole agent (this process's loop too: the
server runs in the test's nursery) until the kernel breaks the lease by itself, after
/proc/sys/fs/lease-break-time (45 s by default). The write then completes, the other chat is
answered after it, and the `attach` finds the write done: the test fails instead of hanging.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import LiveServer
from tests.wsclient import Message, RawConn, is_result, of, state_of, wait_for
from toolwire.actors.worker_priority import WORKER_NICE

SMALL = "small.txt"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def write_lease(path: Path) -> Iterator[Callable[[], None]]:
    """Hold a write lease on `path`; yields the function that releases it. Take it inside
    `trio.open_signal_receiver(signal.SIGIO)`: SIGIO's default action ends the process."""
    fd = os.open(path, os.O_WRONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)

        def release() -> None:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)

        yield release
    finally:
        with suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)


async def until_waiting(conn: RawConn, sigio: Any, call_id: str) -> None:
    """Return once the kernel says an open() of the leased file waits for the lease: the call
    is running. Fails if the call ends first (it never opened the file)."""

    async def ended() -> None:
        message = await wait_for(conn, is_result(call_id))
        pytest.fail(f"{call_id} ended without waiting for the leased file: {message}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ended)
        await sigio.__anext__()
        nursery.cancel_scope.cancel()


def call(chat_id: str, call_id: str, tool: str, args: dict[str, Any]) -> Message:
    return {"type": "call", "chat_id": chat_id, "call_id": call_id, "tool": tool, "args": args}


def edit(path: str, old: str, new: str) -> dict[str, Any]:
    return {"files": [{"path": path, "edits": [{"old": old, "new": new}]}]}


def about(conn: RawConn, call_id: str) -> list[str]:
    """The replies `conn` has received so far that end or answer for `call_id`."""
    return [
        m["type"]
        for m in conn.seen
        if m.get("call_id") == call_id and m["type"] in ("result", "cancel_result")
    ]


async def test_an_edit_stuck_in_the_kernel_leaves_other_chats_answered(live: LiveServer) -> None:
    target = live.workspace / "stuck.txt"
    target.write_bytes(b"alpha\n")
    (live.workspace / SMALL).write_text("one line\n")
    with trio.open_signal_receiver(signal.SIGIO) as sigio, write_lease(target) as release:
        async with live.connect() as conn:
            await conn.send(call("editor", "e1", "edit_files", edit("stuck.txt", "alpha", "beta")))
            await until_waiting(conn, sigio, "e1")
            # A cancel cannot stop a write half-way: its reply waits for the real result.
            await conn.send({"type": "cancel", "chat_id": "editor", "call_ids": ["e1"]})
            read = await conn.call("reader", "r1", "read_file", {"path": SMALL})
            assert read["outcome"] == "completed" and read["data"]["content"] == "one line\n"
            # Answered while the edit still waits.
            assert await state_of(conn, "editor", "e1") == "running"
            assert about(conn, "e1") == []
            release()
            result = await wait_for(conn, is_result("e1"))
            canceled = await wait_for(conn, of("cancel_result", "e1"))

    assert result["outcome"] == "completed", result
    assert result["canceled"] is False
    assert result["data"] == {"files": [{"path": "stuck.txt", "replacements": 1,
                                         "sha256": sha(b"beta\n")}]}  # fmt: skip
    assert canceled["received"] is True
    assert canceled["result"]["outcome"] == "completed"
    assert canceled["result"]["data"] == result["data"]
    assert target.read_bytes() == b"beta\n"


def thread_nices() -> dict[int, int]:
    """The nice value of each thread of this process (the live server runs in it), by id."""
    nices: dict[int, int] = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        with suppress(ProcessLookupError):  # a thread that ended meanwhile
            nices[tid] = os.getpriority(os.PRIO_PROCESS, tid)
    return nices


async def test_an_edit_runs_on_a_thread_below_the_loops_priority(live: LiveServer) -> None:
    # actors/worker_priority.py: the edit's own thread at WORKER_NICE while it runs, the loop's
    # and trio's cached workers at the process's own priority before, meanwhile and after.
    process_nice = os.getpriority(os.PRIO_PROCESS, 0)
    if process_nice >= WORKER_NICE:
        pytest.skip(f"the tests run at nice {WORKER_NICE} already: nothing to lower")
    target = live.workspace / "slow.txt"
    target.write_bytes(b"alpha\n")
    # A lowered thread of an earlier test may still be on its way out.
    lowered_before = {tid for tid, nice in thread_nices().items() if nice == WORKER_NICE}
    with trio.open_signal_receiver(signal.SIGIO) as sigio, write_lease(target) as release:
        async with live.connect() as conn:
            await conn.send(call("editor", "e1", "edit_files", edit("slow.txt", "alpha", "beta")))
            await until_waiting(conn, sigio, "e1")
            meanwhile = thread_nices()
            loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            release()
            result = await wait_for(conn, is_result("e1"))
    lowered = {tid for tid, nice in meanwhile.items() if nice == WORKER_NICE} - lowered_before
    assert len(lowered) == 1, meanwhile
    assert loop_nice == process_nice
    assert result["outcome"] == "completed", result
    cached = await trio.to_thread.run_sync(
        lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    )
    assert cached == process_nice


async def test_a_write_waiting_for_its_path_leaves_other_chats_answered(live: LiveServer) -> None:
    target = live.workspace / "shared.txt"
    target.write_bytes(b"alpha\n")
    (live.workspace / SMALL).write_text("one line\n")
    with trio.open_signal_receiver(signal.SIGIO) as sigio, write_lease(target) as release:
        async with live.connect() as conn:
            await conn.send(call("editor", "e1", "edit_files", edit("shared.txt", "alpha", "beta")))
            await until_waiting(conn, sigio, "e1")
            # The edit holds the path's lock while it waits: this write must wait for it, and
            # its precondition then sees the edit's bytes, never the ones before.
            await conn.send(
                call(
                    "writer",
                    "w1",
                    "write_file",
                    {"path": "shared.txt", "content": "gamma\n", "expected_sha256": sha(b"beta\n")},
                )
            )
            read = await conn.call("reader", "r1", "read_file", {"path": SMALL})
            assert read["outcome"] == "completed"
            # Answered while both writes still wait (the agent dispatches requests in order:
            # the write was taken before the read).
            assert await state_of(conn, "writer", "w1") == "running"
            assert await state_of(conn, "editor", "e1") == "running"
            assert about(conn, "e1") == [] and about(conn, "w1") == []
            release()
            edited = await wait_for(conn, is_result("e1"))
            written = await wait_for(conn, is_result("w1"))

    assert edited["outcome"] == "completed", edited
    assert edited["data"]["files"][0]["sha256"] == sha(b"beta\n")
    assert written["outcome"] == "completed", written
    assert written["data"] == {"bytes": 6, "sha256": sha(b"gamma\n")}
    assert target.read_bytes() == b"gamma\n"
