"""End-to-end: an independent client runs execute over a real socket, both encodings."""

from __future__ import annotations

import pytest

from tests.conftest import LiveServer
from tests.wsclient import is_result


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_execute_streams_output_and_ends_in_a_result(live: LiveServer, encoding: str) -> None:
    async with live.connect(encoding=encoding) as conn:
        assert conn.welcome["encoding"] == encoding
        await conn.send(
            {
                "type": "call",
                "chat_id": "c",
                "call_id": "1",
                "tool": "execute",
                "args": {"command": "printf 'one\\n'; sleep 0.05; printf 'two\\n'"},
            }
        )
        got = await conn.recv_until(is_result("1"))
        types = [m["type"] for m in got]
        assert types[0] == "accepted" and types[1] == "started" and types[-1] == "result"
        streamed = "".join(m["data"] for m in got if m["type"] == "output")
        assert streamed == "one\ntwo\n"
        result = got[-1]
        assert result["outcome"] == "completed"
        assert result["data"]["exit_code"] == 0
        assert result["output"] == "one\ntwo\n"
