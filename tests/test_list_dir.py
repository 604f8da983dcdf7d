"""`list_dir` (PROTOCOL.md 10.5): through a real agent over a real socket, on real trees in a
temporary directory, and its bounds on the function itself."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import LiveServer
from tests.wsclient import Message, RawConn, wait_for
from toolwire.actors.results import Outcome
from toolwire.actors.tools import list_dir as list_dir_tool
from toolwire.actors.tools.list_dir import MAX_ENTRIES, ListDirArgs, list_dir

TEST_DEADLINE_S = 20.0
CHAT = "ld"


def tree(ws: Path) -> None:
    """ws/: a.txt (3 bytes), b/ (c.py, d/e.md), link -> b, dangling -> nowhere, .git/x, fifo"""
    (ws / "a.txt").write_text("abc")
    (ws / "b" / "d").mkdir(parents=True)
    (ws / "b" / "c.py").write_text("print()\n")
    (ws / "b" / "d" / "e.md").write_text("# e\n")
    (ws / "link").symlink_to("b", target_is_directory=True)
    (ws / "dangling").symlink_to("nowhere")
    (ws / ".git").mkdir()
    (ws / ".git" / "x").write_text("object")
    os.mkfifo(ws / "fifo")


async def list_call(conn: RawConn, call_id: str, **args: Any) -> Message:
    return await conn.call(CHAT, call_id, "list_dir", args)


def listed(result: Message) -> list[tuple[str, str]]:
    return [(e["path"], e["type"]) for e in result["data"]["entries"]]


async def test_depth_one_lists_the_workspace_sorted_without_following_links(
    live: LiveServer,
) -> None:
    tree(live.workspace)
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            assert "list_dir" in conn.welcome["tools"]
            assert "list_dir" in conn.welcome["features"]
            result = await list_call(conn, "l1")
    assert result["outcome"] == "completed", result
    assert listed(result) == [
        (".git", "dir"),
        ("a.txt", "file"),
        ("b", "dir"),
        ("dangling", "symlink"),
        ("fifo", "other"),
        ("link", "symlink"),
    ]
    [a_txt] = [e for e in result["data"]["entries"] if e["path"] == "a.txt"]
    st = (live.workspace / "a.txt").stat()
    assert a_txt == {
        "path": "a.txt",
        "type": "file",
        "size": 3,
        "mtime_ms": st.st_mtime_ns // 10**6,
    }
    assert result["data"]["truncated"] is False and result["data"]["visited_all"] is True


async def test_depth_and_glob_go_down_but_never_into_links_or_vcs_dirs(live: LiveServer) -> None:
    tree(live.workspace)
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            deep = await list_call(conn, "l1", depth=8)
            py = await list_call(conn, "l2", depth=3, glob="*.py")
            md = await list_call(conn, "l4", depth=3, glob="b/**/*.md")
            sub = await list_call(conn, "l3", path="b", depth=2)
    assert listed(deep) == [
        (".git", "dir"),  # listed, not entered
        ("a.txt", "file"),
        ("b", "dir"),
        ("b/c.py", "file"),
        ("b/d", "dir"),
        ("b/d/e.md", "file"),
        ("dangling", "symlink"),
        ("fifo", "other"),
        ("link", "symlink"),  # not followed: nothing under link/
    ]
    assert listed(py) == [("b/c.py", "file")]
    assert listed(md) == [("b/d/e.md", "file")]
    # Paths stay relative to the workspace, as search_files reports them.
    assert listed(sub) == [("b/c.py", "file"), ("b/d", "dir"), ("b/d/e.md", "file")]


async def test_a_missing_path_a_file_and_a_pseudo_filesystem_fail(live: LiveServer) -> None:
    tree(live.workspace)
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            missing = await list_call(conn, "m", path="nope")
            a_file = await list_call(conn, "f", path="a.txt")
            proc = await list_call(conn, "p", path="/proc/self")
    assert (missing["outcome"], missing["text"]) == ("failed", "nope does not exist")
    assert a_file["outcome"] == "failed"
    assert a_file["text"] == "a.txt is not a directory: read_file reads a file"
    assert proc["outcome"] == "failed" and "proc pseudo-filesystem" in proc["text"]


async def test_bad_args_name_the_field(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            deep = await list_call(conn, "d", depth=9)
            zero = await list_call(conn, "z", depth=0)
            typo = await list_call(conn, "t", dept=2)
    for error in (deep, zero, typo):
        assert error["type"] == "error" and error["code"] == "bad_args", error
    assert "args.depth" in deep["message"] and "args.depth" in zero["message"]
    assert typo["message"] == (
        "list_dir: `args.dept` is not an argument of this tool (it takes: path, depth, glob)"
    )


async def test_more_than_a_thousand_entries_keeps_the_first_by_path(live: LiveServer) -> None:
    names = [f"f{i:05d}" for i in range(MAX_ENTRIES + 234)]
    for name in reversed(names):
        (live.workspace / name).touch()
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await list_call(conn, "many")
    assert [e["path"] for e in result["data"]["entries"]] == names[:MAX_ENTRIES]
    assert result["data"]["truncated"] is True and result["data"]["visited_all"] is True
    assert f"{len(names)} matched, the first {MAX_ENTRIES} by path are listed" in result["text"]


async def test_in_a_turn_it_is_a_reader_of_its_path(live: LiveServer) -> None:
    tree(live.workspace)
    (live.workspace / "elsewhere").mkdir()
    calls = [
        {"call_id": "l1", "tool": "list_dir", "args": {"path": "b"}},
        {"call_id": "r1", "tool": "read_file", "args": {"path": "b/c.py"}},
        {"call_id": "w1", "tool": "write_file", "args": {"path": "elsewhere/x", "content": ""}},
        {"call_id": "w2", "tool": "write_file", "args": {"path": "b/new.txt", "content": "n"}},
        {"call_id": "l2", "tool": "list_dir", "args": {}},  # the workspace: holds w2's file
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send({"type": "turn", "chat_id": CHAT, "turn_id": "t", "calls": calls})
            done = await wait_for(conn, lambda m: m["type"] == "turn_result")
    [plan] = [m for m in conn.seen if m["type"] == "turn_plan"]
    assert plan["segments"] == [["l1", "r1", "w1"], ["w2"], ["l2"]]
    last = done["results"][-1]
    assert ("b", "dir") in listed(last)


# --- its bounds, on the function ------------------------------------------------------------------


def test_the_walk_stops_after_its_cap_of_visited_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(50):
        (tmp_path / f"e{i:02d}").touch()
    monkeypatch.setattr(list_dir_tool, "MAX_VISITED", 20)
    report = list_dir(str(tmp_path), ListDirArgs())
    assert report.outcome is Outcome.COMPLETED
    assert report.data is not None
    assert len(report.data["entries"]) == 20
    assert report.data["visited_all"] is False and report.data["truncated"] is True
    assert "stopped after visiting 20 entries, so more may exist" in report.text


def test_memory_stays_bounded_by_the_entries_kept(tmp_path: Path) -> None:
    """A directory of many entries: what the walk holds at its peak is the kept heap, not the
    directory (entries are streamed from the directory, never read into a list)."""
    for i in range(20_000):
        (tmp_path / f"n{i:06d}-{'x' * 40}").touch()
    tracemalloc.start()
    try:
        report = list_dir(str(tmp_path), ListDirArgs())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.data is not None and len(report.data["entries"]) == MAX_ENTRIES
    # 1,000 entries of about 400 bytes each, and slack; 20,000 would be ten times this.
    assert peak < 2_000_000, peak
