"""Writes that never clobber a file that changed (PROTOCOL.md 9.4, issue 16).

`read_file` returns the SHA-256 of the whole file; `write_file` and `edit_files` accept
`expected_sha256` (a digest or "absent") and change nothing unless the file still hashes to it,
checked and renamed under one lock per canonical path. The first part drives the file-tool
functions on real files in tmp dirs, from real threads where the lock matters; the second goes
through a real server on 127.0.0.1 with the raw test client.

The race tests are the ones that catch "check and rename not under one lock": eight threads
that all expect the same digest pass a barrier at once, and the rename of one of them follows
a real fsync on the test's file system, a window in which every other writer would pass its
check if the check were not under the same lock as the rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import LiveServer
from tests.wsclient import Message
from toolwire.actors.results import Outcome, ToolReport, ToolwireError
from toolwire.actors.tools.files import (
    PATH_LOCKS,
    Edit,
    EditFilesArgs,
    FileEdits,
    ReadFileArgs,
    WriteFileArgs,
    check_write_file,
    edit_files,
    read_file,
    write_file,
)
from toolwire.actors.tools.registry import TOOLS, parse_args

# While writer threads race, the interpreter switches threads this often (the default is every
# 5 ms): a writer is then preempted anywhere, not only in a system call, so a gap of a few
# bytecodes between a check and the rename it should guard is visited too.
SWITCH_INTERVAL_S = 1e-6
# A server test that hangs fails instead of blocking the suite.
DEADLINE_S = 20.0


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def changed_text(path: str, expected: str, actual: str) -> str:
    """PROTOCOL.md 9.10's text, built from its definition rather than from the code's."""

    def short(d: str) -> str:
        return d if d == "absent" else d[:12]

    return (
        f"{path} changed since it was read (expected sha256 {short(expected)},"
        f" found {short(actual)}); no changes were made"
    )


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


def digest_of_read(ws: Path, path: str) -> str:
    r = read_file(str(ws), ReadFileArgs(path=path))
    assert r.outcome is Outcome.COMPLETED and r.data is not None, r.text
    return str(r.data["sha256"])


# --- arguments ----------------------------------------------------------------------------------

BAD_DIGESTS = ["", "abc", "ABSENT", "0" * 63, "0" * 65, "g" * 64, " " + "0" * 64, "absent\n"]


@pytest.mark.parametrize("bad", BAD_DIGESTS)
def test_a_malformed_expected_sha256_is_bad_args_naming_the_field(bad: str) -> None:
    with pytest.raises(ToolwireError) as info:
        parse_args(TOOLS["write_file"], {"path": "a", "content": "", "expected_sha256": bad})
    assert info.value.code == "bad_args"
    assert "args.expected_sha256" in info.value.message
    entry = {"path": "a", "edits": [{"old": "x", "new": "y"}]}
    with pytest.raises(ToolwireError) as info:
        parse_args(TOOLS["edit_files"], {"files": [entry, entry | {"expected_sha256": bad}]})
    assert info.value.code == "bad_args"
    assert "args.files[1].expected_sha256" in info.value.message
    # A Struct built by hand skips msgspec's pattern; its check still refuses it.
    with pytest.raises(ValueError, match=r"^args\.expected_sha256: must be 64 hex digits"):
        check_write_file(WriteFileArgs(path="a", content="", expected_sha256=bad))


def test_a_digest_in_capitals_is_the_same_digest(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"one\n")
    args = msgspec.convert(
        {"path": "a.txt", "content": "two\n", "expected_sha256": sha(b"one\n").upper()},
        WriteFileArgs,
    )
    assert write_file(str(ws), args).outcome is Outcome.COMPLETED
    assert (ws / "a.txt").read_bytes() == b"two\n"


# --- write_file ---------------------------------------------------------------------------------


def test_a_stale_write_fails_with_the_exact_text_and_changes_nothing(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"mine\n")
    seen = digest_of_read(ws, "a.txt")
    (ws / "a.txt").write_bytes(b"theirs\n")  # behind toolwire's back
    r = write_file(str(ws), WriteFileArgs(path="a.txt", content="new\n", expected_sha256=seen))
    assert r.outcome is Outcome.FAILED
    assert r.text == changed_text("a.txt", seen, sha(b"theirs\n"))
    assert r.data == {"path": "a.txt", "expected_sha256": seen, "actual_sha256": sha(b"theirs\n")}
    assert snapshot(ws) == {"a.txt": b"theirs\n"}  # no temp file left either
    # With the digest of what is there now, the write goes through and says what it wrote.
    r = write_file(
        str(ws), WriteFileArgs(path="a.txt", content="new\n", expected_sha256=sha(b"theirs\n"))
    )
    assert r.outcome is Outcome.COMPLETED, r.text
    assert r.data == {"bytes": 4, "sha256": sha(b"new\n")}
    assert digest_of_read(ws, "a.txt") == sha(b"new\n")


def test_absent_creates_a_new_file_and_refuses_an_existing_one(ws: Path) -> None:
    args = WriteFileArgs(path="sub/new.txt", content="first\n", expected_sha256="absent")
    r = write_file(str(ws), args)
    assert r.outcome is Outcome.COMPLETED, r.text
    assert (ws / "sub/new.txt").read_bytes() == b"first\n"
    r = write_file(
        str(ws), WriteFileArgs(path="sub/new.txt", content="second\n", expected_sha256="absent")
    )
    assert r.outcome is Outcome.FAILED
    assert r.text == changed_text("sub/new.txt", "absent", sha(b"first\n"))
    assert r.data == {
        "path": "sub/new.txt",
        "expected_sha256": "absent",
        "actual_sha256": sha(b"first\n"),
    }
    assert (ws / "sub/new.txt").read_bytes() == b"first\n"


def test_a_digest_for_a_missing_file_reports_absent(ws: Path) -> None:
    digest = sha(b"x")
    r = write_file(str(ws), WriteFileArgs(path="gone.txt", content="y", expected_sha256=digest))
    assert r.outcome is Outcome.FAILED
    assert r.text == changed_text("gone.txt", digest, "absent")
    assert r.data is not None and r.data["actual_sha256"] == "absent"
    assert snapshot(ws) == {}


def test_the_precondition_follows_symlinks_and_other_spellings(ws: Path) -> None:
    (ws / "real.txt").write_bytes(b"v1\n")
    (ws / "link.txt").symlink_to("real.txt")
    r = write_file(
        str(ws), WriteFileArgs(path="./link.txt", content="v2\n", expected_sha256=sha(b"v1\n"))
    )
    assert r.outcome is Outcome.COMPLETED, r.text
    assert (ws / "link.txt").is_symlink() and (ws / "real.txt").read_bytes() == b"v2\n"
    # A dangling link names a file that is absent: "absent" creates its target.
    (ws / "dangling").symlink_to("target.txt")
    r = write_file(str(ws), WriteFileArgs(path="dangling", content="t\n", expected_sha256="absent"))
    assert r.outcome is Outcome.COMPLETED, r.text
    assert (ws / "target.txt").read_bytes() == b"t\n"


def test_a_directory_fails_as_write_file_always_did(ws: Path) -> None:
    (ws / "d").mkdir()
    r = write_file(str(ws), WriteFileArgs(path="d", content="x", expected_sha256=sha(b"")))
    assert r.outcome is Outcome.FAILED and r.data is None
    assert r.text == "d is a directory; write_file works on files"


# --- edit_files ---------------------------------------------------------------------------------


def test_edit_files_with_one_stale_file_of_three_changes_no_file(ws: Path) -> None:
    for name in ("a", "b", "c"):
        (ws / f"{name}.txt").write_bytes(f"{name} v1\n".encode())
    digests = {name: digest_of_read(ws, f"{name}.txt") for name in ("a", "b", "c")}
    (ws / "b.txt").write_bytes(b"b changed\n")
    before = snapshot(ws)
    inodes = {p: (ws / p).stat().st_ino for p in before}
    entries = [
        FileEdits(
            path=f"{name}.txt",
            edits=[Edit(old="v1", new="v2")],
            expected_sha256=digests[name],
        )
        for name in ("a", "b", "c")
    ]
    r = edit_files(str(ws), EditFilesArgs(files=entries))
    assert r.outcome is Outcome.FAILED
    assert r.text == changed_text("b.txt", digests["b"], sha(b"b changed\n"))
    assert r.data == {
        "path": "b.txt",
        "expected_sha256": digests["b"],
        "actual_sha256": sha(b"b changed\n"),
    }
    assert snapshot(ws) == before
    assert {p: (ws / p).stat().st_ino for p in before} == inodes  # not even rewritten


def test_edit_files_reports_the_digest_of_each_file_as_written(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"alpha\n")
    (ws / "b.txt").write_bytes(b"beta\n")
    r = edit_files(
        str(ws),
        EditFilesArgs(
            files=[
                FileEdits(
                    path="a.txt",
                    edits=[Edit(old="alpha", new="ALPHA")],
                    expected_sha256=sha(b"alpha\n"),
                ),
                FileEdits(path="b.txt", edits=[Edit(old="beta", new="beta")]),  # no change
            ]
        ),
    )
    assert r.outcome is Outcome.COMPLETED, r.text
    assert r.data == {
        "files": [
            {"path": "a.txt", "replacements": 1, "sha256": sha(b"ALPHA\n")},
            {"path": "b.txt", "replacements": 1, "sha256": sha(b"beta\n")},
        ]
    }


def test_edit_files_with_absent_for_an_existing_file_fails(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"alpha\n")
    entry = FileEdits(path="a.txt", edits=[Edit(old="alpha", new="x")], expected_sha256="absent")
    r = edit_files(str(ws), EditFilesArgs(files=[entry]))
    assert r.text == changed_text("a.txt", "absent", sha(b"alpha\n"))
    assert (ws / "a.txt").read_bytes() == b"alpha\n"


# --- the lock table -----------------------------------------------------------------------------


def test_the_lock_table_holds_only_paths_in_use(ws: Path) -> None:
    for i in range(50):
        write_file(str(ws), WriteFileArgs(path=f"f{i}.txt", content="x"))
        write_file(str(ws), WriteFileArgs(path=f"f{i}.txt", content="y", expected_sha256="absent"))
        edit_files(
            str(ws),
            EditFilesArgs(files=[FileEdits(path=f"f{i}.txt", edits=[Edit(old="q", new="z")])]),
        )
    assert len(PATH_LOCKS) == 0


def test_two_multi_file_edits_in_opposite_orders_do_not_deadlock(ws: Path) -> None:
    """edit_files takes its locks in sorted order: a.txt then b.txt, whatever the args say."""
    (ws / "a.txt").write_bytes(b"0\n")
    (ws / "b.txt").write_bytes(b"0\n")
    rounds = 40
    errors: list[BaseException] = []

    def editor(order: tuple[str, str]) -> None:
        try:
            for _ in range(rounds):
                entries = [FileEdits(path=p, edits=[Edit(old="\n", new="+\n")]) for p in order]
                r = edit_files(str(ws), EditFilesArgs(files=entries))
                assert r.outcome is Outcome.COMPLETED, r.text
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [
        threading.Thread(target=editor, args=(order,))
        for order in (("a.txt", "b.txt"), ("b.txt", "a.txt"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # No edit was lost: each of the 2 x 40 edits appended one "+" to each file.
    assert (ws / "a.txt").read_bytes() == b"0" + b"+" * 2 * rounds + b"\n"
    assert (ws / "b.txt").read_bytes() == b"0" + b"+" * 2 * rounds + b"\n"
    assert len(PATH_LOCKS) == 0


# --- races between threads ----------------------------------------------------------------------


def run_at_once(jobs: list[Any]) -> list[ToolReport]:
    """Run each zero-argument job on its own thread, all released by one barrier."""
    barrier = threading.Barrier(len(jobs))
    reports: list[ToolReport | None] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            reports[i] = jobs[i]()
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    return [r for r in reports if r is not None]


WRITERS = 8
# Rounds of the race: a check outside the rename's lock loses it in every round, but a check
# under one hold of the lock and the rename under a second hold loses it only when another
# writer slips in between the two (a few bytecodes); 200 rounds (about 2 s) catch that too in
# most runs.
RACE_ROUNDS = 200


def test_writers_racing_on_one_digest_exactly_one_wins(ws: Path) -> None:
    """Eight threads expect the same digest: one write completes, seven fail naming the
    winner's digest, and the file holds the winner's bytes. Repeated, so that a check outside
    the rename's lock cannot slip through by luck of the scheduler."""
    (ws / "f.txt").write_bytes(b"round -1\n")
    for round_ in range(RACE_ROUNDS):
        seen = digest_of_read(ws, "f.txt")
        contents = [f"round {round_} writer {i}\n" for i in range(WRITERS)]
        reports = run_at_once(
            [
                (
                    lambda c=c, seen=seen: write_file(
                        str(ws), WriteFileArgs(path="f.txt", content=c, expected_sha256=seen)
                    )
                )
                for c in contents
            ]
        )
        outcomes = Counter(r.outcome for r in reports)
        assert outcomes == {Outcome.COMPLETED: 1, Outcome.FAILED: WRITERS - 1}, [
            r.text for r in reports
        ]
        [winner] = [
            c for c, r in zip(contents, reports, strict=True) if r.outcome is Outcome.COMPLETED
        ]
        assert (ws / "f.txt").read_text() == winner
        for r in reports:
            if r.outcome is Outcome.FAILED:
                assert r.text == changed_text("f.txt", seen, sha(winner.encode()))
    assert len(PATH_LOCKS) == 0
    assert [p.name for p in ws.iterdir()] == ["f.txt"]  # no temp file left


