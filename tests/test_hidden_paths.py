"""The agent's own files (its state dir: token and journal) kept from tools and from sandboxed
commands (issue 27: no command can read the agent's token), through a real `toolwire serve`;
and `visible_cover`, the Landlock rules that name everything else, on real directory trees.

Each refusal has its control: the same read of a file that is not the agent's succeeds, so a
test fails if the refusal is lost and if it spreads to what it should not touch."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_serve import ServeProcess, serve
from tests.wsclient import RawConn, connect
from toolwire.actors.hidden_paths import (
    RACY_WHOLE_SECOND_MTIME_NS,
    TEXT_HIDDEN,
    CoverCache,
    HiddenPaths,
    beneath,
    visible_cover,
)
from toolwire.actors.sandbox import MAX_MADE_CONFINEMENTS, Enforcement
from toolwire.actors.sandbox_policy import SandboxPolicy

DEADLINE_S = 30
ENFORCED = Enforcement.probe()
needs_landlock = pytest.mark.skipif(
    not (ENFORCED.filesystem and ENFORCED.network), reason="needs Landlock ABI >= 4"
)
CONFINED = {"filesystem": "workspace_write", "network": False}
READ_ONLY = {"filesystem": "read_only", "network": True}


def _token(tmp_path: Path) -> str:
    return (tmp_path / "state" / "token").read_text().strip()


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[ServeProcess]:
    async with serve(tmp_path) as process:
        yield process


@pytest.fixture
async def conn(agent: ServeProcess, tmp_path: Path) -> AsyncIterator[RawConn]:
    async with connect(agent.url, _token(tmp_path)) as c:
        yield c


async def call(conn: RawConn, call_id: str, tool: str, args: Any, **extra: Any) -> Any:
    with trio.fail_after(DEADLINE_S):
        result = await conn.call("c", call_id, tool, args, **extra)
    assert result["type"] == "result", result
    return result


def _hidden_text(path: object) -> str:
    return TEXT_HIDDEN.format(path=path)


# --- file tools, whatever the call's sandbox ---------------------------------------------------


async def test_read_file_refuses_the_token_by_any_path(conn: RawConn, tmp_path: Path) -> None:
    token_path = tmp_path / "state" / "token"
    (tmp_path / "ws" / "to-token").symlink_to(token_path)
    (tmp_path / "ws" / "to-state").symlink_to(tmp_path / "state")
    (tmp_path / "ws" / "mine.txt").write_text("mine\n")
    direct = await call(conn, "r1", "read_file", {"path": str(token_path)})
    by_link = await call(conn, "r2", "read_file", {"path": "to-token"})
    by_dir_link = await call(conn, "r3", "read_file", {"path": "to-state/token"})
    control = await call(conn, "r4", "read_file", {"path": "mine.txt"})
    for result, shown in ((direct, str(token_path)), (by_link, "to-token")):
        assert result["outcome"] == "failed" and result["text"] == _hidden_text(shown)
        assert _token(tmp_path) not in str(result)
    assert by_dir_link["outcome"] == "failed" and _token(tmp_path) not in str(by_dir_link)
    assert control["outcome"] == "completed" and control["data"]["content"] == "mine\n"


async def test_writes_into_the_state_dir_are_refused(conn: RawConn, tmp_path: Path) -> None:
    state = tmp_path / "state"
    token = _token(tmp_path)
    (tmp_path / "ws" / "to-state").symlink_to(state)
    write = await call(conn, "w1", "write_file", {"path": str(state / "new"), "content": "x"})
    by_link = await call(conn, "w2", "write_file", {"path": "to-state/token", "content": "x"})
    edit = await call(conn, "e1", "edit_files", {"files": [
        {"path": str(state / "token"), "edits": [{"old": token[:8], "new": "x"}]}]})  # fmt: skip
    control = await call(conn, "w3", "write_file", {"path": "ok.txt", "content": "x"})
    for result in (write, by_link, edit):
        assert result["outcome"] == "failed" and "the agent's own state" in result["text"], result
    assert not (state / "new").exists() and _token(tmp_path) == token
    assert control["outcome"] == "completed" and (tmp_path / "ws" / "ok.txt").read_text() == "x"


async def test_a_search_passes_the_state_dir_by(conn: RawConn, tmp_path: Path) -> None:
    token = _token(tmp_path)
    (tmp_path / "ws" / "copy.txt").write_text(f"here {token}\n")  # the control: found
    (tmp_path / "ws" / "to-token").symlink_to(tmp_path / "state" / "token")
    wide = await call(conn, "s1", "search_files", {"pattern": token, "path": str(tmp_path)})
    paths = {match["path"] for match in wide["data"]["matches"]}
    assert paths == {"copy.txt"}, wide
    assert "of the agent's own state" in wide["text"]
    named = await call(
        conn, "s2", "search_files", {"pattern": ".", "path": str(tmp_path / "state")}
    )
    assert named["outcome"] == "failed" and "the agent's own state" in named["text"]


async def test_a_listing_names_the_state_dir_but_does_not_enter_it(
    conn: RawConn, tmp_path: Path
) -> None:
    listed = await call(conn, "l1", "list_dir", {"path": str(tmp_path), "depth": 3})
    paths = {entry["path"] for entry in listed["data"]["entries"]}
    assert f"{tmp_path}/state" in paths and "." in paths  # the workspace, as it is shown
    assert not any(path.startswith(f"{tmp_path}/state/") for path in paths), paths
    assert "of the agent's own state" in listed["text"]
    inside = await call(conn, "l2", "list_dir", {"path": str(tmp_path / "state")})
    assert inside["outcome"] == "failed" and "the agent's own state" in inside["text"]


# --- commands -----------------------------------------------------------------------------------


@needs_landlock
@pytest.mark.parametrize("sandbox", [CONFINED, READ_ONLY], ids=["workspace_write", "read_only"])
async def test_a_sandboxed_command_cannot_read_or_write_the_state_dir(
    conn: RawConn, tmp_path: Path, sandbox: dict[str, Any]
) -> None:
    state = tmp_path / "state"
    token = _token(tmp_path)
    (tmp_path / "ws" / "mine.txt").write_text("mine\n")
    (tmp_path / "ws" / "to-token").symlink_to(state / "token")
    command = (
        f"cat {state}/token; echo rc=$?; cat to-token; echo rc=$?; "
        f"cat /proc/self/root{state}/token; echo rc=$?; "
        f"echo x >> {state}/token; echo rc=$?; "
        # the controls: the workspace, the system's files, the state dir's names
        f"cat mine.txt; head -c 0 /etc/passwd; echo rc=$?; ls {state} > /dev/null; echo ls=$?"
    )
    result = await call(conn, "x1", "execute", {"command": command}, sandbox=sandbox)
    output = result["output"]
    assert token not in output, output
    assert output.count("Permission denied") == 4, output
    assert output.count("rc=1") == 3 and "rc=2" in output, output  # three cats, the redirect
    assert "mine\n" in output and "rc=0" in output, output
    assert "ls=0" in output, output
    assert _token(tmp_path) == token


@needs_landlock
async def test_the_workspace_and_the_temp_dir_still_work_under_the_sandbox(
    conn: RawConn, tmp_path: Path
) -> None:
    """The state dir sits in the temp dir here (tmp_path), so the temp dir, a write root, is
    made of its other entries: what a command writes there, and reads back, still works."""
    scratch = Path(tempfile.mkdtemp(prefix="toolwire-hidden-"))
    try:
        command = (
            f"echo a > new.txt && cat new.txt && echo b > {scratch}/f && cat {scratch}/f "
            f"&& mkdir -p sub/deeper && echo c > sub/deeper/g && cat sub/deeper/g"
        )
        result = await call(conn, "x2", "execute", {"command": command}, sandbox=CONFINED)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert result["data"]["exit_code"] == 0, result["output"]
    assert result["output"] == "a\nb\nc\n"


async def test_a_command_without_a_filesystem_sandbox_can_read_it(
    conn: RawConn, tmp_path: Path
) -> None:
    """The route docs/sandbox.md names: the user's own rights. Shown, so that the test above
    cannot pass because the token is unreadable anyway."""
    token = _token(tmp_path)
    result = await call(conn, "x3", "execute", {"command": f"cat {tmp_path}/state/token"})
    assert token in result["output"]


# --- visible_cover on real trees --------------------------------------------------------------

_names = st.sampled_from(["a", "b", "c", "state", "d e"])
_trees = st.recursive(
    st.just("file"),
    lambda children: st.dictionaries(_names, children, min_size=1, max_size=4),
    max_leaves=12,
)


def _build(root: Path, tree: Any) -> list[Path]:
    """Make `tree` under `root`; return every directory made."""
    made = [root]
    for name, child in tree.items():
        path = root / name
        if child == "file":
            path.write_text(name)
        else:
            path.mkdir()
            made.extend(_build(path, child))
    return made


def _all_files(root: Path) -> list[str]:
    out = []
    for directory, dirs, files in os.walk(root):
        out.extend(os.path.join(directory, name) for name in (*files, *dirs))
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=st.dictionaries(_names, _trees, min_size=1, max_size=4), pick=st.integers(0, 50))
def test_the_cover_holds_everything_but_the_hidden(tmp_path: Path, tree: Any, pick: int) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    dirs = _build(root, tree)
    hidden_dir = dirs[pick % len(dirs)]
    outside = tmp_path / "outside.txt"
    outside.write_text("o")
    (root / "link-in").symlink_to(hidden_dir)
    (root / "link-out").symlink_to(outside)
    real_root, hidden = os.path.realpath(root), (os.path.realpath(hidden_dir),)
    cover = visible_cover(real_root, hidden)
    for path in cover:
        # nothing of the cover reaches into the hidden tree, by name or through a link
        assert not beneath(path, hidden[0]) and not beneath(hidden[0], path)
        real = os.path.realpath(path)
        assert not beneath(real, hidden[0]) and not beneath(hidden[0], real)
    for path in _all_files(root):
        covered = any(beneath(path, entry) for entry in cover)
        if beneath(path, hidden[0]) or path == str(root / "link-in"):
            assert not covered, path
        elif not beneath(hidden[0], path):
            assert covered, (path, cover)  # every other entry, but the dirs on the way


def test_the_cover_is_made_again_when_a_directory_on_the_way_changes(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "old").write_text("o")
    old = time.time_ns() - 10 * RACY_WHOLE_SECOND_MTIME_NS  # a stamp old enough to be trusted
    os.utime(tmp_path, ns=(old, old))
    cache = CoverCache()
    root, hidden = os.path.realpath(tmp_path), (os.path.realpath(tmp_path / "state"),)
    first = cache.cover(root, hidden)
    assert cache.cover(root, hidden) is first
    (tmp_path / "new").write_text("n")
    again = cache.cover(root, hidden)
    assert f"{root}/new" in again and f"{root}/new" not in first


def test_hidden_paths_resolve_links_and_know_the_files_by_identity(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "state")
    hidden = HiddenPaths.of([tmp_path / "link", tmp_path / "state"])
    assert hidden.paths == (os.path.realpath(tmp_path / "state"),)
    assert hidden.hides(os.stat(tmp_path / "state")) and not hidden.hides(os.stat(tmp_path))
    fd = os.open(tmp_path / "state", os.O_RDONLY)
    try:
        assert hidden.covers_fd(fd)
    finally:
        os.close(fd)


def _workspace_holding_the_state(
    tmp_path: Path,
) -> tuple[Path, Enforcement, HiddenPaths, SandboxPolicy]:
    """A workspace with the agent's state dir inside it, hidden, under `workspace_write`."""
    ws, temp = tmp_path / "ws", tmp_path / "tmp"
    (ws / "state").mkdir(parents=True)
    temp.mkdir()
    enforcement = Enforcement(ENFORCED.landlock, temp_dir=str(temp))
    return (
        ws,
        enforcement,
        HiddenPaths.of([ws / "state"]),
        SandboxPolicy(filesystem="workspace_write", network=True),
    )


