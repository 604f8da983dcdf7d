"""`edit_files` on big files, read into the pooled buffers of actors/tools/whole_files.py: the
edits see the file's bytes and nothing else (a buffer holds an earlier, longer file's bytes past
the end), whatever the buffer's size against the file's; a failed edit gives its buffers back;
two chats editing at once never see each other's bytes. Real files; the last test through a
real server."""

from __future__ import annotations

import hashlib
import mmap
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import LiveServer
from tests.wsclient import is_result, wait_for
from toolwire.actors.buffer_pool import BufferPool
from toolwire.actors.results import Outcome, ToolReport
from toolwire.actors.tools import whole_files
from toolwire.actors.tools.files import Edit, EditFilesArgs, FileEdits, edit_files
from toolwire.actors.tools.whole_files import POOLED_MIN_BYTES, has_live_views, new_map

MIB = 1 << 20


@pytest.fixture(autouse=True)
def pool(monkeypatch: pytest.MonkeyPatch) -> BufferPool[mmap.mmap]:
    """A pool of the edits' own for each test, which keeps one buffer idle: what it holds is
    what this test's edits left."""
    fresh = BufferPool(new_map, len, has_live_views, granule=whole_files.GRANULE, max_idle=1,
                       max_idle_bytes=whole_files.IDLE_BYTES)  # fmt: skip
    monkeypatch.setattr(whole_files, "READ_BUFFERS", fresh)
    return fresh


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lines(size: int, fill: str) -> bytes:
    """`size` bytes of 64-byte lines of `fill`."""
    line = (fill * 63 + "\n").encode()
    return (line * (size // len(line) + 1))[:size]


def edit(ws: Path, path: str, *edits: Edit) -> ToolReport:
    return edit_files(str(ws), EditFilesArgs(files=[FileEdits(path=path, edits=list(edits))]))


def test_a_big_file_is_edited_in_place_of_its_bytes(
    tmp_path: Path, pool: BufferPool[mmap.mmap]
) -> None:
    data = lines(3 * MIB, "a")
    cut = len(data) // 2 // 64 * 64
    data = data[:cut] + b"MARK\n" + data[cut:]
    (tmp_path / "big.txt").write_bytes(data)
    r = edit(tmp_path, "big.txt", Edit(old="MARK\n", new="é\n"), Edit(old="é", new="done"))
    expected = data.replace(b"MARK\n", b"done\n")
    assert r.outcome is Outcome.COMPLETED, r.text
    assert r.data == {"files": [{"path": "big.txt", "replacements": 2, "sha256": sha(expected)}]}
    assert (tmp_path / "big.txt").read_bytes() == expected
    assert pool.lent() == 0


def test_an_edit_never_sees_what_a_longer_file_left_in_the_buffer(
    tmp_path: Path, pool: BufferPool[mmap.mmap]
) -> None:
    """The buffer a 3 MiB file was read into is lent for a 2 MiB file next: the 3 MiB file's
    bytes past the 2 MiB file's end must be neither found nor counted."""
    long = lines(3 * MIB, "a")
    at = 2 * MIB + 4096
    long = long[:at] + b"ONLYLONG TAIL\n" + long[at:]
    (tmp_path / "long.txt").write_bytes(long)
    short = lines(2 * MIB, "b")
    short = short[:4096] + b"TAIL\n" + short[4096:]
    (tmp_path / "short.txt").write_bytes(short)

    first = edit(tmp_path, "long.txt", Edit(old="ONLYLONG", new="onlylong"))
    assert first.outcome is Outcome.COMPLETED, first.text
    [buffer] = pool.idle_buffers()
    assert buffer[at : at + 14] == b"ONLYLONG TAIL\n"  # what the read left past 2 MiB

    missing = edit(tmp_path, "short.txt", Edit(old="ONLYLONG", new="x"))
    assert missing.outcome is Outcome.FAILED
    assert missing.text == "edit 1 of short.txt: `old` text not found; no file was changed"
    assert (tmp_path / "short.txt").read_bytes() == short

    every = edit(tmp_path, "short.txt", Edit(old="TAIL", new="T", replace_all=True))
    assert every.outcome is Outcome.COMPLETED, every.text
    assert every.data is not None and every.data["files"][0]["replacements"] == 1
    assert (tmp_path / "short.txt").read_bytes() == short.replace(b"TAIL", b"T")
    assert pool.idle_buffers() == [buffer]  # the one buffer served every read
    assert pool.lent() == 0


def test_a_file_larger_than_every_idle_buffer_gets_one_of_its_size(
    tmp_path: Path, pool: BufferPool[mmap.mmap]
) -> None:
    (tmp_path / "small.txt").write_bytes(lines(POOLED_MIN_BYTES, "s") + b"ONE\n")
    assert edit(tmp_path, "small.txt", Edit(old="ONE", new="1")).outcome is Outcome.COMPLETED
    big = lines(5 * MIB, "g") + b"END\n"
    (tmp_path / "big.txt").write_bytes(big)
    r = edit(tmp_path, "big.txt", Edit(old="END", new="end"))
    assert r.outcome is Outcome.COMPLETED, r.text
    assert (tmp_path / "big.txt").read_bytes() == big.replace(b"END", b"end")
    assert max(len(b) for b in pool.idle_buffers()) > 5 * MIB


def test_a_failed_edit_gives_its_buffers_back(tmp_path: Path, pool: BufferPool[mmap.mmap]) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_bytes(lines(2 * MIB, name) + b"X\n")
    args = EditFilesArgs(
        files=[
            FileEdits(path="a.txt", edits=[Edit(old="X", new="Y")]),
            FileEdits(path="b.txt", edits=[Edit(old="nowhere", new="Y")]),
        ]
    )
    r = edit_files(str(tmp_path), args)
    assert r.outcome is Outcome.FAILED and "no file was changed" in r.text
    assert pool.lent() == 0
    again = edit_files(str(tmp_path), EditFilesArgs(files=args.files[:1]))
    assert again.outcome is Outcome.COMPLETED, again.text
    assert (tmp_path / "a.txt").read_bytes() == lines(2 * MIB, "a") + b"Y\n"


def marker(i: int) -> str:
    return f"marker {i:06d}\n"


def call(chat: str, call_id: str, path: str, i: int) -> dict[str, Any]:
    edits = [{"old": marker(i), "new": marker(i + 1)}]
    args = {"files": [{"path": path, "edits": edits}]}
    return {"type": "call", "chat_id": chat, "call_id": call_id, "tool": "edit_files",
            "args": args}  # fmt: skip


async def test_two_chats_editing_big_files_at_once_see_only_their_own(
    live: LiveServer, pool: BufferPool[mmap.mmap]
) -> None:
    """Each chat edits its own 2 MiB file, one call after the other, both at once on worker
    threads: each result's digest and each file at the end are what that chat's edits alone
    make. A buffer lent to both, or handed back with the other's bytes, would show."""
    rounds = 6
    bodies = {chat: lines(2 * MIB, chat[0]) for chat in ("left", "right")}
    for chat, body in bodies.items():
        (live.workspace / f"{chat}.txt").write_bytes(body + marker(0).encode())

    async def chat_edits(chat: str) -> None:
        async with live.connect() as conn:
            for i in range(rounds):
                await conn.send(call(chat, f"{chat}{i}", f"{chat}.txt", i))
                result = await wait_for(conn, is_result(f"{chat}{i}"))
                expected = bodies[chat] + marker(i + 1).encode()
                assert result["outcome"] == "completed", result
                assert result["data"]["files"][0]["sha256"] == sha(expected)

    async with trio.open_nursery() as nursery:
        for chat in bodies:
            nursery.start_soon(chat_edits, chat)
    for chat, body in bodies.items():
        assert (live.workspace / f"{chat}.txt").read_bytes() == body + marker(rounds).encode()
    assert pool.lent() == 0