# Hypothesis: several writers, each expecting for each file it touches either the initial
# content or another writer's new content, all started at once. Whatever the interleaving,
# the completed writes of each file must form one chain from the initial content (each one
# expected exactly what the one before it left), ending at the file's final bytes; and every
# failed writer must have been told a digest the file really held.

FILES = ("x.txt", "y.txt", "z.txt")


def initial(name: str) -> str:
    return f"{name} initial\n"


def new_content(writer: int, name: str) -> str:
    return f"{name} by writer {writer}\n"


@st.composite
def writer_plans(draw: st.DrawFn) -> list[tuple[str, dict[str, int]]]:
    """Per writer: its tool and, per file it writes, whose content it expects (-1: initial)."""
    n = draw(st.integers(2, 6))
    plans: list[tuple[str, dict[str, int]]] = []
    for i in range(n):
        tool = draw(st.sampled_from(["write_file", "edit_files"]))
        if tool == "write_file":
            names = [draw(st.sampled_from(FILES))]
        else:
            names = draw(st.lists(st.sampled_from(FILES), min_size=1, max_size=3, unique=True))
        others = [j for j in range(-1, n) if j != i]
        plans.append((tool, {name: draw(st.sampled_from(others)) for name in names}))
    return plans


def content_expected(writer: int, name: str) -> str:
    return initial(name) if writer == -1 else new_content(writer, name)


