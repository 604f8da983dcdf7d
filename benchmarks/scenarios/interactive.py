"""Scenario `interactive`: one line typed into `cat` on a terminal, until cat's copy is back.

What a model does when it drives a REPL or answers a prompt (PROTOCOL.md 9.1): a one-line
`process_input` to a command on a pty, then the command's answer. Side by side, per repeat in
a rotated order:

- **toolwire**, on `toolwire serve`'s defaults (SQLite journal, sync full), and on the memory
  journal as a row beside it: over one WebSocket, `execute` of `cat` with `pty: {rows, cols}`
  (foreground, streaming, no deadline: the connection follows its `output`), then one-line
  `process_input` calls (`stream: false`, `wait_ms` 0) one after the other, each waiting for
  the previous line's round trip and its result;
- **raw pty**, in this process: `os.openpty`, a `cat` child with the slave as its controlling
  terminal (a new session that opens the slave, as toolwire's spawner does), the same size,
  the kernel's termios defaults (toolwire sets none either; checked once per run with
  `stty -g` on each), the master written and read with non-blocking I/O on trio.

A sample runs from just before the line is handed to the socket (toolwire: the `process_input`
message; raw pty: the master's `write`) to the moment the bytes received from the terminal
reach the end of cat's copy of the line. On a terminal with the default termios one line
`L\\n` comes back as `L\\r\\n` twice: the line discipline's echo (at the write), then cat's
copy (once cat has read the line and written it back), so the sample ends when
`2 * len(L\\r\\n)` bytes beyond what was received before the write have arrived: in an `output`
message for toolwire, in a `read` of the master for the baseline. Both check that those bytes
are exactly the echo and the copy. Recorded beside, per repeat: when the echo was complete
(`echo_p50_ms`), how many messages or reads a line took, and when the input's own result came.

The reference row: trivial calls (`read_file`, `stream: false`) one at a time on the same
agents, in the same rotation, the round trip any call costs.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import statistics
import struct
import termios
import time
from dataclasses import dataclass, field

import msgspec
import trio

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Measurement,
    ScenarioResult,
    agent,
    run_side_by_side,
)
from toolwire.benchmarks.scenarios.common import TRIVIAL_ARGS, servers
from toolwire.benchmarks.scenarios.journal import add_latencies
from toolwire.benchmarks.wire import (
    Codec,
    Incoming,
    UnexpectedReply,
    WsConn,
    await_result,
    check_completed,
    ws_connect,
)

ROWS, COLS = 24, 80
SERVERS = {"full": "toolwire", "memory": "toolwire-memory"}
LABELS = {"full": "serve's defaults (sqlite, sync full)", "memory": "memory journal"}
SHORT = {"full": "serve's defaults", "memory": "memory journal"}
WARMUP_LINES = 20
READ_BYTES = 64 * 1024
EXECUTE_ID = "cat"


def line(i: int) -> str:
    """The i-th line typed (the same on both sides): 40 printable bytes and a newline."""
    return f"line {i:06d} typed into cat on a pty ....\n"


def on_terminal(line_text: str) -> bytes:
    """What the terminal sends back for one typed line: its echo, then cat's copy, each with
    the CR LF that the default output processing (OPOST, ONLCR) makes of a newline."""
    shown = line_text.replace("\n", "\r\n").encode()
    return shown + shown


@dataclass
class Lines:
    """One repeat's samples in ms: to the end of cat's copy, and to the end of the echo; how
    many messages (toolwire) or reads (raw pty) a line's round trip took; and for toolwire, to
    the `process_input` call's own result (which may come before or after the copy)."""

    round_trip: list[float] = field(default_factory=list)
    echo: list[float] = field(default_factory=list)
    pieces: list[int] = field(default_factory=list)
    input_result: list[float] = field(default_factory=list)

    def record(self, m: Measurement) -> None:
        add_latencies(m, self.round_trip)
        m.add_extra("echo_p50_ms", statistics.median(self.echo))
        m.add_extra("pieces_per_line", statistics.mean(self.pieces))
        if self.input_result:
            m.add_extra("input_result_p50_ms", statistics.median(self.input_result))


