"""The sandbox field (PROTOCOL.md 10.4) from the Python clients (trio and asyncio), from
`toolwire call --sandbox ...`, and the floor of `toolwire serve --sandbox/--sandbox-network`,
each against a real agent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.clientshells import SHELLS, Shell
from tests.conftest import start_server
from tests.test_serve import ROOT, serve
from toolwire.actors.landlock import Landlock
from toolwire.actors.sandbox import Enforcement
from toolwire.transport.client.errors import RequestError

pytestmark = pytest.mark.skipif(not Enforcement.probe().network, reason="needs Landlock ABI >= 4")


async def _toolwire_call(*argv: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TOOLWIRE_TOKEN", None)
    return await trio.run_process(
        [sys.executable, "-m", "toolwire.cli.main", "call", *argv],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
        cwd=str(ROOT),
    )


@pytest.fixture(params=sorted(SHELLS))
def shell(request: pytest.FixtureRequest) -> Shell:
    return SHELLS[request.param]()


@pytest.fixture
def outside() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="toolwire-outside-"))
    yield where
    shutil.rmtree(where, ignore_errors=True)


async def test_clients_send_the_sandbox_of_a_call_and_of_a_turn(
    shell: Shell, nursery: trio.Nursery, tmp_path: Path, outside: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    live = await start_server(nursery, workspace)
    write = {"command": f"echo x > {outside}/f"}
    confined = {"filesystem": "workspace_write", "network": False}

    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            refused = await (
                await client.call("c", "a", "execute", write, sandbox=confined)
            ).result()
            turn = await client.turn(
                "c",
                "t",
                [
                    {"call_id": "t1", "tool": "execute", "args": write, "sandbox": confined},
                    {"call_id": "t2", "tool": "write_file", "args": {"path": f"{outside}/g",
                     "content": "x"}, "sandbox": {"filesystem": "read_only"}},
                ],
            )  # fmt: skip
            results = await turn.results()
            with pytest.raises(RequestError) as conflict:
                await client.call("c", "a", "execute", write)
            allowed = await (await client.call("c", "b", "execute", write)).result()
        assert refused.data is not None and refused.data["exit_code"] != 0
        assert "Permission denied" in refused.output
        assert results[0].data is not None and results[0].data["exit_code"] != 0
        assert results[1].outcome == "failed"
        assert (
            results[1].text
            == f"{outside}/g is outside what this call may write; no changes were made"
        )
        assert conflict.value.code == "conflict"
        assert allowed.data is not None and allowed.data["exit_code"] == 0

    await shell.run(body)
    assert (outside / "f").read_text() == "x\n" and not (outside / "g").exists()


async def test_clients_raise_sandbox_unsupported(
    shell: Shell, nursery: trio.Nursery, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    live = await start_server(nursery, workspace, sandbox=Enforcement(Landlock(3)))

    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            with pytest.raises(RequestError) as refused:
                await client.call(
                    "c", "a", "execute", {"command": "touch ran"}, sandbox={"network": False}
                )
        assert refused.value.code == "sandbox_unsupported"
        assert "network false needs Landlock ABI 4" in refused.value.message

    await shell.run(body)
    assert not (workspace / "ran").exists()


async def test_toolwire_call_sandbox_and_the_serve_floor(tmp_path: Path, outside: Path) -> None:
    command = f'{{"command": "echo x > {outside}/f"}}'
    (tmp_path / "open").mkdir()
    (tmp_path / "floor").mkdir()
    async with serve(tmp_path / "open") as server:
        state = str(tmp_path / "open" / "state")
        refused = await _toolwire_call(
            "--url", server.url, "--state-dir", state, "--sandbox", "workspace_write",
            "--sandbox-network", "off", "execute", command,
        )  # fmt: skip
        assert not (outside / "f").exists()
        allowed = await _toolwire_call(
            "--url", server.url, "--state-dir", state, "execute", command
        )
        assert (outside / "f").exists()
        log = server.stderr_path.read_text()
    assert refused.returncode != 0 and b"Permission denied" in refused.stdout
    assert allowed.returncode == 0, allowed.stderr
    assert "sandbox: Landlock ABI" in log and "filesystem policies enforced" in log
    (outside / "f").unlink()
    floor = ("--sandbox", "read_only", "--sandbox-network", "off")
    async with serve(tmp_path / "floor", *floor) as server:
        state = str(tmp_path / "floor" / "state")
        loose = await _toolwire_call(
            "--url", server.url, "--state-dir", state, "--sandbox", "full", "execute", command
        )
    assert loose.returncode != 0 and b"Permission denied" in loose.stdout
    assert not (outside / "f").exists()


async def test_toolwire_call_refuses_writable_without_workspace_write(tmp_path: Path) -> None:
    done = await _toolwire_call(
        "--url", "ws://127.0.0.1:9/v1", "--token", "t", "--sandbox-writable", "/srv",
        "execute", '{"command": "true"}',
    )  # fmt: skip
    assert done.returncode == 2
    assert b"--sandbox-writable needs --sandbox workspace_write" in done.stderr