def plan_job(ws: Path, i: int, tool: str, expects: dict[str, int]) -> Any:
    if tool == "write_file":
        [(name, whose)] = expects.items()
        args = WriteFileArgs(
            path=name,
            content=new_content(i, name),
            expected_sha256=sha(content_expected(whose, name).encode()),
        )
        return lambda: write_file(str(ws), args)
    entries = [
        FileEdits(
            path=name,
            edits=[Edit(old=content_expected(whose, name), new=new_content(i, name))],
            expected_sha256=sha(content_expected(whose, name).encode()),
        )
        for name, whose in expects.items()
    ]
    return lambda: edit_files(str(ws), EditFilesArgs(files=entries))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plans=writer_plans())
def test_concurrent_precondition_writes_never_lose_a_write(
    tmp_path: Path, plans: list[tuple[str, dict[str, int]]]
) -> None:
    ws = tmp_path / f"ws-{os.urandom(6).hex()}"
    ws.mkdir()
    for name in FILES:
        (ws / name).write_text(initial(name))
    reports = run_at_once([plan_job(ws, i, tool, ex) for i, (tool, ex) in enumerate(plans)])
    completed = {i for i, r in enumerate(reports) if r.outcome is Outcome.COMPLETED}
    for name in FILES:
        # Follow the chain: from the initial content, the one completed writer that expected it.
        state, chain = -1, []
        writers = {i for i in completed if name in plans[i][1]}
        while True:
            nxt = [i for i in writers if plans[i][1][name] == state and i not in chain]
            assert len(nxt) <= 1, f"{name}: writers {nxt} all overwrote the content of {state}"
            if not nxt:
                break
            state = nxt[0]
            chain.append(state)
        assert set(chain) == writers, f"{name}: completed writers {writers}, chain {chain}"
        assert (ws / name).read_text() == content_expected(state, name)
        held = {sha(content_expected(w, name).encode()) for w in [-1, *chain]}
        for r in reports:
            if r.outcome is Outcome.FAILED and r.data is not None and r.data["path"] == name:
                assert r.data["actual_sha256"] in held
                assert r.data["actual_sha256"] != r.data["expected_sha256"]
    for r in reports:
        assert r.outcome in (Outcome.COMPLETED, Outcome.FAILED), r
        if r.outcome is Outcome.FAILED:
            assert r.data is not None, r.text  # only ever the changed-file failure
    assert len(PATH_LOCKS) == 0