# ---------------------------------------------------------------------------------------------
# toolwire


class _Follower:
    """The `execute` call's output as this connection receives it, and the other messages a
    round trip must see: each `process_input` call's result."""

    def __init__(self, conn: WsConn, codec: Codec) -> None:
        self.conn = conn
        self.codec = codec
        self.output = bytearray()
        self.results: dict[str, tuple[Incoming, float]] = {}

    async def next_message(self) -> Incoming:
        message = self.codec.decode(await self.conn.ws.get_message())
        if message.type == "error":
            raise UnexpectedReply(f"error {message.code}: {message.message}")
        if message.type == "output" and message.call_id == EXECUTE_ID:
            assert message.offset is not None
            data = str(message.data).encode()
            if message.offset > len(self.output):
                raise UnexpectedReply(f"output gap at {len(self.output)} -> {message.offset}")
            # A re-sent range (never expected here) is de-duplicated by offset, as 5.0 says.
            self.output += data[len(self.output) - message.offset :]
        elif message.type == "result":
            if message.call_id == EXECUTE_ID:
                raise UnexpectedReply(f"cat ended early: {message.outcome}")
            assert message.call_id is not None
            self.results[message.call_id] = (message, time.perf_counter())
        return message


async def _toolwire_lines(follower: _Follower, chat: str, first: int, n: int) -> Lines:
    """Type lines `first .. first+n-1` one after the other into the chat's `cat`."""
    conn, codec = follower.conn, follower.codec
    lines = Lines()
    for i in range(first, first + n):
        text = line(i)
        expected = on_terminal(text)
        base = len(follower.output)
        echo_end, copy_end = base + len(expected) // 2, base + len(expected)
        frame = codec.encode(
            {
                "type": "call",
                "chat_id": chat,
                "call_id": f"in{i}",
                "tool": "process_input",
                "args": {"process_id": EXECUTE_ID, "data": text},
                "stream": False,
            }
        )
        messages = 0
        echo_at: float | None = None
        t0 = time.perf_counter()
        await conn.ws.send_message(frame)
        while len(follower.output) < copy_end:
            message = await follower.next_message()
            now = time.perf_counter()
            if message.type == "output":
                messages += 1
                if echo_at is None and len(follower.output) >= echo_end:
                    echo_at = now
        lines.round_trip.append((now - t0) * 1000)
        lines.echo.append(((echo_at or now) - t0) * 1000)
        lines.pieces.append(messages)
        if bytes(follower.output[base:copy_end]) != expected:
            raise UnexpectedReply(f"line {i}: got {bytes(follower.output[base:])!r}")
        # The input's own result (it may come before or after the copy): the next line waits
        # for it, so no two inputs are ever in flight; it is not part of the sample.
        while f"in{i}" not in follower.results:
            await follower.next_message()
        result, result_at = follower.results.pop(f"in{i}")
        check_completed(result)
        lines.input_result.append((result_at - t0) * 1000)
        if len(follower.output) != copy_end:
            raise UnexpectedReply(f"line {i}: more output than the echo and the copy")
    return lines


def toolwire_repeat(port: int, token: str, chat: str, n: int) -> Lines:
    """Start `cat` on a pty in a chat of its own, warm up, type `n` timed lines, end cat with
    the terminal's EOF character and wait for its result."""
    codec = Codec("json")

    async def main() -> Lines:
        async with ws_connect(port, token=token, subprotocol=codec.subprotocol) as conn:
            args = {"command": "cat", "pty": {"rows": ROWS, "cols": COLS}}
            await conn.ws.send_message(codec.call(chat, EXECUTE_ID, "execute", args, stream=True))
            while True:
                message = codec.decode(await conn.ws.get_message())
                check_completed(message)
                if message.type == "started":
                    break
            follower = _Follower(conn, codec)
            await _toolwire_lines(follower, chat, 0, WARMUP_LINES)
            lines = await _toolwire_lines(follower, chat, WARMUP_LINES, n)
            eof = {"process_id": EXECUTE_ID, "data": "", "eof": True}
            await conn.ws.send_message(codec.call(chat, "eof", "process_input", eof, stream=False))
            while True:
                message = codec.decode(await conn.ws.get_message())
                check_completed(message)
                if message.type == "result" and message.call_id == EXECUTE_ID:
                    return lines

    return trio.run(main)


