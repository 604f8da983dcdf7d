"""PROTOCOL.md 10.4 through a real server: commands that try to get out of their sandbox, and
the same commands shown to succeed where the policy allows them (every test can fail both
ways). The target "outside" lies neither under the workspace nor under the system temp
directory (which `workspace_write` may write): a fresh directory in /var/tmp."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import LiveServer, start_server
from tests.test_serve import serve
from tests.wsclient import RawConn, connect, is_result
from toolwire.actors.landlock import Landlock
from toolwire.actors.processes import RealProcessBackend
from toolwire.actors.sandbox import Enforcement
from toolwire.actors.sandbox_policy import SandboxPolicy

DEADLINE_S = 30
ENFORCED = Enforcement.probe()
pytestmark = pytest.mark.skipif(
    not (ENFORCED.filesystem and ENFORCED.network), reason="needs Landlock ABI >= 4"
)

CONFINED = {"filesystem": "workspace_write", "network": False}
OPEN = {"filesystem": "full", "network": True}
DENIED = "Permission denied"


@pytest.fixture
def outside() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="toolwire-outside-"))
    assert not str(where).startswith(tempfile.gettempdir() + "/")
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
async def server(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[LiveServer]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    live = await start_server(nursery, workspace)
    yield live
    await live.server.shutdown()


def _has_ipv6() -> bool:
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        return False
    return True


def _token(tmp_path: Path) -> str:
    return (tmp_path / "state" / "token").read_text().strip()


async def _kill9(process: trio.Process) -> None:
    process.send_signal(signal.SIGKILL)
    await process.wait()


async def run(conn: RawConn, call_id: str, command: str, sandbox: Any) -> dict[str, Any]:
    extra = {} if sandbox is None else {"sandbox": sandbox}
    with trio.fail_after(DEADLINE_S):
        result = await conn.call("c", call_id, "execute", {"command": command}, **extra)
    assert result["type"] == "result", result
    return result


def exit_code(result: dict[str, Any]) -> int:
    code: int = result["data"]["exit_code"]
    return code


@pytest.mark.parametrize("sandbox", [CONFINED, OPEN], ids=["confined", "open"])
async def test_writes_outside_by_every_route(
    server: LiveServer, outside: Path, sandbox: dict[str, Any]
) -> None:
    (server.workspace / "link").symlink_to(outside)
    (server.workspace / "moved").write_text("m")
    (server.workspace / "linked").write_text("l")
    routes = {
        "redirect": f"echo x > {outside}/redirect",
        "python": f"python3 -c \"open('{outside}/python', 'w').write('x')\"",
        "symlink": "echo x > link/symlink",
        "proc_root": f"echo x > /proc/self/root{outside}/proc_root",
        "mv": f"mv moved {outside}/mv",
        "ln": f"ln linked {outside}/ln",
        "truncate": f"touch {outside}/truncate",
    }
    (outside / "truncate").write_text("keep")
    routes["truncate"] = f"truncate -s 0 {outside}/truncate"
    async with server.connect() as conn:
        results = {name: await run(conn, name, cmd, sandbox) for name, cmd in routes.items()}
    if sandbox is CONFINED:
        for name, result in results.items():
            assert exit_code(result) != 0, (name, result["output"])
        for name in ("redirect", "python", "symlink", "proc_root", "ln"):
            assert DENIED in results[name]["output"], (name, results[name]["output"])
            assert not (outside / name).exists(), name
        assert not (outside / "mv").exists() and (server.workspace / "moved").read_text() == "m"
        assert (outside / "truncate").read_text() == "keep"
    else:
        for name, result in results.items():
            assert exit_code(result) == 0, (name, result["output"])
        for name in ("redirect", "python", "symlink", "proc_root", "mv", "ln"):
            assert (outside / name).exists(), name
        assert not (server.workspace / "moved").exists()
        assert (outside / "truncate").read_text() == ""


async def test_workspace_temp_dir_and_writable_paths_stay_writable(
    server: LiveServer, outside: Path
) -> None:
    temp = Path(tempfile.mkdtemp(prefix="toolwire-temp-"))
    try:
        command = (
            f"echo a > inside && echo b > {temp}/t && echo c > {outside}/w && echo d > /dev/null"
        )
        async with server.connect() as conn:
            allowed = await run(conn, "w", command, {**CONFINED, "writable": [str(outside)]})
            read_only = await run(
                conn, "r", "cat inside; echo e > again", {"filesystem": "read_only"}
            )
    finally:
        shutil.rmtree(temp)
    assert exit_code(allowed) == 0, allowed["output"]
    assert (outside / "w").read_text() == "c\n"
    assert (server.workspace / "inside").read_text() == "a\n"
    # read_only: reading works, writing even the workspace does not
    assert read_only["output"].startswith("a\n") and DENIED in read_only["output"]
    assert not (server.workspace / "again").exists()


@pytest.mark.parametrize("network", [False, True])
async def test_tcp_connect_and_listen(server: LiveServer, network: bool) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    sandbox = {"network": network}
    programs = {
        "connect": f"import socket; socket.create_connection(('127.0.0.1', {port})); print('in')",
        "bind_listen": "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()",
        # never bound: the kernel would bind it itself; Landlock alone lets this through
        "listen": "import socket; s = socket.socket(); s.listen(); print(s.getsockname())",
    }
    if _has_ipv6():
        programs["listen6"] = "import socket; s = socket.socket(socket.AF_INET6); s.listen()"
    try:
        async with server.connect() as conn:
            results = {
                name: await run(conn, name, f'python3 -c "{code}"', sandbox)
                for name, code in programs.items()
            }
            udp = await run(conn, "udp", "python3 -c 'import socket; socket.socket(2, 2)'", sandbox)
    finally:
        listener.close()
    for name, result in results.items():
        if network:
            assert exit_code(result) == 0, (name, result["output"])
        else:
            assert exit_code(result) != 0, (name, result["output"])
            assert DENIED in result["output"], (name, result["output"])
    assert exit_code(udp) == 0  # UDP is not covered (docs/sandbox.md)


async def test_background_child_and_grandchild_stay_confined(
    server: LiveServer, outside: Path
) -> None:
    ws = server.workspace
    for name in ("go1", "go2", "done1", "done2"):
        os.mkfifo(ws / name)
    command = (
        f"sh -c 'read _ < go1; echo x > {outside}/child; echo rc=$? > done1' & "
        f"sh -c \"sh -c 'read _ < go2; echo x > {outside}/grandchild; echo rc=\\$? > done2' &\"; "
        "echo started"
    )
    async with server.connect() as conn:
        result = await run(conn, "bg", command, CONFINED)
        open_result = await run(conn, "bg-open", f"echo x > {outside}/open", OPEN)
    # The call has returned; only now are the children let go on.
    assert result["outcome"] == "completed" and "started" in result["output"]

    def release(go: str, done: str) -> str:
        (ws / go).write_text("go\n")
        return (ws / done).read_text()

    with trio.fail_after(DEADLINE_S):
        child = await trio.to_thread.run_sync(release, "go1", "done1")
        grandchild = await trio.to_thread.run_sync(release, "go2", "done2")
    assert child.strip() != "rc=0" and grandchild.strip() != "rc=0", (child, grandchild)
    assert not (outside / "child").exists() and not (outside / "grandchild").exists()
    assert exit_code(open_result) == 0 and (outside / "open").exists()


async def test_floor_beats_a_looser_call(
    nursery: trio.Nursery, tmp_path: Path, outside: Path
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    command = (
        f"echo x > {outside}/floor; echo fs=$?; "
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}))\"; "
        "echo net=$?"
    )
    outcomes = {}
    try:
        for floor in (SandboxPolicy("workspace_write", (), False), SandboxPolicy()):
            workspace = tmp_path / f"ws-{floor.filesystem}"
            workspace.mkdir()
            live = await start_server(nursery, workspace, sandbox_floor=floor)
            target = str(outside / f"file-{floor.filesystem}")
            async with live.connect() as conn:
                result = await run(conn, "loose", command, OPEN)
                written = await conn.call(
                    "c", "w", "write_file", {"path": target, "content": "x"}, sandbox=OPEN
                )
            outcomes[floor.filesystem] = (result["output"], written["outcome"])
            await live.server.shutdown()
    finally:
        listener.close()
    floored, written = outcomes["workspace_write"]
    assert "fs=0" not in floored and "net=0" not in floored and written == "failed"
    assert not (outside / "file-workspace_write").exists()
    unfloored, written = outcomes["full"]
    assert "fs=0" in unfloored and "net=0" in unfloored and written == "completed"


@pytest.mark.parametrize("policy", ["workspace_write", "read_only", "full"])
async def test_file_tools_obey_the_filesystem_point(
    server: LiveServer, outside: Path, policy: str
) -> None:
    ws = server.workspace
    for name in ("target", "linked", "written"):
        (outside / name).write_text("old")
    (ws / "mine").write_text("old")
    (ws / "link").symlink_to(outside / "linked")
    (ws / "link2").symlink_to(outside / "written")
    sandbox = {"filesystem": policy}
    edit = {"old": "old", "new": "new"}
    calls: dict[str, tuple[str, dict[str, Any]]] = {
        "edit_out": ("edit_files", {"files": [{"path": str(outside / "target"), "edits": [edit]}]}),
        "edit_both": (
            "edit_files",
            {"files": [{"path": "mine", "edits": [edit]}, {"path": "link", "edits": [edit]}]},
        ),
        "write_out": ("write_file", {"path": str(outside / "new"), "content": "x"}),
        "write_link": ("write_file", {"path": "link2", "content": "x"}),
        "write_in": ("write_file", {"path": "in", "content": "x"}),
        "read_out": ("read_file", {"path": str(outside / "target")}),
    }
    async with server.connect() as conn:
        results = {
            name: await conn.call("c", name, tool, args, sandbox=sandbox)
            for name, (tool, args) in calls.items()
        }
    assert results["read_out"]["outcome"] == "completed"  # reading is never refused
    outside_calls = {"write_out": str(outside / "new"), "write_link": "link2"}
    # the text names the first path it may not write: under read_only, the workspace's too
    first = "mine" if policy == "read_only" else "link"
    outside_calls |= {"edit_out": str(outside / "target"), "edit_both": first}
    if policy == "full":
        for name in ["write_out", "write_link", "edit_out", "edit_both", "write_in"]:
            assert results[name]["outcome"] == "completed", (name, results[name]["text"])
        assert (outside / "new").exists() and (outside / "written").read_text() == "x"
        assert (outside / "target").read_text() == (outside / "linked").read_text() == "new"
        return
    for name, path in outside_calls.items():
        result = results[name]
        assert result["outcome"] == "failed", (name, result)
        assert result["text"] == f"{path} is outside what this call may write; no changes were made"
    for name in ("target", "linked", "written"):
        assert (outside / name).read_text() == "old", name
    assert not (outside / "new").exists()
    assert (ws / "mine").read_text() == "old"  # all or nothing
    assert results["write_in"]["outcome"] == (
        "completed" if policy == "workspace_write" else "failed"
    )


async def test_sandbox_is_part_of_the_call_id(server: LiveServer) -> None:
    args = {"command": "echo once >> marker"}
    async with server.connect() as conn:
        first = await conn.call("c", "k", "execute", args, sandbox=CONFINED)
        other = await conn.call("c", "k", "execute", args, sandbox={"filesystem": "read_only"})
        none = await conn.call("c", "k", "execute", args)
        again = await conn.call("c", "k", "execute", args, sandbox=dict(reversed(CONFINED.items())))
        plain = await conn.call("c", "p", "execute", args)
        default = await conn.call("c", "p", "execute", args, sandbox=OPEN | {"writable": []})
    assert first["outcome"] == "completed"
    for error in (other, none):
        assert error["type"] == "error" and error["code"] == "conflict", error
    assert again["type"] == "result" and again["output"] == first["output"]
    # Naming the default sandbox is the same call as naming none.
    assert plain["type"] == "result" and default["type"] == "result"
    assert (server.workspace / "marker").read_text() == "once\nonce\n"


async def test_welcome_says_what_is_enforced(server: LiveServer) -> None:
    async with server.connect() as conn:
        welcome = conn.welcome
    assert welcome["limits"]["sandbox"] == {"filesystem": True, "network": True}
    assert "sandbox" in welcome["features"]


@pytest.mark.parametrize(
    ("abi", "limits"),
    [(0, (False, False)), (2, (False, False)), (3, (True, False)), (4, (True, True))],
)
async def test_an_older_kernel_refuses_what_it_cannot_enforce(
    nursery: trio.Nursery, tmp_path: Path, abi: int, limits: tuple[bool, bool]
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    live = await start_server(nursery, workspace, sandbox=Enforcement(Landlock(abi)))
    asks = {
        "fs": {"filesystem": "workspace_write"},
        "net": {"network": False},
        "plain": {"filesystem": "full"},
    }
    async with live.connect() as conn:
        welcome = conn.welcome
        replies = {
            name: await conn.call(
                "c", name, "execute", {"command": f"echo {name} >> ran"}, sandbox=s
            )
            for name, s in asks.items()
        }
        turn_id = "t"
        await conn.send(
            {
                "type": "turn",
                "chat_id": "c",
                "turn_id": turn_id,
                "calls": [
                    {"call_id": "t1", "tool": "execute", "args": {"command": "echo t1 >> ran"}},
                    {
                        "call_id": "t2",
                        "tool": "execute",
                        "args": {"command": "echo t2 >> ran"},
                        "sandbox": asks["net"],
                    },
                ],
            }
        )
        turn_reply = (await conn.recv_until(lambda m: m["type"] in ("turn_result", "error")))[-1]
    await live.server.shutdown()
    filesystem, network = limits
    assert welcome["limits"]["sandbox"] == {"filesystem": filesystem, "network": network}
    assert ("sandbox" in welcome["features"]) == (filesystem or network)
    ran = (workspace / "ran").read_text().split() if (workspace / "ran").exists() else []
    for name, enforceable in (("fs", filesystem), ("net", network), ("plain", True)):
        reply = replies[name]
        if enforceable:
            assert reply["type"] == "result" and reply["outcome"] == "completed", reply
            assert name in ran
        else:
            assert reply["type"] == "error" and reply["code"] == "sandbox_unsupported", reply
            assert "Landlock ABI" in reply["message"] and name not in ran
    if network:
        assert turn_reply["type"] == "turn_result"
    else:
        # the whole turn is refused before any of its calls ran
        assert turn_reply["type"] == "error" and turn_reply["code"] == "sandbox_unsupported"
        assert "t1" not in ran and "t2" not in ran


@pytest.mark.parametrize("sandbox", [CONFINED, OPEN], ids=["confined", "open"])
async def test_a_command_on_a_terminal_is_confined_and_still_writes_its_terminal(
    server: LiveServer, outside: Path, sandbox: dict[str, Any]
) -> None:
    command = f"echo term > /dev/tty; echo x > {outside}/pty; echo rc=$?"
    async with server.connect() as conn:
        with trio.fail_after(DEADLINE_S):
            result = await conn.call(
                "c", "pty", "execute", {"command": command, "pty": {"rows": 24, "cols": 80}},
                sandbox=sandbox,
            )  # fmt: skip
    assert "term\r\n" in result["output"], result["output"]
    if sandbox is CONFINED:
        assert "rc=0" not in result["output"] and not (outside / "pty").exists()
    else:
        assert "rc=0" in result["output"] and (outside / "pty").exists()


async def test_a_command_without_a_terminal_cannot_write_anyone_elses(server: LiveServer) -> None:
    master, slave = os.openpty()  # another terminal of this user (the test's own)
    try:
        command = f"echo x > {os.ttyname(slave)}"
        async with server.connect() as conn:
            confined = await run(conn, "tty-c", command, CONFINED)
            plain = await run(conn, "tty-o", command, OPEN)
        got = os.read(master, 100)
    finally:
        os.close(master)
        os.close(slave)
    assert exit_code(confined) != 0 and DENIED in confined["output"]
    assert exit_code(plain) == 0, plain["output"]
    assert got == b"x\r\n"  # only the open command's line arrived


async def test_a_parked_gate_keeps_its_sandbox_across_a_kill9(
    tmp_path: Path, outside: Path
) -> None:
    command = f"echo ran >> runs.txt; echo x > {outside}/after; echo rc=$?"
    args = {"command": command}
    async with serve(tmp_path) as agent:
        async with connect(agent.url, _token(tmp_path)) as conn:
            await conn.send({"type": "call", "chat_id": "c", "call_id": "g", "tool": "execute",
                             "args": args, "approval": True, "sandbox": CONFINED})  # fmt: skip
            await conn.recv_until(lambda m: m["type"] == "approval")
            # a cancel's reply is sent once its row is durable, and commits are in order
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["other"]})
            await conn.recv_until(lambda m: m["type"] == "cancel_result")
        await _kill9(agent.process)
    async with serve(tmp_path) as agent, connect(agent.url, _token(tmp_path)) as conn:
        with trio.fail_after(DEADLINE_S):
            # still the same call: the sandbox came back with it
            await conn.send({"type": "call", "chat_id": "c", "call_id": "g", "tool": "execute",
                             "args": args, "approval": True, "sandbox": CONFINED})  # fmt: skip
            accepted = (await conn.recv_until(lambda m: m["type"] in ("accepted", "error")))[-1]
            await conn.send({"type": "approve", "chat_id": "c", "call_id": "g", "approved": True})
            result = (await conn.recv_until(is_result("g")))[-1]
    assert accepted["type"] == "accepted" and accepted["state"] == "awaiting_approval"
    assert (tmp_path / "ws" / "runs.txt").read_text() == "ran\n"
    assert "rc=0" not in result["output"] and not (outside / "after").exists()


@pytest.mark.parametrize("sandbox", [CONFINED, OPEN], ids=["confined", "open"])
async def test_the_popen_path_is_confined_alike(
    nursery: trio.Nursery, tmp_path: Path, outside: Path, sandbox: dict[str, Any]
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    live = await start_server(nursery, workspace, backend=RealProcessBackend(posix_spawn=False))
    async with live.connect() as conn:
        result = await run(conn, "popen", f"echo x > {outside}/popen", sandbox)
    await live.server.shutdown()
    assert (exit_code(result) == 0) == (sandbox is OPEN), result["output"]
    assert (outside / "popen").exists() == (sandbox is OPEN)


# Dropping every capability (as root: the bounding set, inheritable and ambient sets emptied,
# no_new_privs set) leaves a process the kernel treats as unprivileged for Landlock: no
# CAP_SYS_ADMIN, so landlock_restrict_self works only because of no_new_privs, exactly as for
# a non-root user. (A real other uid would need the interpreter and the test's virtualenv
# readable by it; here they sit under 0700 directories.)
_UNPRIVILEGED = (
    ("setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs")
    if os.geteuid() == 0
    else ()
)


def _effective_caps(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no CapEff in /proc/{pid}/status")


@pytest.mark.skipif(
    bool(_UNPRIVILEGED) and shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"
)
async def test_an_agent_without_any_privilege_confines_its_commands_alike(
    tmp_path: Path, outside: Path
) -> None:
    """The sandbox needs no root, no capability and no setuid helper: an agent with none
    (run under setpriv when the suite runs as root; as is otherwise) confines a command, and
    the same command unconfined writes where the confined one could not."""
    async with serve(tmp_path, launcher=_UNPRIVILEGED) as agent:
        assert _effective_caps(agent.process.pid) == 0
        async with connect(agent.url, _token(tmp_path)) as conn:
            confined = await run(conn, "in", f"echo x > {outside}/confined", CONFINED)
            inside = await run(conn, "ws", "echo x > inside && cat inside", CONFINED)
            unconfined = await run(conn, "out", f"echo x > {outside}/open", OPEN)
    assert exit_code(confined) != 0 and DENIED in confined["output"], confined
    assert not (outside / "confined").exists()
    assert exit_code(inside) == 0 and inside["output"] == "x\n", inside
    assert exit_code(unconfined) == 0 and (outside / "open").read_text() == "x\n", unconfined