# --- through a real server ----------------------------------------------------------------------


async def call(conn: Any, chat: str, call_id: str, tool: str, args: dict[str, Any]) -> Message:
    result: Message = await conn.call(chat, call_id, tool, args)
    return result


async def test_server_read_then_stale_write_fails_and_keeps_the_outside_change(
    live: LiveServer,
) -> None:
    (live.workspace / "notes.md").write_bytes(b"# notes\n")
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            r = await call(conn, "c", "r1", "read_file", {"path": "notes.md"})
            assert r["outcome"] == "completed"
            seen = r["data"]["sha256"]
            assert seen == sha(b"# notes\n")
            (live.workspace / "notes.md").write_bytes(b"# notes\nthe user's line\n")
            r = await call(
                conn,
                "c",
                "w1",
                "write_file",
                {"path": "notes.md", "content": "# model\n", "expected_sha256": seen},
            )
            assert r["outcome"] == "failed"
            actual = sha(b"# notes\nthe user's line\n")
            assert r["text"] == changed_text("notes.md", seen, actual)
            assert r["data"] == {
                "path": "notes.md",
                "expected_sha256": seen,
                "actual_sha256": actual,
            }
            # A repeat of the same call gets the saved result; the file is untouched.
            again = await call(
                conn,
                "c",
                "w1",
                "write_file",
                {"path": "notes.md", "content": "# model\n", "expected_sha256": seen},
            )
            assert {k: again[k] for k in ("outcome", "text", "data")} == {
                k: r[k] for k in ("outcome", "text", "data")
            }
    assert (live.workspace / "notes.md").read_bytes() == b"# notes\nthe user's line\n"


