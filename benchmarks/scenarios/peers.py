"""Scenario `peers`: toolwire beside a real peer, OpenAI's Codex app-server (`command/exec`).

Both run commands for a client in the same run, alternated, on their fastest honest settings:
toolwire on `toolwire serve`'s defaults (SQLite journal, sync full), over one WebSocket; Codex's
app-server on its unsandboxed setting (`sandboxPolicy: {"type": "dangerFullAccess"}`), over its
stdin/stdout (`benchmarks/codex_peer.py`). Both run the command through the same shell (toolwire's
`execute` always runs `/bin/sh -c COMMAND`; Codex is given that argv). Measured:
- `true`, one at a time and 16 in flight: commands/s;
- the first output byte of `echo x; sleep 0.3`: from sending the request to the first output
  (toolwire's `output` event; Codex's `command/exec/outputDelta`, with `streamStdoutStderr`);
- resident memory (VmRSS) of a fresh server, idle once it answered its handshake, and after
  200 `true` commands (one at a time).

Found through `toolwire bench --codex PATH` or `$TOOLWIRE_BENCH_CODEX`; without either the
scenario is skipped (a "skipped: ..." line, no rows), as in CI, which does not install it.
"""

from __future__ import annotations

import functools
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from toolwire.benchmarks.codex_peer import CodexAppServer, codex_app_server, find_codex
from toolwire.benchmarks.core import (
    AgentVariant,
    BenchContext,
    Comparison,
    Goal,
    Measurement,
    ScenarioResult,
    Variant,
    agent,
    run_side_by_side,
)
from toolwire.benchmarks.procs import ServerProcess, rss_bytes
from toolwire.benchmarks.scenarios.common import pipelined_execute_true, servers
from toolwire.benchmarks.scenarios.reqresp import toolwire_first_byte
from toolwire.benchmarks.wire import Codec, pipelined_calls, ws_connect

CONCURRENCY = (1, 16)
RSS_COMMANDS = 200
# How long an idle server is left before its RSS is read: what it does right after its start
# (a first config read, lazy allocations) is over by then.
IDLE_SETTLE_S = 0.5
MIB = 1024 * 1024
# `echo x` prints at once; a first byte this late means the peer is broken, not slow.
FIRST_BYTE_TIMEOUT_S = 30.0


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    binary, why_not = find_codex(ctx.codex)
    if binary is None:
        res.skipped = why_not
        return res
    n_commands = ctx.size(1_000, 40)
    ttfb_trials = ctx.size(30, 3)
    sleep_s = ctx.seconds(0.3, 0.05)
    command = f"echo x; sleep {sleep_s:g}"
    repeats = ctx.repeats(5)
    res.params = {
        "codex": binary,
        "codex_sandbox": "dangerFullAccess",
        "commands_per_variant": n_commands,
        "concurrency": list(CONCURRENCY),
        "command": "true (via /bin/sh -c, both)",
        "ttfb_command": command,
        "ttfb_trials_per_repeat": ttfb_trials,
        "rss_after_commands": RSS_COMMANDS,
        "repeats": repeats,
    }
    tw_rate = {
        c: res.measurement(f"toolwire_c{c}", f"toolwire execute true, {c} in flight", "calls/s")
        for c in CONCURRENCY
    }
    cx_rate = {
        c: res.measurement(f"codex_c{c}", f"Codex command/exec true, {c} in flight", "commands/s")
        for c in CONCURRENCY
    }
    tw_ttfb = res.measurement(
        "toolwire_ttfb", "toolwire time to first output byte", "ms", higher_is_better=False
    )
    cx_ttfb = res.measurement(
        "codex_ttfb", "Codex time to first output byte", "ms", higher_is_better=False
    )
    rss = {
        (who, when): res.measurement(
            f"{who}_rss_{when}_mib",
            f"{'toolwire' if who == 'toolwire' else 'Codex app-server'} RSS, "
            + ("idle" if when == "idle" else f"after {RSS_COMMANDS} commands"),
            "MiB",
            higher_is_better=False,
        )
        for who in ("toolwire", "codex")
        for when in ("idle", "after")
    }
    rng = random.Random(29)
    workspace = ctx.scratch("peers-workspace")

    def codex_session(body: Callable[[CodexAppServer], Awaitable[None]]) -> None:
        """A fresh app-server (a CODEX_HOME of its own) for one variant's run of `body`."""
        home = Path(tempfile.mkdtemp(prefix="codex-home-", dir=ctx.workdir))

        async def main() -> None:
            async with codex_app_server(binary, workspace, home, log) as server:
                await body(server)

        with open(ctx.workdir / "codex-app-server.log", "ab") as log:
            trio.run(main)

    with servers(ctx, "toolwire") as srv:

        def toolwire_rate(r: int, c: int) -> None:
            pipelined_execute_true(
                srv["toolwire"], srv.token, f"peers-{c}-{r}", n_commands, c
            ).record(tw_rate[c])

        def codex_rate(r: int, c: int) -> None:
            async def body(server: CodexAppServer) -> None:
                await _codex_commands(server, min(n_commands, 20), c)  # warm-up
                t0 = time.perf_counter()
                await _codex_commands(server, n_commands, c)
                cx_rate[c].add(n_commands / (time.perf_counter() - t0))

            codex_session(body)

        def toolwire_ttfb(r: int) -> None:
            trio.run(
                toolwire_first_byte, srv["toolwire"], srv.token, f"peers-ttfb-{r}", command,
                ttfb_trials, tw_ttfb, rng,
            )  # fmt: skip

        def codex_ttfb(r: int) -> None:
            async def body(server: CodexAppServer) -> None:
                samples = await _codex_ttfb(server, command, ttfb_trials, rng)
                cx_ttfb.add_samples(samples)
                cx_ttfb.add(statistics.median(samples))

            codex_session(body)

        def toolwire_rss(r: int) -> None:
            # A fresh agent: the one the rates ran on holds their records.
            with servers(ctx, "toolwire-2", current_only=True) as fresh:
                server = fresh["toolwire-2"]
                trio.run(_toolwire_rss, server, fresh.token, rss[("toolwire", "idle")],
                         rss[("toolwire", "after")])  # fmt: skip

        def codex_rss(r: int) -> None:
            async def body(server: CodexAppServer) -> None:
                await trio.sleep(IDLE_SETTLE_S)
                rss[("codex", "idle")].add(rss_bytes(server.pid) / MIB)
                await _codex_commands(server, RSS_COMMANDS, 1)
                rss[("codex", "after")].add(rss_bytes(server.pid) / MIB)

            codex_session(body)

        variants: list[Variant | AgentVariant] = [
            *(agent(functools.partial(toolwire_rate, c=c)) for c in CONCURRENCY),
            *(functools.partial(codex_rate, c=c) for c in CONCURRENCY),
            agent(toolwire_ttfb),
            codex_ttfb,
            agent(toolwire_rss),
            codex_rss,
        ]
        run_side_by_side(ctx, "peers", variants, repeats)

    for c in CONCURRENCY:
        res.comparisons.append(
            Comparison(
                f"execute true, {c} in flight, vs Codex app-server command/exec (unsandboxed)",
                f"toolwire_c{c}",
                f"codex_c{c}",
                goal=Goal("ratio>=", 2.0, ">= 2x Codex"),
            )
        )
    res.comparisons += [
        Comparison(
            "time to first output byte vs Codex app-server (p50)",
            "toolwire_ttfb",
            "codex_ttfb",
            stat="p50",
            goal=Goal("ratio<=", 0.5, "<= 0.5x Codex"),
        ),
        Comparison(
            "time to first output byte vs Codex app-server (p99)",
            "toolwire_ttfb",
            "codex_ttfb",
            stat="p99",
        ),
        Comparison("RSS idle vs Codex app-server", "toolwire_rss_idle_mib", "codex_rss_idle_mib"),
        Comparison(
            f"RSS after {RSS_COMMANDS} commands vs Codex app-server",
            "toolwire_rss_after_mib",
            "codex_rss_after_mib",
        ),
    ]
    return res