@needs_landlock
def test_a_confinement_is_made_once_and_again_when_a_directory_on_the_way_changes(
    tmp_path: Path,
) -> None:
    """Each sandboxed spawn asks for its confinement; the same one comes back (the keeper's
    client tells the keeper each once) until a directory on the way to a hidden path changes,
    and then one that covers what is new."""
    ws, enforcement, hidden, policy = _workspace_holding_the_state(tmp_path)
    first = enforcement.confinement(policy, str(ws), hidden=hidden)
    assert first is not None
    assert enforcement.confinement(policy, str(ws), hidden=hidden) is first
    on_terminal = enforcement.confinement(policy, str(ws), hidden=hidden, terminal=True)
    assert on_terminal is not None and on_terminal != first
    (ws / "new").write_text("n")
    again = enforcement.confinement(policy, str(ws), hidden=hidden)
    assert again is not None and again is not first
    new = os.path.realpath(ws / "new")
    assert new in {path for path, _ in again.ruleset.rules}
    assert new not in {path for path, _ in first.ruleset.rules}
    assert enforcement.confinement(policy, str(ws), hidden=hidden) is again


def test_a_cover_is_kept_once_its_directories_are_old_enough(tmp_path: Path) -> None:
    """Stamps old enough to trust: the second spawn gets the very cover the first made
    (a few stats, no walk)."""
    (tmp_path / "state").mkdir()
    (tmp_path / "other").mkdir()
    old = time.time_ns() - 10 * RACY_WHOLE_SECOND_MTIME_NS
    os.utime(tmp_path, ns=(old, old))
    cache = CoverCache()
    hidden = (str(tmp_path / "state"),)
    first = cache.cover(str(tmp_path), hidden)
    assert first == (str(tmp_path / "other"),)
    assert cache.cover(str(tmp_path), hidden) is first


