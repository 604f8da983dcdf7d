"""Helpers the scenarios share: servers to start, timed sections, the files the calls read."""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from toolwire.benchmarks.core import BenchContext, Build, Measurement, RefUnavailable, current_build
from toolwire.benchmarks.procs import CpuMeter, ServerProcess, ThreadTimes
from toolwire.benchmarks.wire import Codec, WsConn, pipelined_calls, ws_connect

# The "trivial call": read_file of a small file (5 lines, 300 bytes).
SMALL_FILE = "small.txt"
SMALL_FILE_TEXT = "".join(
    f"line {i:02d} of a small file for the trivial call bench\n" for i in range(5)
)
TRIVIAL_ARGS = {"path": SMALL_FILE}


@dataclass
class Timed:
    """One timed section: operations done, wall seconds, CPU seconds of both ends, wire bytes."""

    ops: int
    seconds: float
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    wire_bytes: int = 0
    server_threads: ThreadTimes | None = None

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def record(self, m: Measurement) -> None:
        """Add this repeat to `m`: the rate, and per operation: CPU microseconds, bytes."""
        ops = max(self.ops, 1)
        extra: dict[str, float] = {
            "client_cpu_us_per_op": self.client_cpu_s * 1e6 / ops,
            "seconds": self.seconds,
        }
        if self.server_cpu_s:
            extra["server_cpu_us_per_op"] = self.server_cpu_s * 1e6 / ops
        if self.wire_bytes:
            extra["wire_bytes_per_op"] = self.wire_bytes / ops
        threads = self.server_threads
        if threads is not None:
            extra["server_main_cpu_us_per_op"] = threads.main_cpu_s * 1e6 / ops
            extra["server_others_cpu_us_per_op"] = threads.others_cpu_s * 1e6 / ops
            if threads.main_wait_s is not None:
                extra["server_main_wait_us_per_op"] = threads.main_wait_s * 1e6 / ops
        m.add(self.rate, **extra)


def make_workspace(ctx: BenchContext) -> Path:
    workspace = ctx.scratch("workspace")
    (workspace / SMALL_FILE).write_text(SMALL_FILE_TEXT)
    return workspace


@dataclass
class Servers:
    """The servers of a scenario by name. While a variant runs for REF (`--against`), an agent
    server's name gives REF's twin of it (or RefUnavailable, saying why REF cannot run it)."""

    token: str
    workspace: Path
    procs: dict[str, ServerProcess]
    ref_procs: dict[str, ServerProcess] = field(default_factory=dict)
    ref_unavailable: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> ServerProcess:
        if current_build().is_ref and name in AGENT_SERVERS:
            if name in self.ref_unavailable:
                raise RefUnavailable(self.ref_unavailable[name])
            return self.ref_procs[name]
        return self.procs[name]


# The servers that are toolwire's agent (the rest are baselines, always the working tree's).
AGENT_SERVERS = frozenset(
    {
        "toolwire",
        "toolwire-normal",
        "toolwire-nometrics",
        "toolwire-memory",
        "toolwire-skipcommits",
        "toolwire-2",
        "toolwire-memory-2",
    }
)