async def test_server_absent_creates_then_refuses(live: LiveServer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect(encoding="msgpack") as conn:
            args = {"path": "new.txt", "content": "hello\n", "expected_sha256": "absent"}
            r = await call(conn, "c", "a1", "write_file", args)
            assert r["outcome"] == "completed"
            assert r["data"] == {"bytes": 6, "sha256": sha(b"hello\n")}
            r = await call(conn, "c", "a2", "write_file", args | {"content": "again\n"})
            assert r["outcome"] == "failed"
            assert r["text"] == changed_text("new.txt", "absent", sha(b"hello\n"))
    assert (live.workspace / "new.txt").read_bytes() == b"hello\n"


async def test_server_edit_files_with_one_stale_file_changes_none(live: LiveServer) -> None:
    for name in ("a", "b", "c"):
        (live.workspace / f"{name}.py").write_text(f"{name} = 1\n")
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            digests = {}
            for name in ("a", "b", "c"):
                r = await call(conn, "c", f"r-{name}", "read_file", {"path": f"{name}.py"})
                digests[name] = r["data"]["sha256"]
            (live.workspace / "c.py").write_text("c = 3\n")
            before = snapshot(live.workspace)
            entries = [
                {
                    "path": f"{name}.py",
                    "edits": [{"old": "= 1", "new": "= 2"}],
                    "expected_sha256": digests[name],
                }
                for name in ("a", "b", "c")
            ]
            r = await call(conn, "c", "e1", "edit_files", {"files": entries})
            assert r["outcome"] == "failed"
            assert r["text"] == changed_text("c.py", digests["c"], sha(b"c = 3\n"))
            assert r["data"]["path"] == "c.py"
            assert snapshot(live.workspace) == before
            # Fresh digests: all three are edited, each reported with its new digest.
            digests["c"] = sha(b"c = 3\n")
            entries[2] = {"path": "c.py", "edits": [{"old": "= 3", "new": "= 4"}]} | {
                "expected_sha256": digests["c"]
            }
            r = await call(conn, "c", "e2", "edit_files", {"files": entries})
            assert r["outcome"] == "completed", r["text"]
            assert [f["sha256"] for f in r["data"]["files"]] == [
                sha(b"a = 2\n"),
                sha(b"b = 2\n"),
                sha(b"c = 4\n"),
            ]


async def test_server_malformed_digest_is_bad_args(live: LiveServer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            r = await call(
                conn,
                "c",
                "b1",
                "write_file",
                {"path": "x.txt", "content": "", "expected_sha256": "deadbeef"},
            )
            assert r["type"] == "error" and r["code"] == "bad_args"
            assert "args.expected_sha256" in r["message"]
    assert not (live.workspace / "x.txt").exists()


async def test_server_eight_writers_from_four_chats_one_digest_one_winner(
    live: LiveServer,
) -> None:
    (live.workspace / "shared.txt").write_text("start\n")
    seen = sha(b"start\n")
    results: dict[str, Message] = {}
    with trio.fail_after(DEADLINE_S):
        async with (
            live.connect() as c0,
            live.connect(encoding="msgpack") as c1,
            live.connect() as c2,
            live.connect(encoding="msgpack") as c3,
        ):
            conns = [c0, c1, c2, c3]

            async def chat_writes(k: int) -> None:
                conn = conns[k]
                # Two calls per chat, sent before either result is read.
                for j in range(2):
                    await conn.send(
                        {
                            "type": "call",
                            "chat_id": f"chat-{k}",
                            "call_id": f"w{j}",
                            "tool": "write_file",
                            "args": {
                                "path": "shared.txt",
                                "content": f"chat {k} write {j}\n",
                                "expected_sha256": seen,
                            },
                        }
                    )
                while sum(1 for key in results if key.startswith(f"chat-{k}/")) < 2:
                    m = await conn.recv()
                    if m["type"] == "result":
                        results[f"{m['chat_id']}/{m['call_id']}"] = m
                    assert m["type"] != "error", m

            async with trio.open_nursery() as nursery:
                for k in range(4):
                    nursery.start_soon(chat_writes, k)
    completed = [key for key, m in results.items() if m["outcome"] == "completed"]
    assert len(results) == 8 and len(completed) == 1, {k: m["text"] for k, m in results.items()}
    [winner] = completed
    chat, call_id = winner.split("/")
    won = f"chat {chat.split('-')[1]} write {call_id[1]}\n"
    assert (live.workspace / "shared.txt").read_text() == won
    assert results[winner]["data"]["sha256"] == sha(won.encode())
    for key, m in results.items():
        if key != winner:
            assert m["outcome"] == "failed"
            assert m["text"] == changed_text("shared.txt", seen, sha(won.encode()))
            assert m["data"]["actual_sha256"] == sha(won.encode())


def test_the_published_schema_has_expected_sha256_as_the_agent_checks_it() -> None:
    schema = json.loads(
        (Path(__file__).parent.parent / "docs" / "protocol.schema.json").read_text()
    )
    tools = schema["$defs"]["ToolArgs"]["properties"]  # each self-contained (PROTOCOL 10.3)
    write_args = tools["write_file"]
    [digest] = [s for s in write_args["properties"]["expected_sha256"]["anyOf"] if "pattern" in s]
    entry = tools["edit_files"]["properties"]["files"]["items"]
    edit_entry = entry["properties"]["expected_sha256"]["anyOf"]
    assert digest in edit_entry
    # JSON Schema patterns are ECMA-262 regexes, where `^...$` spans the whole string (Python's
    # `$` would also match before a final newline): fullmatch is the faithful reading.
    for bad in BAD_DIGESTS:
        assert re.fullmatch(digest["pattern"], bad) is None, bad
        # As a JSON Schema validator reads it (search, not fullmatch): "absent\n" included.
        assert re.search(digest["pattern"], bad) is None, bad
    for good in ("absent", sha(b""), sha(b"").upper()):
        assert re.fullmatch(digest["pattern"], good) is not None
