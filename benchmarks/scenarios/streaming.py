"""Scenario `streaming`: MB/s of a large output through toolwire vs reading the pipe in trio.

toolwire runs `head -c N /dev/zero` with `stream: true` in the server process and this client
counts the output bytes it is sent (from each `output` event's offset and length), the retention
jumps it sees (an event starting past the bytes received so far: the client fell behind by more
than the 1 MiB retention), and the total the result reports. The baseline is the same command in
plain trio: `trio.lowlevel.open_process` and a `receive_some` loop on its stdout, with the pipe
grown to the size toolwire grows a busy pipe to (`actors/processes.py` BULK_PIPE_BYTES, by
F_SETPIPE_SZ) and reads of that size, as toolwire's own reads.

The output is NUL bytes, as the issue's command makes them. JSON escapes each as `\\u0000` (6 bytes
a byte); MessagePack carries the string as is. Both encodings are measured, msgpack is the row
with the goal: it is the encoding for bulk output. On msgpack a second row gives the CPU the
stream cost the agent server and its keeper (found as the server's child; none in a build
before the keeper), which the client's share of the machine does not sway as the MB/s
received does.
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import time

import trio

from toolwire.actors.processes import BULK_PIPE_BYTES
from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    Measurement,
    ScenarioResult,
    agent,
    run_side_by_side,
)
from toolwire.benchmarks.procs import CpuMeter, ServerProcess, cpu_seconds, keeper_of
from toolwire.benchmarks.scenarios.common import servers
from toolwire.benchmarks.wire import Codec, UnexpectedReply, ws_connect

MB = 1_000_000


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    size = ctx.size(200 * MB, 2 * MB)
    repeats = ctx.repeats(3)
    command = f"head -c {size} /dev/zero"
    res.params = {"bytes": size, "command": command, "repeats": repeats}
    m_mp = res.measurement("toolwire_msgpack", "toolwire stream, msgpack", "MB/s")
    # What the output costs the agent's side, whatever share of it the client took: the
    # server's CPU and its keeper's (which reads, records and forwards every byte since
    # issue 31), per stream, on msgpack.
    m_cpu = res.measurement(
        "toolwire_msgpack_cpu", "toolwire stream, msgpack: agent and keeper CPU", "ms"
    )
    m_js = res.measurement("toolwire_json", "toolwire stream, JSON", "MB/s")
    m_pipe = res.measurement("trio_pipe", "plain trio pipe read", "MB/s")

    with servers(ctx, "toolwire") as srv:

        def toolwire(r: int, encoding: str) -> None:
            m = m_mp if encoding == "msgpack" else m_js
            trio.run(
                _toolwire_stream,
                srv["toolwire"],
                srv.token,
                encoding,
                f"stream-{encoding}-{r}",
                command,
                size,
                m,
                m_cpu if encoding == "msgpack" else None,
            )

        def pipe(r: int) -> None:
            trio.run(_trio_pipe, ["head", "-c", str(size), "/dev/zero"], size, m_pipe)

        variants = [
            agent(lambda r: toolwire(r, "msgpack")),
            agent(lambda r: toolwire(r, "json")),
            pipe,
        ]
        run_side_by_side(ctx, "streaming", variants, repeats)

    res.comparisons = [
        Comparison(
            "streaming a 200 MB output (msgpack) vs plain trio pipe read",
            "toolwire_msgpack",
            "trio_pipe",
            goal=Goal("ratio>=", 0.5, ">= 0.5x"),
        ),
        Comparison(
            "streaming (JSON: NUL bytes escaped 6x) vs plain trio", "toolwire_json", "trio_pipe"
        ),
    ]
    return res


async def _toolwire_stream(
    server: ServerProcess,
    token: str,
    encoding: str,
    chat: str,
    command: str,
    size: int,
    m: Measurement,
    m_cpu: Measurement | None = None,
) -> None:
    codec = Codec(encoding)
    async with ws_connect(server.port, token=token, subprotocol=codec.subprotocol) as conn:
        frame = codec.call(chat, "big", "execute", {"command": command}, stream=True)
        received = 0
        jumps = 0
        next_offset = 0
        total = -1
        meter = CpuMeter(server.pid)
        meter.start()
        keeper = keeper_of(server.pid)  # None: a build before the keeper (issue 31)
        keeper_cpu0 = cpu_seconds(keeper) if keeper is not None else 0.0
        t0 = time.perf_counter()
        await conn.ws.send_message(frame)
        while True:
            message = codec.decode(await conn.ws.get_message())
            if message.type == "output":
                assert message.offset is not None and isinstance(message.data, str)
                if message.offset > next_offset:
                    jumps += 1
                n = len(message.data)  # NUL bytes: one character is one byte
                received += n
                next_offset = message.offset + n
            elif message.type == "result":
                total = message.output_bytes or 0
                break
            elif message.type == "error":
                raise UnexpectedReply(f"error {message.code}: {message.message}")
        seconds = time.perf_counter() - t0
        meter.stop()
        keeper_cpu = cpu_seconds(keeper) - keeper_cpu0 if keeper is not None else 0.0
        wire = conn.counter.received
    if total != size:
        raise UnexpectedReply(f"the result reports {total} output bytes, not {size}")
    m.add(
        received / MB / seconds,
        total_mb_per_s=total / MB / seconds,
        received_bytes=received,
        total_bytes=total,
        retention_jumps=jumps,
        wire_bytes_received=wire,
        seconds=seconds,
        client_cpu_s=meter.client_s,
        server_cpu_s=meter.server_s,
        keeper_cpu_s=keeper_cpu,
    )
    if m_cpu is not None:
        m_cpu.add(
            (meter.server_s + keeper_cpu) * 1000,
            server_cpu_s=meter.server_s,
            keeper_cpu_s=keeper_cpu,
        )


async def _trio_pipe(argv: list[str], size: int, m: Measurement) -> None:
    c0 = time.process_time()
    t0 = time.perf_counter()
    proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    read_bytes = 64 * 1024  # the default pipe's size, if growing it is refused (as toolwire)
    with contextlib.suppress(OSError):
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, BULK_PIPE_BYTES)
        read_bytes = fcntl.fcntl(proc.stdout.fileno(), fcntl.F_GETPIPE_SZ)
    received = 0
    try:
        while True:
            data = await proc.stdout.receive_some(read_bytes)
            if not data:
                break
            received += len(data)
        await proc.wait()
    finally:
        await proc.stdout.aclose()
    seconds = time.perf_counter() - t0
    if received != size:
        raise UnexpectedReply(f"read {received} bytes from the pipe, not {size}")
    m.add(received / MB / seconds, seconds=seconds, client_cpu_s=time.process_time() - c0)
