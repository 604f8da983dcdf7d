"""`toolwire serve --log-format json` as a real process: one JSON object per line, each call's
lines carry its ids, and nothing secret ever reaches the log."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.test_serve import serve
from tests.wsclient import connect
from toolwire.cli.logs import default_log_format
from toolwire.transport.access_control import BadOrigin, check_allowed_origin

TOKEN = "log-test-token-5f0c1d2e7a9b"  # 30 base64 characters: 180 bits
# What the command prints and what the file holds: neither may appear in the log. The command
# text itself is `printf OUTPUT-MARKER-%s 42`, so a log that showed the args would not contain
# the output marker, and one that showed the output would.
OUTPUT_MARKER = "OUTPUT-MARKER-42"
FILE_MARKER = "FILE-CONTENT-MARKER"


async def test_json_log_lines_parse_name_their_call_and_hold_no_secret(tmp_path: Path) -> None:
    async with serve(tmp_path, "--log-format", "json", env={"TOOLWIRE_TOKEN": TOKEN}) as server:
        (tmp_path / "ws" / "notes.txt").write_text(FILE_MARKER + "\n")
        async with connect(server.url, TOKEN) as conn:
            command = {"command": "printf OUTPUT-MARKER-%s 42"}
            ran = await conn.call("chat-a", "call-x", "execute", command)
            assert ran["output"] == OUTPUT_MARKER
            read = await conn.call("chat-a", "call-r", "read_file", {"path": "notes.txt"})
            assert FILE_MARKER in read["data"]["content"]
            await conn.send(
                {
                    "type": "call",
                    "chat_id": "chat-a",
                    "call_id": "call-e",
                    "tool": "nope",
                    "args": {},
                    "rid": 7,
                }
            )
            error = (await conn.recv_until(lambda m: m["type"] == "error"))[-1]
            assert error["code"] == "unknown_tool"
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0
    text = server.stderr_path.read_text()
    assert TOKEN not in text
    assert OUTPUT_MARKER not in text
    assert FILE_MARKER not in text

    lines = [json.loads(line) for line in text.splitlines()]  # every line parses
    for line in lines:
        assert {"time", "level", "event"} <= line.keys(), line

    def the(event: str, **fields: Any) -> dict[str, Any]:
        found = [
            line
            for line in lines
            if line["event"] == event and all(line.get(k) == v for k, v in fields.items())
        ]
        assert len(found) == 1, (event, fields, lines)
        return found[0]

    ran_line = the("call ended", call_id="call-x")
    assert ran_line["chat_id"] == "chat-a"
    assert (ran_line["tool"], ran_line["outcome"]) == ("execute", "completed")
    assert isinstance(ran_line["wall_ms"], int)
    assert the("call ended", call_id="call-r")["chat_id"] == "chat-a"
    error_line = the("error sent", call_id="call-e")
    assert (error_line["chat_id"], error_line["code"], error_line["rid"]) == (
        "chat-a",
        "unknown_tool",
        7,
    )
    opened = the("connection opened")
    assert opened["peer"].startswith("127.0.0.1:")
    assert opened["subprotocol"] == "toolwire.v1.json"
    closed = the("connection closed", conn=opened["conn"])
    assert (closed["peer"], closed["subprotocol"]) == (opened["peer"], "toolwire.v1.json")


async def test_text_is_the_default_only_on_a_terminal(tmp_path: Path) -> None:
    with (tmp_path / "file").open("w") as f:
        assert default_log_format(f) == "json"
    async with serve(tmp_path) as server:  # stderr is a file: JSON without being asked
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0
    lines = server.stderr_path.read_text().splitlines()
    assert lines and all(json.loads(line)["level"] for line in lines)


async def test_log_level_warning_drops_the_line_per_call(tmp_path: Path) -> None:
    async with serve(
        tmp_path, "--log-level", "warning", "--insecure-no-auth", env={"TOOLWIRE_TOKEN": TOKEN}
    ) as server:
        async with connect(server.url, None) as conn:
            assert (await conn.call("c", "x", "process_list", {}))["outcome"] == "completed"
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0
    lines = [json.loads(line) for line in server.stderr_path.read_text().splitlines()]
    assert {line["level"] for line in lines} == {"warning"}  # the no-auth warning, nothing else
    assert "authentication is DISABLED" in lines[0]["event"]


@pytest.mark.parametrize(
    "origin",
    ["https://example.com/", "example.com", "null", "https://Example.com", "ftp://x.org", ""],
)
def test_allow_origin_refuses_what_no_browser_sends(origin: str) -> None:
    with pytest.raises(BadOrigin):
        check_allowed_origin(origin)


def test_allow_origin_takes_origins_as_browsers_send_them() -> None:
    for origin in ("https://example.com", "http://127.0.0.1:3000", "https://[::1]:8443"):
        assert check_allowed_origin(origin) == origin