def trivial_repeat(port: int, token: str, chat: str, n: int) -> list[float]:
    """The reference: `n` trivial calls (`read_file` of 300 bytes, `stream: false`) one after
    the other on the same agent, each from sending the call to its result, in ms: the round
    trip of any call, which a `process_input` adds a terminal's hop to."""
    codec = Codec("json")

    async def one(conn: WsConn, call_id: str) -> float:
        t0 = time.perf_counter()
        await conn.ws.send_message(
            codec.call(chat, call_id, "read_file", TRIVIAL_ARGS, stream=False)
        )
        check_completed(await await_result(conn, codec, call_id))
        return (time.perf_counter() - t0) * 1000

    async def main() -> list[float]:
        async with ws_connect(port, token=token, subprotocol=codec.subprotocol) as conn:
            for i in range(WARMUP_LINES):
                await one(conn, f"w{i}")
            return [await one(conn, f"c{i}") for i in range(n)]

    return trio.run(main)


def toolwire_termios(port: int, token: str) -> str:
    """`stty -g` as a command on a toolwire terminal sees it."""
    codec = Codec("json")

    async def main() -> str:
        async with ws_connect(port, token=token, subprotocol=codec.subprotocol) as conn:
            args = {"command": "stty -g", "pty": {"rows": ROWS, "cols": COLS}}
            await conn.ws.send_message(codec.call("termios", "stty", "execute", args, stream=False))
            while True:
                frame = await conn.ws.get_message()
                message = codec.decode(frame)
                check_completed(message)
                if message.type == "result":
                    # `Incoming` leaves a result's `output` out: read it from the message.
                    output: object = msgspec.json.decode(frame).get("output")
                    return str(output).strip()

    return trio.run(main)


# ---------------------------------------------------------------------------------------------
# raw pty


class RawPty:
    """`argv` on a new pseudo-terminal in this process: the child opens the slave after
    `setsid` (so it is its controlling terminal, as toolwire's spawner makes it), the master
    stays here, non-blocking. Nothing changes the termios the kernel gives a new terminal."""

    def __init__(self, argv: list[str]) -> None:
        master, slave = os.openpty()  # both close-on-exec (PEP 446): the child inherits neither
        try:
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
            os.set_blocking(master, False)
            self.pid = os.posix_spawn(
                argv[0],
                argv,
                dict(os.environ),
                setsid=True,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.ttyname(slave), os.O_RDWR, 0),
                    (os.POSIX_SPAWN_DUP2, 0, 1),
                    (os.POSIX_SPAWN_DUP2, 0, 2),
                ],
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            # Closed once the child has its own: the master reads EIO when no one holds it.
            os.close(slave)
        self.master = master

    async def read_some(self) -> bytes:
        """What the terminal has sent; b"" once nobody holds its slave side (EIO)."""
        while True:
            try:
                return os.read(self.master, READ_BYTES)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.master)
            except OSError:
                return b""

    async def write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.master)

    def close(self) -> None:
        """Close the master (the child gets SIGHUP if still there) and reap the child."""
        trio.lowlevel.notify_closing(self.master)
        os.close(self.master)
        os.waitpid(self.pid, 0)


async def _raw_lines(pty: RawPty, first: int, n: int) -> Lines:
    lines = Lines()
    for i in range(first, first + n):
        data = line(i).encode()
        expected = on_terminal(line(i))
        got = bytearray()
        reads = 0
        echo_at: float | None = None
        t0 = time.perf_counter()
        await pty.write_all(data)
        while len(got) < len(expected):
            piece = await pty.read_some()
            now = time.perf_counter()
            if not piece:
                raise RuntimeError("cat on the raw pty went away")
            got += piece
            reads += 1
            if echo_at is None and len(got) >= len(expected) // 2:
                echo_at = now
        lines.round_trip.append((now - t0) * 1000)
        lines.echo.append(((echo_at or now) - t0) * 1000)
        lines.pieces.append(reads)
        if bytes(got) != expected:
            raise RuntimeError(f"line {i}: got {bytes(got)!r}")
    return lines


