"""Plain HTTP on the WebSocket's port (PROTOCOL.md 9.7) and the Origin check (9.8), through a
real server on 127.0.0.1 and a real HTTP client (h11 over a trio socket)."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

import h11
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.conftest import TOKEN, LiveServer
from tests.test_serve import serve
from tests.wsclient import connect, of, wait_for
from toolwire.actors.agent import RECOVERY_YIELD_ROWS, Agent, AgentContext
from toolwire.actors.journal import JournalRow, SqliteJournal
from toolwire.actors.records import args_fingerprint
from toolwire.actors.results import Outcome, Result
from toolwire.transport.server import Server, ServerConfig


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


async def http_get(
    port: int, path: str, headers: list[tuple[str, str]] | None = None, method: str = "GET"
) -> Response:
    """One HTTP/1.1 request on a connection of its own, read to its end."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        client = h11.Connection(h11.CLIENT)
        request = h11.Request(
            method=method, target=path, headers=[("Host", "127.0.0.1"), *(headers or [])]
        )
        await stream.send_all(client.send(request) + client.send(h11.EndOfMessage()))
        response: h11.Response | None = None
        body = b""
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
    assert response is not None
    return Response(response.status_code, dict(response.headers), body)


def bearer(token: str = TOKEN) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {token}")]


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(port: int, token: str = TOKEN) -> Samples:
    """Every sample of /metrics, parsed by prometheus_client's own parser."""
    response = await http_get(port, "/metrics", bearer(token))
    assert response.status == 200, response.body
    assert response.headers[b"content-type"].startswith(b"text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.body.decode()):
        assert family.documentation, f"{family.name} has no help text"
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def test_probes_metrics_and_unknown_paths(live: LiveServer) -> None:
    port = port_of(live.url)
    health = await http_get(port, "/healthz")
    assert (health.status, health.body) == (200, b"ok")
    ready = await http_get(port, "/readyz")
    assert (ready.status, ready.body) == (200, b"ready")
    assert (await http_get(port, "/metrics")).status == 401
    assert (await http_get(port, "/metrics", bearer("wrong"))).status == 401
    assert (await http_get(port, "/metrics", [("Authorization", f"Basic {TOKEN}")])).status == 401
    samples = await scrape(port)
    for name in (
        "toolwire_calls_running",
        "toolwire_gates_parked",
        "toolwire_processes_running",
        "toolwire_connections",
        "toolwire_chats",
        "toolwire_records",
        "toolwire_output_bytes_total",
        "toolwire_journal_commit_seconds_count",
    ):
        assert (name, ()) in samples, name
    assert value(samples, "toolwire_ready") == 1
    assert value(samples, "toolwire_calls_total", tool="execute", outcome="unknown") == 0
    assert value(samples, "toolwire_errors_total", code="bad_args") == 0
    assert ("toolwire_journal_commit_seconds_bucket", (("le", "+Inf"),)) in samples
    for path in ("/", "/v1", "/healthz/x", "/metricsz"):
        assert (await http_get(port, path)).status == 404, path
    assert (await http_get(port, "/healthz", method="POST")).status == 405
    head = await http_get(port, "/readyz", method="HEAD")
    assert (head.status, head.body) == (200, b"")
    # The probes took nothing from the WebSocket side: a session opens and works as before.
    async with live.connect() as conn:
        assert "http_status" in conn.welcome["features"]
        result = await conn.call("c", "r1", "process_list", {})
        assert result["outcome"] == "completed"


async def test_counters_move_as_calls_complete_fail_and_are_canceled(live: LiveServer) -> None:
    port = port_of(live.url)
    (live.workspace / "f.txt").write_text("hello\n")
    before = await scrape(port)
    async with live.connect() as conn:
        ok = await conn.call("c", "ok", "read_file", {"path": "f.txt"})
        assert ok["outcome"] == "completed"
        bad = await conn.call("c", "bad", "read_file", {"path": "missing.txt"})
        assert bad["outcome"] == "failed"
        echo = await conn.call("c", "echo", "execute", {"command": "printf 1234567"})
        assert echo["outcome"] == "completed"
        await conn.send(
            {
                "type": "call",
                "chat_id": "c",
                "call_id": "sleep",
                "tool": "execute",
                "args": {"command": "sleep 30"},
            }
        )
        await wait_for(conn, of("started", "sleep"))
        during = await scrape(port)
        assert value(during, "toolwire_calls_running") >= 1
        assert value(during, "toolwire_processes_running") >= 1
        assert value(during, "toolwire_chat_processes_running_max") >= 1
        assert value(during, "toolwire_connections") >= 1
        await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["sleep"]})
        canceled = await wait_for(conn, of("result", "sleep"))
        assert canceled["outcome"] == "canceled"
        await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["ghost"]})
        ghost = await wait_for(conn, of("cancel_result", "ghost"))
        assert ghost["received"] is False  # a tombstone, not a call: not counted
        nope = await conn.call("c", "nope", "no_such_tool", {})
        assert nope["type"] == "error" and nope["code"] == "unknown_tool"
        await conn.send_raw("{not json")
        await wait_for(conn, lambda m: m["type"] == "error" and m["code"] == "bad_message")
        after = await scrape(port)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("toolwire_calls_total", tool="read_file", outcome="completed") == 1
    assert moved("toolwire_calls_total", tool="read_file", outcome="failed") == 1
    assert moved("toolwire_calls_total", tool="execute", outcome="completed") == 1
    assert moved("toolwire_calls_total", tool="execute", outcome="canceled") == 1
    ended = sum(v for (name, _), v in after.items() if name == "toolwire_calls_total")
    assert ended - sum(v for (name, _), v in before.items() if name == "toolwire_calls_total") == 4
    assert moved("toolwire_errors_total", code="unknown_tool") == 1
    assert moved("toolwire_errors_total", code="bad_message") == 1
    assert moved("toolwire_output_bytes_total") >= 7  # printf's 7 bytes (sleep wrote none)
    assert value(after, "toolwire_records") >= 4
    assert value(after, "toolwire_chats") >= 1
    commits = moved("toolwire_journal_commit_seconds_count")
    if isinstance(live.agent.ctx.journal, SqliteJournal):
        assert commits > 0  # every start and result was committed
        assert value(after, "toolwire_journal_commit_seconds_sum") > 0
    else:
        assert commits == 0  # the memory journal never commits