@contextmanager
def servers(
    ctx: BenchContext, *names: str, loop_lag: bool = False, current_only: bool = False
) -> Iterator[Servers]:
    """Start the named servers as subprocesses (sharing one workspace and token); stop them
    after. `echo`: stock trio-websocket echo; `echo-wsproto`: the fastest echo this machine
    does in Python (wsproto on a raw trio stream, toolwire's write coalescing); `toolwire`: the
    agent on `toolwire serve`'s defaults (SQLite journal in a state dir of its own, sync full);
    `toolwire-normal`: the same with `--sync normal`; `toolwire-nometrics`: the same as
    `toolwire` with the operator's counters off (`/metrics` cost baseline); `toolwire-memory`:
    the memory journal (nothing survives a restart); `toolwire-skipcommits`: the same as
    `toolwire` with the statements of every commit skipped (a bound, not durable);
    `toolwire-2` and `toolwire-memory-2`: second agents like `toolwire` and `toolwire-memory`,
    with state of their own; `http`: the request/response baseline on the same actors.

    With `--against`, every agent server also gets a twin on REF's agent (state of its own,
    the same workspace and token); with `current_only` (a scenario that starts fresh agents
    inside each variant) only the agent of the build the variant runs for is started. With
    `loop_lag`, the agent servers run under the loop-lag probe (`ServerProcess.loop_lag`)."""
    token = secrets.token_urlsafe(24)
    workspace = make_workspace(ctx)
    agent = "toolwire.benchmarks.toolwire_server"
    modules = {
        "echo": ("toolwire.benchmarks.echo_server", []),
        "echo-wsproto": ("toolwire.benchmarks.wsproto_echo_server", []),
        "toolwire": (
            agent,
            [f"--workspace={workspace}", "--journal=sqlite", f"--state-dir={ctx.scratch('state')}"],
        ),
        "toolwire-normal": (
            agent,
            [
                f"--workspace={workspace}",
                "--journal=sqlite",
                "--sync=normal",
                f"--state-dir={ctx.scratch('state')}",
            ],
        ),
        "toolwire-nometrics": (
            agent,
            [
                f"--workspace={workspace}",
                "--journal=sqlite",
                f"--state-dir={ctx.scratch('state')}",
                "--no-metrics",
            ],
        ),
        "toolwire-memory": (agent, [f"--workspace={workspace}", "--journal=memory"]),
        "toolwire-skipcommits": (
            agent,
            [
                f"--workspace={workspace}",
                "--journal=sqlite",
                f"--state-dir={ctx.scratch('state')}",
                "--skip-commits",
            ],
        ),
        # Second agents with the same settings, for variants that must not share one agent's
        # history (bigwrite: calls alone must not pay for the big writes an agent did before).
        "toolwire-2": (
            agent,
            [f"--workspace={workspace}", "--journal=sqlite", f"--state-dir={ctx.scratch('state')}"],
        ),
        "toolwire-memory-2": (agent, [f"--workspace={workspace}", "--journal=memory"]),
        # On the same journal as `toolwire`: the comparison is of the wire design alone.
        "http": (
            "toolwire.benchmarks.http_baseline",
            [f"--workspace={workspace}", "--journal=sqlite", f"--state-dir={ctx.scratch('state')}"],
        ),
    }
    started = Servers(token, workspace, {})
    try:
        for name in names:
            module, args = modules[name]
            if not name.startswith("echo"):
                args = [*args, f"--token={token}"]  # `=`: a token may start with "-"
            probe = loop_lag and name in AGENT_SERVERS
            for_ref = current_build().is_ref
            if not (current_only and for_ref and name in AGENT_SERVERS):
                ctx.report(f"starting {module}")
                started.procs[name] = ServerProcess(
                    ctx.python, module, args, ctx.workdir, loop_lag=probe
                )
            wants_twin = not current_only or for_ref
            if ctx.against is not None and name in AGENT_SERVERS and wants_twin:
                _start_ref_twin(ctx, ctx.against, started, name, args, probe)
        yield started
    finally:
        for proc in [*started.procs.values(), *started.ref_procs.values()]:
            proc.stop()


def _start_ref_twin(
    ctx: BenchContext, ref: Build, started: Servers, name: str, args: list[str], probe: bool
) -> None:
    from toolwire.benchmarks.against import server_args

    # A state dir of its own: the twin must not open the working tree's agent's journal.
    args = [
        f"--state-dir={ctx.scratch('state-ref')}" if arg.startswith("--state-dir=") else arg
        for arg in args
    ]
    try:
        ref_args = server_args(ref, args, name)
    except RefUnavailable as exc:
        started.ref_unavailable[name] = str(exc)
        return
    module = ref.module("toolwire_server")
    ctx.report(f"starting {module} of REF {ref.label}")
    started.ref_procs[name] = ServerProcess(
        ref.python, module, ref_args, ctx.workdir, env=ref.env, loop_lag=probe
    )


def timed_ws(
    server: ServerProcess,
    body: Callable[[WsConn], Awaitable[int]],
    *,
    token: str | None = None,
    subprotocol: str | None = None,
    warmup: Callable[[WsConn], Awaitable[object]] | None = None,
) -> Timed:
    """Connect, warm up, then time `body` (which returns how many operations it did)."""

    async def main() -> Timed:
        async with ws_connect(server.port, token=token, subprotocol=subprotocol) as conn:
            if warmup is not None:
                await warmup(conn)
            conn.counter.reset()
            meter = CpuMeter(server.pid)
            meter.start()
            t0 = time.perf_counter()
            ops = await body(conn)
            seconds = time.perf_counter() - t0
            meter.stop()
            return Timed(
                ops,
                seconds,
                meter.client_s,
                meter.server_s,
                conn.counter.total,
                meter.server_threads,
            )

    return trio.run(main)


def pipelined_execute_true(
    server: ServerProcess,
    token: str | None,
    chat: str,
    n: int,
    in_flight: int,
    *,
    sandbox: dict[str, Any] | None = None,
) -> Timed:
    """`n` calls of `execute true` in one chat, `in_flight` at a time, after 20 (or `n`) of
    warm-up: the commands-per-second row that the process, sandbox and peers scenarios share."""
    codec = Codec("json")

    def frames(prefix: str, count: int) -> list[str | bytes]:
        return [
            codec.call(
                chat, f"{prefix}{i}", "execute", {"command": "true"}, stream=False, sandbox=sandbox
            )
            for i in range(count)
        ]

    timed, warm = frames("p", n), frames("w", min(n, 20))
    return timed_ws(
        server,
        lambda conn: pipelined_calls(conn, codec, timed, in_flight),
        token=token,
        subprotocol=codec.subprotocol,
        warmup=lambda conn: pipelined_calls(conn, codec, warm, in_flight),
    )