def raw_repeat(cat: str, n: int) -> Lines:
    async def main() -> Lines:
        pty = RawPty([cat])
        try:
            await _raw_lines(pty, 0, WARMUP_LINES)
            return await _raw_lines(pty, WARMUP_LINES, n)
        finally:
            pty.close()

    return trio.run(main)


def raw_termios(stty: str) -> str:
    """`stty -g` as a command on a raw pty opened like the baseline's sees it."""

    async def main() -> str:
        pty = RawPty([stty, "-g"])
        out = bytearray()
        try:
            while piece := await pty.read_some():
                out += piece
        finally:
            pty.close()
        return out.decode().strip()

    return trio.run(main)


# ---------------------------------------------------------------------------------------------


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    n_lines = ctx.size(1_000, 30)
    repeats = ctx.repeats(5)
    cat = shutil.which("cat") or "/bin/cat"
    stty = shutil.which("stty") or "/bin/stty"
    res.params = {
        "lines_per_variant": n_lines,
        "warmup_lines": WARMUP_LINES,
        "repeats": repeats,
        "line_bytes": len(line(0)),
        "pty": {"rows": ROWS, "cols": COLS},
        "toolwire": "execute cat (via /bin/sh -c) with pty, streaming; process_input, "
        "stream false, wait_ms 0, one after the other",
        "baseline": f"{cat} on os.openpty, setsid + open of the slave, non-blocking master on trio",
        "sample": "from sending the line to receiving the end of cat's copy (echo + copy bytes)",
    }
    tw = {
        k: res.measurement(f"toolwire_line_{k}",
                           f"toolwire process_input to cat on a pty, {v}", "ms",
                           higher_is_better=False)
        for k, v in LABELS.items()
    }  # fmt: skip
    trivial = {
        k: res.measurement(f"toolwire_trivial_{k}", f"trivial call (read_file), one at a time, {v}",
                           "ms", higher_is_better=False)
        for k, v in LABELS.items()
    }  # fmt: skip
    raw = res.measurement(
        "raw_pty_line", "raw pty: write the line, read the echo and cat's copy", "ms",
        higher_is_better=False,
    )  # fmt: skip

    with servers(ctx, *SERVERS.values()) as srv:
        # The same terminal settings on both sides, or the comparison is of different work.
        seen = {"toolwire": toolwire_termios(srv["toolwire"].port, srv.token),
                "raw pty": raw_termios(stty)}  # fmt: skip
        res.params["termios"] = seen
        if seen["toolwire"] != seen["raw pty"]:
            res.notes.append(f"termios differ: {seen}")

        def toolwire_variant(key: str, r: int) -> None:
            server = srv[SERVERS[key]]
            toolwire_repeat(server.port, srv.token, f"interactive-{key}-{r}", n_lines).record(
                tw[key]
            )

        def trivial_variant(key: str, r: int) -> None:
            server = srv[SERVERS[key]]
            add_latencies(
                trivial[key], trivial_repeat(server.port, srv.token, f"trivial-{key}-{r}", n_lines)
            )

        def raw_variant(r: int) -> None:
            raw_repeat(cat, n_lines).record(raw)

        variants = [
            *(agent(lambda r, k=k: toolwire_variant(k, r)) for k in SERVERS),
            raw_variant,
            *(agent(lambda r, k=k: trivial_variant(k, r)) for k in SERVERS),
        ]
        run_side_by_side(ctx, "interactive", variants, repeats)

    res.comparisons = [
        *(
            Comparison(
                f"one-line process_input to cat on a pty, round trip ({stat}), {SHORT[k]}, "
                "vs a raw pty write and read",
                f"toolwire_line_{k}",
                "raw_pty_line",
                stat=stat,
            )
            for k in SERVERS
            for stat in ("p50", "p99")
        ),
        *(
            Comparison(
                f"one-line process_input round trip (p50) vs a trivial call one at a time, "
                f"{SHORT[k]}",
                f"toolwire_line_{k}",
                f"toolwire_trivial_{k}",
                stat="p50",
            )
            for k in SERVERS
        ),
    ]
    return res