# ---------------------------------------------------------------------------------------------
# Readiness during recovery


class GatedJournal(SqliteJournal):
    """The SQLite journal whose writer commits nothing until the test opens `gate`: recovery's
    own writes (the `unknown` outcomes of calls that were running) cannot become durable, so
    the agent is held inside its recovery for exactly as long as the test wants."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self.gate.wait()
        await super().run()


def _row(chat_id: str, call_id: str, *, running: bool) -> JournalRow:
    args = {"path": f"{call_id}.txt"}
    result = None
    if not running:
        result = Result(
            tool="read_file", outcome=Outcome.COMPLETED, text="", data=None, output="",
            output_bytes=0, truncated_bytes=0, timed_out=False, canceled=False,
            started_at=1_000, finished_at=1_001, wall_ms=1,
        )  # fmt: skip
    return JournalRow(
        chat_id=chat_id,
        call_id=call_id,
        state="running" if running else "done",
        tool="read_file",
        fingerprint=args_fingerprint("read_file", args),
        args=args,
        result=result,
        started_at_ms=1_000,
        touched_at_ms=2_000_000_000_000,  # far in the future: never forgotten by the test
    )


async def write_journal(path: Path, rows: list[JournalRow]) -> None:
    journal = SqliteJournal(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for row in rows:
            journal.write(row)
        await journal.wait_durable(journal.queued_seq)
        nursery.cancel_scope.cancel()
    journal.close()


# Several recovery yields' worth, so the server runs between rows.
LARGE = 5 * RECOVERY_YIELD_ROWS


def large_journal_rows() -> list[JournalRow]:
    return [_row(f"chat{i % 50}", f"call{i}", running=i % 100 == 0) for i in range(LARGE)]


async def test_readyz_is_503_until_recovery_is_durable_and_handshakes_wait_too(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "journal.sqlite3"
    await write_journal(path, large_journal_rows())
    journal = GatedJournal(path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    agent = Agent(AgentContext(workspace=str(workspace), journal=journal))
    server = Server(agent, ServerConfig(host="127.0.0.1", port=0, token=TOKEN))
    async with trio.open_nursery() as nursery:
        # As `toolwire serve` does: the port opens first, then the journal is recovered.
        port = await nursery.start(server.serve)
        ready = trio.Event()

        async def run_agent() -> None:
            await nursery.start(agent.run)
            ready.set()

        nursery.start_soon(run_agent)
        health = await http_get(port, "/healthz")
        assert (health.status, health.body) == (200, b"ok")
        not_ready = await http_get(port, "/readyz")
        assert not_ready.status == 503
        assert b"recovering" in not_ready.body and not_ready.headers[b"retry-after"] == b"1"
        assert value(await scrape(port), "toolwire_ready") == 0
        with pytest.raises(ConnectionRejected) as rejected:
            async with connect(f"ws://127.0.0.1:{port}/v1", TOKEN):
                pass
        assert rejected.value.status_code == 503
        assert not ready.is_set()

        journal.gate.set()
        await ready.wait()
        assert agent.recovered == LARGE
        assert (await http_get(port, "/readyz")).status == 200
        samples = await scrape(port)
        assert value(samples, "toolwire_ready") == 1
        assert value(samples, "toolwire_records") == LARGE
        assert value(samples, "toolwire_calls_total", tool="read_file", outcome="unknown") == (
            LARGE // 100
        )
        async with connect(f"ws://127.0.0.1:{port}/v1", TOKEN) as conn:
            again = await conn.call("chat0", "call0", "read_file", {"path": "call0.txt"})
            assert again["outcome"] == "unknown"
            done = await conn.call("chat1", "call1", "read_file", {"path": "call1.txt"})
            assert (done["outcome"], done["wall_ms"]) == ("completed", 1)
        nursery.cancel_scope.cancel()
    journal.close()


async def test_recovery_that_yields_while_its_writes_commit_loses_no_record(
    tmp_path: Path,
) -> None:
    """Recovery lets the writer commit the `unknown` outcomes while it still reads the rows
    after them: every record comes back, each running one `unknown`, on disk too."""
    path = tmp_path / "state" / "journal.sqlite3"
    rows = large_journal_rows()
    await write_journal(path, rows)
    journal = SqliteJournal(path)
    ctx = AgentContext(workspace=str(tmp_path), journal=journal)
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(Agent(ctx).run)
        assert agent.recovered == len(rows)
        restored = {
            (chat_id, record.call_id): record.outcome
            for chat_id, chat in agent.chats.items()
            for record in chat.records
        }
        assert len(restored) == len(rows)
        for row in rows:
            expected = Outcome.UNKNOWN if row.state == "running" else Outcome.COMPLETED
            assert restored[(row.chat_id, row.call_id)] == expected
        nursery.cancel_scope.cancel()
    on_disk = {(r.chat_id, r.call_id): r for r in journal.load()}
    journal.close()
    assert len(on_disk) == len(rows)
    assert sum(
        r.result is not None and r.result.outcome == "unknown" for r in on_disk.values()
    ) == (len(rows) // 100)


# ---------------------------------------------------------------------------------------------
# Browsers (9.8)

ORIGIN = "https://example.com"


async def start(
    nursery: trio.Nursery, workspace: Path, *, token: str | None, allowed: frozenset[str]
) -> int:
    agent = await nursery.start(Agent(AgentContext(workspace=str(workspace))).run)
    config = ServerConfig(host="127.0.0.1", port=0, token=token, allowed_origins=allowed)
    port: int = await nursery.start(Server(agent, config).serve)
    return port


async def handshake_status(port: int, token: str | None, origin: str | None) -> int:
    """101 if the WebSocket opened, else the HTTP status of the rejection."""
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    try:
        async with open_websocket_url(
            f"ws://127.0.0.1:{port}/v1", extra_headers=headers, subprotocols=["toolwire.v1.json"]
        ) as ws:
            welcome = json.loads(await ws.get_message())
            assert welcome["type"] == "welcome"
            return 101
    except ConnectionRejected as exc:
        return exc.status_code


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "insecure-no-auth"])
async def test_a_browser_origin_is_refused_before_auth_unless_allowed(
    nursery: trio.Nursery, tmp_path: Path, token: str | None
) -> None:
    port = await start(nursery, tmp_path, token=token, allowed=frozenset())
    assert await handshake_status(port, token, ORIGIN) == 403
    assert await handshake_status(port, None, ORIGIN) == 403  # before auth: not 401
    assert await handshake_status(port, token, None) == 101
    if token is not None:
        assert await handshake_status(port, None, None) == 401

    allowing = await start(nursery, tmp_path, token=token, allowed=frozenset({ORIGIN}))
    assert await handshake_status(allowing, token, ORIGIN) == 101
    assert await handshake_status(allowing, token, None) == 101
    assert await handshake_status(allowing, token, "https://example.com:8443") == 403
    assert await handshake_status(allowing, token, "https://evil.example.com") == 403
    if token is not None:
        assert await handshake_status(allowing, None, ORIGIN) == 401  # allowed, still needs auth


async def test_toolwire_serve_allow_origin_lets_exactly_that_origin_through(
    tmp_path: Path,
) -> None:
    async with serve(
        tmp_path, "--insecure-no-auth", "--allow-origin", ORIGIN, "--allow-origin", "http://x.test"
    ) as server:
        port = port_of(server.url)
        assert await handshake_status(port, None, ORIGIN) == 101
        assert await handshake_status(port, None, "http://x.test") == 101
        assert await handshake_status(port, None, "https://example.org") == 403
        assert await handshake_status(port, None, None) == 101
        server.process.send_signal(signal.SIGTERM)
        assert await server.process.wait() == 0
