"""Scenario `process`: how close `execute true` comes to the machine's own process limit.

Side by side, at 1 and at 8 in flight:
- toolwire: `execute` of `true` (`sh -c true`; `true` is a shell builtin, so one process per
  call, as below), `stream: false`, over one WebSocket to the server process;
- bare trio: `trio.run_process(["true"])` in a loop, in this process;
- the floor: `os.posix_spawn("/bin/true")` + `os.waitpid`, sequential, and 8 threads at once.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import trio

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    ScenarioResult,
    agent,
    run_side_by_side,
)
from toolwire.benchmarks.scenarios.common import Timed, pipelined_execute_true, servers

CONCURRENCY = (1, 8)


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    n_spawns = ctx.size(2_000, 40)
    repeats = ctx.repeats(5)
    true_path = shutil.which("true") or "/bin/true"
    res.params = {
        "spawns_per_variant": n_spawns,
        "concurrency": list(CONCURRENCY),
        "toolwire_command": "true (via /bin/sh -c)",
        "baseline_argv": [true_path],
        "repeats": repeats,
    }
    tw = {
        c: res.measurement(f"toolwire_c{c}", f"toolwire execute true, {c} in flight", "calls/s")
        for c in CONCURRENCY
    }
    trio_m = {
        c: res.measurement(f"trio_c{c}", f"trio.run_process, {c} in flight", "spawns/s")
        for c in CONCURRENCY
    }
    spawn_m = {
        c: res.measurement(
            f"posix_spawn_c{c}",
            f"os.posix_spawn + waitpid, {'sequential' if c == 1 else f'{c} threads'}",
            "spawns/s",
        )
        for c in CONCURRENCY
    }
    # `execute` always runs its command through /bin/sh -c (PROTOCOL.md 5.2): this floor spawns
    # that same shell, so the report separates the shell's own cost from toolwire's.
    shell_m = {
        c: res.measurement(
            f"posix_spawn_sh_c{c}",
            f"os.posix_spawn /bin/sh -c true + waitpid, "
            f"{'sequential' if c == 1 else f'{c} threads'}",
            "spawns/s",
        )
        for c in CONCURRENCY
    }
    env = dict(os.environ)

    with servers(ctx, "toolwire") as srv:

        def toolwire(r: int, c: int) -> None:
            pipelined_execute_true(
                srv["toolwire"], srv.token, f"process-{c}-{r}", n_spawns, c
            ).record(tw[c])

        def bare_trio(r: int, c: int) -> None:
            trio.run(_trio_spawns, true_path, n_spawns, c).record(trio_m[c])

        def posix_spawn(r: int, c: int) -> None:
            _posix_spawns(true_path, env, n_spawns, c).record(spawn_m[c])

        def posix_spawn_shell(r: int, c: int) -> None:
            _posix_spawns("/bin/sh", env, n_spawns, c, ["/bin/sh", "-c", "true"]).record(shell_m[c])

        def at(fn: Callable[[int, int], None], c: int) -> Callable[[int], None]:
            return lambda r: fn(r, c)

        variants = [
            agent(at(fn, c)) if fn is toolwire else at(fn, c)
            for c in CONCURRENCY
            for fn in (toolwire, bare_trio, posix_spawn, posix_spawn_shell)
        ]
        run_side_by_side(ctx, "process", variants, repeats)

    for c in CONCURRENCY:
        res.comparisons.append(
            Comparison(
                f"execute true, {c} in flight, vs posix_spawn+waitpid",
                f"toolwire_c{c}",
                f"posix_spawn_c{c}",
                goal=Goal("ratio>=", 0.6, ">= 0.6x posix_spawn"),
            )
        )
    for c in CONCURRENCY:
        res.comparisons.append(
            Comparison(
                f"execute true, {c} in flight, vs posix_spawn of the same /bin/sh -c true",
                f"toolwire_c{c}",
                f"posix_spawn_sh_c{c}",
            )
        )
    for c in CONCURRENCY:
        res.comparisons.append(
            Comparison(
                f"execute true, {c} in flight, vs bare trio.run_process",
                f"toolwire_c{c}",
                f"trio_c{c}",
            )
        )
    return res


async def _trio_spawns(argv0: str, n: int, concurrency: int) -> Timed:
    per_task = [n // concurrency + (1 if k < n % concurrency else 0) for k in range(concurrency)]

    async def loop(count: int) -> None:
        for _ in range(count):
            await trio.run_process([argv0])

    await loop(min(n, 10))  # warm-up
    t0 = time.perf_counter()
    c0 = time.process_time()
    async with trio.open_nursery() as nursery:
        for count in per_task:
            nursery.start_soon(loop, count)
    return Timed(n, time.perf_counter() - t0, time.process_time() - c0)


def _posix_spawns(
    path: str, env: dict[str, str], n: int, concurrency: int, argv: list[str] | None = None
) -> Timed:
    argv = argv or [path]

    def loop(count: int) -> None:
        for _ in range(count):
            pid = os.posix_spawn(path, argv, env)
            os.waitpid(pid, 0)

    loop(min(n, 10))  # warm-up
    per_thread = [n // concurrency + (1 if k < n % concurrency else 0) for k in range(concurrency)]
    t0 = time.perf_counter()
    c0 = time.process_time()
    if concurrency == 1:
        loop(n)
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(loop, per_thread))
    return Timed(n, time.perf_counter() - t0, time.process_time() - c0)