@needs_landlock
def test_a_file_made_within_its_directorys_mtime_tick_is_in_the_next_cover(
    tmp_path: Path,
) -> None:
    """A file system stamps a change with a coarse clock, so a file made within the tick of
    the directory's last change leaves its mtime as it was (here: set back by hand, as a tick
    of 1 s would leave it). A cover made while that stamp was young is not trusted: the next
    sandboxed spawn lists the directory again, and the new file is among its rules (a command
    can reach it), where a cover kept by its stamp would have left it out."""
    ws, enforcement, hidden, policy = _workspace_holding_the_state(tmp_path)
    # Whole seconds, as a file system of 1 s stamps gives them (the next one: a margin of at
    # least 2 s however slow this machine is between here and the second spawn).
    stamp = (time.time_ns() // 1_000_000_000 + 1) * 1_000_000_000
    os.utime(ws, ns=(stamp, stamp))
    first = enforcement.confinement(policy, str(ws), hidden=hidden)
    (ws / "new").write_text("n")
    os.utime(ws, ns=(stamp, stamp))  # the same tick: the directory's stamp did not move
    again = enforcement.confinement(policy, str(ws), hidden=hidden)
    assert first is not None and again is not None
    new = os.path.realpath(ws / "new")
    assert new not in {path for path, _ in first.ruleset.rules}
    assert new in {path for path, _ in again.ruleset.rules}


@needs_landlock
def test_the_confinements_kept_are_bounded(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    enforcement = Enforcement(ENFORCED.landlock, temp_dir=str(tmp_path))
    policies = [
        SandboxPolicy(filesystem="workspace_write", writable=(f"/w{n}",), network=True)
        for n in range(MAX_MADE_CONFINEMENTS + 1)
    ]
    made = [enforcement.confinement(policy, str(ws)) for policy in policies]
    assert enforcement.confinement(policies[-1], str(ws)) is made[-1]
    oldest = enforcement.confinement(policies[0], str(ws))
    assert oldest == made[0] and oldest is not made[0]  # let go, then made again alike