async def _codex_commands(server: CodexAppServer, n: int, concurrency: int) -> None:
    """`n` commands of `true`, `concurrency` in flight; each must exit 0."""
    left = iter(range(n))

    async def worker() -> None:
        for _ in left:
            result = await server.exec(["/bin/sh", "-c", "true"])
            if result.get("exitCode") != 0:
                raise RuntimeError(f"Codex ran `true` with exit {result.get('exitCode')}")

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)


async def _codex_ttfb(
    server: CodexAppServer, command: str, trials: int, rng: random.Random
) -> list[float]:
    samples: list[float] = []
    first: dict[str, trio.Event] = {}

    def on_notification(message: dict[str, object]) -> None:
        params = message.get("params")
        if message.get("method") == "command/exec/outputDelta" and isinstance(params, dict):
            seen = first.get(str(params.get("processId")))
            if seen is not None:
                seen.set()

    server.on_notification = on_notification
    for i in range(trials):
        await trio.sleep(rng.uniform(0.0, 0.02))
        process_id = f"ttfb-{i}"
        first[process_id] = trio.Event()
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            run = functools.partial(
                server.exec, ["/bin/sh", "-c", command], processId=process_id,
                streamStdoutStderr=True,
            )  # fmt: skip
            nursery.start_soon(run)
            with trio.fail_after(FIRST_BYTE_TIMEOUT_S):  # no output at all: a broken peer
                await first[process_id].wait()
            samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def _toolwire_rss(
    server: ServerProcess, token: str, idle: Measurement, after: Measurement
) -> None:
    codec = Codec("json")
    frames = [
        codec.call("peers-rss", f"r{i}", "execute", {"command": "true"}, stream=False)
        for i in range(RSS_COMMANDS)
    ]
    async with ws_connect(server.port, token=token, subprotocol=codec.subprotocol) as conn:
        await trio.sleep(IDLE_SETTLE_S)
        idle.add(server.rss_bytes() / MIB)
        await pipelined_calls(conn, codec, frames, 1)
        after.add(server.rss_bytes() / MIB)
