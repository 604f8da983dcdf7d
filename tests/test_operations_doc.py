"""docs/toolwire.service as written: its ExecStart (with its paths moved into a temporary
directory, and the toolwire of this checkout) starts an agent that answers the probes and the
scrape, and stops with exit 0 on the SIGTERM that `KillMode=process` sends it alone (the mode
that leaves the keeper and its commands alive when the agent's process ends, PROTOCOL.md 10.1)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.test_http_status import bearer, http_get

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "docs" / "toolwire.service"
# 32 characters of base64: 192 bits, over the 128 a token needs (cli/agent_token.py).
UNIT_TOKEN = "unit-test-token-0123456789abcdef"


def unit_settings() -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


async def test_the_unit_files_execstart_serves_probes_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    settings = unit_settings()
    assert settings["KillMode"] == "process" and settings["KillSignal"] == "SIGTERM"
    argv = shlex.split(settings["ExecStart"])
    assert argv[0].endswith("/toolwire") and argv[1] == "serve"
    moved = {
        settings["WorkingDirectory"]: tmp_path / "workspace",
        "/var/lib/" + settings["StateDirectory"]: tmp_path / "state",
        "/etc/toolwire/token": tmp_path / "token",
    }
    (tmp_path / "workspace").mkdir()
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "token").write_text(UNIT_TOKEN + "\n")
    (tmp_path / "token").chmod(0o600)  # "readable by the service user only", as the unit says
    args = [str(moved.get(arg, arg)) for arg in argv[2:]]
    args[args.index("--port") + 1] = "0"  # 7411 may be taken on a test machine
    assert not set(moved) & set(args), "the unit names a path this test does not move"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TOOLWIRE_TOKEN", None)
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "toolwire.cli.main", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=str(tmp_path / "workspace"),
        )
    try:
        assert process.stdout is not None
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1)
                assert chunk, stderr_path.read_text()
                line += chunk
        port = int(line.decode().rsplit(":", 1)[1].split("/", 1)[0])
        assert (await http_get(port, "/healthz")).body == b"ok"
        assert (await http_get(port, "/readyz")).body == b"ready"
        assert (await http_get(port, "/metrics")).status == 401
        scraped = await http_get(port, "/metrics", bearer(UNIT_TOKEN))
        names = {f.name for f in text_string_to_metric_families(scraped.body.decode())}
        assert {"toolwire_calls", "toolwire_journal_commit_seconds"} <= names
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(5):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    for log_line in stderr_path.read_text().splitlines():
        json.loads(log_line)  # --log-format json: every line one object
    assert UNIT_TOKEN not in stderr_path.read_text()
