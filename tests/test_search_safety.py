"""search_files against a careless or hostile client (issue 27, defect 1), through real servers:
a pattern or glob that makes a backtracking engine run for days neither freezes the agent nor
takes long; a cancel of a long search stops it and says so; and a search never reads a
pseudo-filesystem (/proc, /sys, ...), however it is reached.

The two freezing attacks run against `toolwire serve` as a process of its own: before the fix
its loop (and every thread of it, through the GIL) was held for days, which an in-process
server would have done to the test itself. Their `fail_after` is a hang guard, not a
measure: the claim is "answers at all", against a backtracking search of 2**40 steps.
How fast the agent answers meanwhile is a benchmark row (`toolwire bench --only abuse`).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import LiveServer
from tests.test_serve import serve
from tests.wsclient import Message, connect, is_result, of, state_of, wait_for
from toolwire.actors.tools.mounts import PseudoFilesystems

# Far more than either attack takes once fixed (milliseconds), far less than before (days),
# with room for a machine many times oversubscribed; and the same for the server's start.
HANG_GUARD_S = 60
STARTUP_S = 90


def call(chat_id: str, call_id: str, tool: str, args: dict[str, Any]) -> Message:
    return {"type": "call", "chat_id": chat_id, "call_id": call_id, "tool": tool, "args": args}


async def attack_then_read(tmp_path: Path, search_args: dict[str, Any]) -> tuple[Message, Message]:
    """Send the search in one chat, then a trivial read in another; both results."""
    async with serve(tmp_path, startup_s=STARTUP_S) as server:
        token = (tmp_path / "state" / "token").read_text().strip()
        async with connect(server.url, token) as conn:
            await conn.send(call("evil", "attack", "search_files", search_args))
            with trio.fail_after(HANG_GUARD_S):
                read = await conn.call("other", "r1", "read_file", {"path": "small.txt"})
                searched = await wait_for(conn, is_result("attack"))
    return read, searched


async def test_a_backtracking_regex_completes_and_leaves_other_chats_answered(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "small.txt").write_text("one line\n")
    # `(a+)+$` against 40 a's and a b: 2**40 ways to split the a's for a backtracking engine.
    (ws / "redos.txt").write_text("a" * 40 + "b\n")
    read, searched = await attack_then_read(tmp_path, {"pattern": "(a+)+$", "path": "redos.txt"})
    assert read["outcome"] == "completed" and read["data"]["content"] == "one line\n"
    assert searched["outcome"] == "completed", searched
    assert searched["data"] == {"matches": [], "truncated": False}
    assert searched["text"] == "found no matches for '(a+)+$' in redos.txt"


async def test_a_backtracking_glob_completes_and_leaves_other_chats_answered(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "small.txt").write_text("one line\n")
    # Each `*` may take any share of the 60 a's: about C(60, 12) = 1.4e12 tries to fail.
    (ws / ("a" * 60 + ".txt")).write_text("needle\n")
    (ws / "ab.txt").write_text("needle\n")
    glob = "*a" * 12 + "*b.txt"
    read, searched = await attack_then_read(tmp_path, {"pattern": "needle", "glob": glob})
    assert read["outcome"] == "completed"
    assert searched["outcome"] == "completed", searched
    assert searched["data"]["matches"] == [] and "matches glob" in searched["text"]


def slow_file(path: Path, size: int) -> None:
    """Lines of 200 random a's and b's: `a.{30}c` never matches them, and RE2 (no automaton
    it can cache for it) searches them at about 2 MB/s, so `size` bytes take seconds."""
    table = bytes(ord("a") if i % 2 else ord("b") for i in range(256))
    text = bytearray(random.Random(27).randbytes(size).translate(table))
    text[200::201] = b"\n" * len(text[200::201])
    path.write_bytes(bytes(text))


async def test_a_cancel_stops_a_running_search_and_says_so(live: LiveServer) -> None:
    slow_file(live.workspace / "big.txt", 16 * 1024 * 1024)  # about 9 s of searching
    async with live.connect() as conn:
        await conn.send(call("c", "s1", "search_files", {"pattern": "a.{30}c"}))
        assert await state_of(conn, "c", "s1") == "running"
        await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["s1"]})
        canceled = await wait_for(conn, of("cancel_result", "s1"))
        result = await wait_for(conn, is_result("s1"))
        # A trivial call in the same chat right after: the chat is not held by the search.
        read = await conn.call("c", "r1", "read_file", {"path": "big.txt", "limit": 1})
    assert canceled["received"] is True
    # `canceled` only if it stopped before its end: one that ended first says `completed`.
    assert canceled["result"]["outcome"] == "canceled", canceled
    assert canceled["result"]["canceled"] is True
    assert canceled["result"]["text"] == "tool call was canceled while running"
    assert (result["outcome"], result["text"]) == ("canceled", canceled["result"]["text"])
    assert read["outcome"] == "completed"


@pytest.fixture
def proc_links(live: LiveServer) -> Path:
    """A workspace holding a file that names itself like /proc's, and links into /proc."""
    ws = live.workspace
    (ws / "real.txt").write_text("Name:\treal\n")
    (ws / "status").symlink_to("/proc/self/status")  # a regular file, says stat
    (ws / "proc").symlink_to("/proc/self")  # a directory link: never followed anyway
    return ws


async def test_a_search_skips_files_linked_from_a_pseudo_filesystem(
    live: LiveServer, proc_links: Path
) -> None:
    async with live.connect() as conn:
        result = await conn.call("c", "s1", "search_files", {"pattern": "^Name:"})
    assert result["outcome"] == "completed", result
    assert result["data"]["matches"] == [{"path": "real.txt", "line": 1, "text": "Name:\treal"}]
    assert result["text"] == (
        "found 1 match in 1 file (searched 1 file in the workspace);"
        " skipped 1 file or directory on pseudo-filesystems (proc)"
    )


@pytest.mark.parametrize("path", ["/proc/self", "/proc/self/status", "status"])
async def test_a_search_of_a_pseudo_filesystem_fails_without_reading_it(
    live: LiveServer, proc_links: Path, path: str
) -> None:
    async with live.connect() as conn:
        result = await conn.call("c", "s1", "search_files", {"pattern": "^Name:", "path": path})
    assert result["outcome"] == "failed", result
    assert result["text"] == (
        f"{path} is on a proc pseudo-filesystem (kernel interfaces, not files);"
        " search_files only reads regular files of real file systems"
    )


def test_the_proc_of_this_machine_is_known_as_a_pseudo_filesystem() -> None:
    """The premise of the tests above: this machine's mount table names /proc (else they
    would pass for the wrong reason, the file being unreadable)."""
    assert PseudoFilesystems.read().fstype(os.stat("/proc/self/status").st_dev) == "proc"
    assert "Name:" in Path("/proc/self/status").read_text()


async def test_a_match_in_a_file_whose_name_is_not_utf8_reaches_the_client(
    live: LiveServer,
) -> None:
    """Its name is reported readable (U+FFFD for the byte that does not decode): a lone
    surrogate, as os.scandir gives it, cannot be encoded into any message."""
    (live.workspace / os.fsdecode(b"caf\xe9.txt")).write_text("needle\n")
    async with live.connect() as conn:
        result = await conn.call("c", "s1", "search_files", {"pattern": "needle"})
    assert result["outcome"] == "completed", result
    assert result["data"]["matches"] == [{"path": "caf\ufffd.txt", "line": 1, "text": "needle"}]
