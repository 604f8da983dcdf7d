"""Scenario `bigwrite`: trivial calls in one chat while another chat writes 16 MiB files.

A write of a big file must not hold up the agent's other chats (issue 13): `write_file` and
`edit_files` hash their payload, write it, and fsync the file and its directory, on payloads up
to the largest message (16 MiB), and a busy disk can make the fsyncs alone take seconds.

Per repeat, in a rotated order, on two agents of the same settings (the calls alone on one, the
writes and the calls during them on the other: an agent goes on paying a while for 16 MiB
writes it took, when SQLite checkpoints the rows they left in its WAL):

- **alone**: trivial calls (`read_file` of a 300-byte file, `stream: false`) in one chat over
  one connection, one every 2 ms for a fixed time, each timed from when it was due to its
  result (`trivial_latencies` says why a fixed rate);
- **during writes**: the same calls in the same way while another chat, over a connection and
  from a process of its own (`benchmarks/write_load.py`), writes a file of 16 MiB (less 1 KiB,
  room for the message around it) one call after the other. The calls start once the first
  write is done and end before the writer is stopped, so they all meet writes.

On `toolwire serve`'s defaults (SQLite journal, sync full), and again on the memory journal,
which shows what the journal's share is: the journal keeps each call's args, 16 MiB per write.
Reported: p50 and p99 of the trivial call's latency during the writes against alone, and how
long each 16 MiB write took its own chat.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Measurement,
    ScenarioResult,
    run_side_by_side,
)
from toolwire.benchmarks.procs import READY_TIMEOUT_S, STOP_TIMEOUT_S, ServerProcess, child_env
from toolwire.benchmarks.scenarios.common import TRIVIAL_ARGS, Servers, servers
from toolwire.benchmarks.scenarios.journal import add_latencies
from toolwire.benchmarks.wire import Codec, await_result, check_completed, ws_connect

MIB = 1024 * 1024
# The largest message the agent takes is 16 MiB (Limits.max_message_bytes); the call around the
# content needs well under 1 KiB.
WRITE_BYTES = 16 * MIB - 1024
# The agents of each journal: one takes the writes (and the calls during them), the other only
# the calls alone (see the module's docstring).
DURING = {"full": "toolwire", "memory": "toolwire-memory"}
ALONE = {"full": "toolwire-2", "memory": "toolwire-memory-2"}
# The trivial calls' rate: one every 2 ms, 500/s, a fraction of what one connection carries.
INTERVAL_S = 0.002
LABELS = {"full": "serve's defaults (sqlite, sync full)", "memory": "memory journal"}


class Writer:
    """`benchmarks/write_load.py` writing against one agent until `stop()`."""

    def __init__(self, ctx: BenchContext, server: ServerProcess, token: str, size: int) -> None:
        log = ctx.workdir / "write_load.log"
        self._log = log.open("ab")
        self.log = log
        self.proc = subprocess.Popen(
            [
                ctx.python,
                "-m",
                "toolwire.benchmarks.write_load",
                f"--port={server.port}",
                f"--token={token}",
                f"--bytes={size}",
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            cwd=str(ctx.workdir),
            env=child_env(),
        )
        try:
            self._wait_ready()
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            self._log.close()
            raise

    def _wait_ready(self) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = self.proc.stdout.readline()
                if line.strip() == b"READY":
                    return
                if not line:
                    break
            elif self.proc.poll() is not None:
                break
        raise RuntimeError(f"the writer did not write; see {self.log}: {self._tail()}")

    def _tail(self) -> str:
        self._log.flush()
        return Path(self.log).read_text()[-2000:]

    def stop(self) -> dict[str, Any]:
        """Stop after the write under way; return what the writer reports."""
        assert self.proc.stdout is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=STOP_TIMEOUT_S + 60)
        finally:
            self._log.close()
        lines = out.decode().strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            raise RuntimeError(f"the writer failed ({self.proc.returncode}): {self._tail()}")
        report: dict[str, Any] = json.loads(lines[-1])
        return report


def trivial_latencies(server: ServerProcess, token: str, chat: str, seconds: float) -> list[float]:
    """Trivial calls in one chat at a fixed rate (one every INTERVAL_S) for `seconds`, after a
    warm-up; each one's latency in ms, from the moment it was due to be sent to its result.

    A fixed rate, not one call after the other: a client that waits for each answer sends only
    one call into a stall, however long, and the stall would be one sample among thousands. At
    a fixed rate a stall of 50 ms delays every call due in it, and counting from when each was
    due (not when the client got round to sending it) keeps the client's own lag in too."""
    codec = Codec("json")
    count = max(1, round(seconds / INTERVAL_S))

    async def main() -> list[float]:
        samples: list[float] = []
        due: dict[str, float] = {}
        async with ws_connect(server.port, token=token, subprotocol=codec.subprotocol) as conn:
            for i in range(20):
                await conn.ws.send_message(
                    codec.call(chat, f"warm{i}", "read_file", TRIVIAL_ARGS, stream=False)
                )
                check_completed(await await_result(conn, codec, f"warm{i}"))

            async def receive() -> None:
                while len(samples) < count:
                    message = codec.decode(await conn.ws.get_message())
                    check_completed(message)
                    if message.type == "result" and message.call_id in due:
                        samples.append((trio.current_time() - due[message.call_id]) * 1000)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                start = trio.current_time()
                for i in range(count):
                    at = start + i * INTERVAL_S
                    await trio.sleep_until(at)
                    due[f"c{i}"] = at
                    frame = codec.call(chat, f"c{i}", "read_file", TRIVIAL_ARGS, stream=False)
                    await conn.ws.send_message(frame)
        return samples

    return trio.run(main)


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    seconds = ctx.seconds(2.0, 0.3)
    size = ctx.size(WRITE_BYTES, MIB)
    repeats = ctx.repeats(5)
    big = f"{round(size / MIB)} MiB"  # 16 MiB; 1 MiB with --quick
    res.params = {
        "seconds_per_variant": seconds,
        "write_bytes": size,
        "repeats": repeats,
        "trivial_call": {"tool": "read_file", "args": TRIVIAL_ARGS, "stream": False},
        "trivial_calls_every_ms": INTERVAL_S * 1000,
        "writer": "write_file of the same path, one call after the other, from another process",
    }
    alone = {
        k: res.measurement(f"trivial_alone_{k}", f"trivial call alone, {v}", "ms",
                           higher_is_better=False)
        for k, v in LABELS.items()
    }  # fmt: skip
    during = {
        k: res.measurement(f"toolwire_trivial_during_writes_{k}",
                           f"trivial call while another chat writes {big} files, {v}", "ms",
                           higher_is_better=False)
        for k, v in LABELS.items()
    }  # fmt: skip
    writes = {
        k: res.measurement(f"toolwire_write_{k}", f"one {big} write_file, its own chat, {v}",
                           "ms", higher_is_better=False)
        for k, v in LABELS.items()
    }  # fmt: skip

    def measure_alone(srv: Servers, key: str, r: int) -> None:
        samples = trivial_latencies(srv[ALONE[key]], srv.token, f"alone-{key}-{r}", seconds)
        add_latencies(alone[key], samples)

    def measure_during(srv: Servers, key: str, r: int) -> None:
        writer = Writer(ctx, srv[DURING[key]], srv.token, size)
        try:
            samples = trivial_latencies(srv[DURING[key]], srv.token, f"during-{key}-{r}", seconds)
        finally:
            report = writer.stop()
        add_latencies(during[key], samples)
        add_write_latencies(writes[key], report["write_ms"], report["writes"])

    with servers(ctx, *DURING.values(), *ALONE.values()) as srv:
        variants = [
            *(lambda r, k=k: measure_alone(srv, k, r) for k in LABELS),
            *(lambda r, k=k: measure_during(srv, k, r) for k in LABELS),
        ]
        run_side_by_side(ctx, "bigwrite", variants, repeats)

    res.comparisons = [
        *(
            Comparison(
                f"trivial call {stat} while another chat writes {big} files vs alone ({v})",
                f"toolwire_trivial_during_writes_{k}",
                f"trivial_alone_{k}",
                stat=stat,
            )
            for k, v in (("full", "serve's defaults"), ("memory", "memory journal"))
            for stat in ("p50", "p99")
        ),
        *(
            Comparison(
                f"one {big} write_file, request to result ({v})",
                f"toolwire_write_{k}",
                None,
                stat="p50",
            )
            for k, v in (("full", "serve's defaults"), ("memory", "memory journal"))
        ),
    ]
    return res


def add_write_latencies(m: Measurement, samples: list[float], count: int) -> None:
    """The writes of one repeat: their median as the repeat's value, every write pooled, and
    how many there were (the first, before the trivial calls began, included)."""
    add_latencies(m, samples)
    m.extra.setdefault("writes", []).append(float(count))
