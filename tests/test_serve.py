"""`toolwire serve` as a real process: token handling, readiness line, clean SIGTERM shutdown."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.oswatch import alive
from tests.wsclient import connect
from toolwire.cli.serve import is_loopback

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ServeProcess:
    process: trio.Process
    url: str
    stderr_path: Path


@asynccontextmanager
async def serve(
    tmp_path: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    scheme: str = "ws",
    startup_s: float = 20,
    launcher: tuple[str, ...] = (),
) -> AsyncIterator[ServeProcess]:
    """`launcher`: what runs the interpreter (e.g. `setpriv` with its options), as given."""
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    stderr_path = tmp_path / "serve.stderr"
    full_env = {k: v for k, v in os.environ.items() if k != "TOOLWIRE_TOKEN"} | (env or {})
    full_env["PYTHONPATH"] = str(ROOT)
    state = str(tmp_path / "state")
    argv = [*launcher, sys.executable, "-m", "toolwire.cli.main", "serve", "--port", "0",
            "--workspace", str(workspace), "--state-dir", state, *extra]  # fmt: skip
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            argv, stdout=subprocess.PIPE, stderr=stderr, env=full_env, cwd=str(ROOT)
        )
    assert process.stdout is not None
    line = b""
    with trio.fail_after(startup_s):
        while not line.endswith(b"\n"):
            chunk = await process.stdout.receive_some(1)
            assert chunk, stderr_path.read_text()
            line += chunk
    text = line.decode().strip()
    assert text.startswith(f"toolwire listening on {scheme}://127.0.0.1:"), text
    try:
        yield ServeProcess(process, text.rsplit(" ", 1)[1], stderr_path)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_generated_token_is_private_and_sigterm_shuts_down_cleanly(tmp_path: Path) -> None:
    pidfile = tmp_path / "ws" / "child.pid"
    async with serve(tmp_path) as server:
        token_path = tmp_path / "state" / "token"
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_path.parent.stat().st_mode) == 0o700
        assert str(token_path) in server.stderr_path.read_text()
        token = token_path.read_text().strip()
        async with connect(server.url, token) as conn:
            command = "sleep 300 & echo $! > child.pid; echo up; wait"
            await conn.send({"type": "call", "chat_id": "c", "call_id": "long",
                             "tool": "execute", "args": {"command": command}})  # fmt: skip
            await conn.recv_until(lambda m: m["type"] == "output" and "up" in m["data"])
            child = int(pidfile.read_text())
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await conn.recv()
            assert closed.value.reason.code == 1001
        with trio.fail_after(5):  # kill_grace_ms + 1 s (PROTOCOL.md 9.3), with room for load
            code = await server.process.wait()
        assert code == 0
    assert not alive(child)  # the backgrounded grandchild was ended with its group


async def test_sigterm_saves_the_running_call_after_its_cleanup_and_a_restart_serves_it(
    tmp_path: Path,
) -> None:
    """PROTOCOL.md 9.3: the running command's group gets the kill grace (its TERM trap cleans
    up for 300 ms), the call is saved `canceled` with the shutdown's text before the agent
    exits 0, a repeat after the restart gets that saved result, and a parked gate stays
    parked."""
    marker = tmp_path / "ws" / "marker"
    command = (
        "trap 'sleep 0.3; echo cleaned > marker; exit 0' TERM; echo up; "
        "while true; do sleep 0.05; done"
    )
    call = {"type": "call", "chat_id": "c", "call_id": "long", "tool": "execute",
            "args": {"command": command}}  # fmt: skip
    gated = {"type": "call", "chat_id": "c", "call_id": "gate", "tool": "write_file",
             "args": {"path": "never", "content": "x"}, "approval": True}  # fmt: skip
    async with serve(tmp_path) as server:
        token = (tmp_path / "state" / "token").read_text().strip()
        async with connect(server.url, token) as conn:
            await conn.send(gated)
            await conn.recv_until(lambda m: m["type"] == "approval")
            await conn.send(call)
            await conn.recv_until(lambda m: m["type"] == "output" and "up" in m["data"])
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await conn.recv()
            assert closed.value.reason.code == 1001
        with trio.fail_after(10):
            assert await server.process.wait() == 0
    assert marker.read_text() == "cleaned\n"  # the cleanup had its grace
    async with serve(tmp_path) as server:
        token = (tmp_path / "state" / "token").read_text().strip()
        async with connect(server.url, token) as conn:
            await conn.send(call)
            got = await conn.recv_until(lambda m: m["type"] == "result")
            await conn.send(gated)
            again = await conn.recv_until(lambda m: m["type"] == "accepted")
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0
    result = got[-1]
    assert result["outcome"] == "canceled" and result["canceled"] is True
    assert result["text"] == "the agent shut down while the tool call was running; it was stopped"
    assert "up" in result["output"]
    assert again[-1]["state"] == "awaiting_approval"
    assert not (tmp_path / "ws" / "never").exists()


async def test_token_from_env_and_file(tmp_path: Path) -> None:
    # 128 bits at least (cli/agent_token.py): 22 characters or more of base64.
    env_token, file_token = "from-env-0123456789abcdef", "from-file-0123456789abcdef"
    async with serve(tmp_path, env={"TOOLWIRE_TOKEN": env_token}) as server:
        async with connect(server.url, env_token) as conn:
            assert conn.welcome["type"] == "welcome"
        server.process.send_signal(signal.SIGINT)
        assert await server.process.wait() == 0
    token_file = tmp_path / "tok"
    token_file.write_text(file_token + "\n")
    token_file.chmod(0o600)
    async with serve(tmp_path, "--token-file", str(token_file)) as server:
        async with connect(server.url, file_token) as conn:
            assert conn.welcome["type"] == "welcome"
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0


async def test_insecure_no_auth_says_so_loudly(tmp_path: Path) -> None:
    async with serve(tmp_path, "--insecure-no-auth") as server:
        async with connect(server.url, None) as conn:
            assert conn.welcome["type"] == "welcome"
        assert "authentication is DISABLED" in server.stderr_path.read_text()
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0


def test_only_loopback_addresses_count_as_local() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("")


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


async def test_toolwire_call_streams_output_and_exits_with_the_commands_status(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path) as server:
        state = tmp_path / "state"
        done = await _toolwire_call(
            "--url", server.url, "--state-dir", str(state), "--chat", "term",
            "execute", '{"command": "echo one; echo two >&2; exit 3"}',
        )  # fmt: skip
        assert done.returncode == 3, done.stderr
        assert done.stdout.decode() == "one\ntwo\n"
        assert "[completed] command exited with code 3" in done.stderr.decode()
        as_json = await _toolwire_call(
            "--url", server.url, "--state-dir", str(state), "--json",
            "read_file", '{"path": "missing.txt"}',
        )  # fmt: skip
        assert as_json.returncode == 1
        result = json.loads(as_json.stdout)
        assert result["outcome"] == "failed" and "missing.txt" in result["text"]
        wrong = await _toolwire_call(
            "--url", server.url, "--token", "nope", "execute", '{"command": "true"}'
        )
        assert wrong.returncode == 2 and b"401" in wrong.stderr
        bad = await _toolwire_call(
            "--url", server.url, "--state-dir", str(state), "execute", '["not", "an object"]'
        )
        assert bad.returncode != 0 and b"must be a JSON object" in bad.stderr
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0


async def test_tls_serves_wss_with_the_given_certificate(tmp_path: Path) -> None:
    """--tls-cert/--tls-key: the same protocol over wss://, verified against the certificate."""
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    await trio.run_process(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        capture_stdout=True, capture_stderr=True,
    )  # fmt: skip
    async with serve(
        tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), scheme="wss"
    ) as server:
        assert server.url.startswith("wss://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        token = (tmp_path / "state" / "token").read_text().strip()
        async with connect(server.url, token, ssl_context=context) as conn:
            result = await conn.call("c", "tls", "execute", {"command": "echo secure"})
            assert result["output"] == "secure\n"
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0
