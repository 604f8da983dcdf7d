"""Scenario `journal`: what durability costs per call.

Two agents run side by side, each in its own process: one with the SQLite journal that
`toolwire serve` uses by default (WAL, synchronous=FULL, group commit on a worker thread), one
with the memory journal (nothing survives a restart). The same trivial calls (`read_file`,
`stream: false`, pipelined with a window of 64) and the same `execute true` calls (8 in flight)
go to both. Every call costs the SQLite agent at least two durable writes before it may answer
(the start before the effect, the result before the reply); group commit shares each fsync
among every call queued meanwhile, which is what the window of 64 lets it do.
"""

from __future__ import annotations

from toolwire.benchmarks.core import BenchContext, Comparison, ScenarioResult, run_side_by_side
from toolwire.benchmarks.scenarios.common import TRIVIAL_ARGS, servers, timed_ws
from toolwire.benchmarks.wire import Codec, pipelined_calls

WINDOW = 64
PROCESS_WINDOW = 8


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    n_calls = ctx.size(6_000, 200)
    n_exec = ctx.size(600, 40)
    repeats = ctx.repeats(3)
    res.params = {
        "window": WINDOW,
        "trivial_calls": n_calls,
        "execute_calls": n_exec,
        "execute_window": PROCESS_WINDOW,
        "repeats": repeats,
        "sqlite": "WAL, synchronous=FULL, group commit",
    }
    labels = {"toolwire": "memory journal", "toolwire-sqlite": "sqlite journal"}
    trivial = {
        name: res.measurement(f"trivial_{name}", f"trivial calls, {label}", "calls/s")
        for name, label in labels.items()
    }
    execute = {
        name: res.measurement(f"execute_{name}", f"execute true, {label}", "calls/s")
        for name, label in labels.items()
    }

    with servers(ctx, "toolwire", "toolwire-sqlite") as srv:

        def calls(name: str, tool: str, args: dict[str, str], n: int, window: int, r: int) -> None:
            codec = Codec("json")
            chat = f"journal-{tool}-{name}-{r}"
            frames = [codec.call(chat, f"c{i}", tool, args, stream=False) for i in range(n)]
            warm = [codec.call(chat, f"w{i}", tool, args, stream=False) for i in range(min(n, 50))]
            target = trivial if tool == "read_file" else execute
            timed_ws(
                srv[name],
                lambda c: pipelined_calls(c, codec, frames, window),
                token=srv.token,
                subprotocol=codec.subprotocol,
                warmup=lambda c: pipelined_calls(c, codec, warm, window),
            ).record(target[name])

        variants = [
            lambda r, name=name, tool=tool: calls(
                name,
                tool,
                TRIVIAL_ARGS if tool == "read_file" else {"command": "true"},
                n_calls if tool == "read_file" else n_exec,
                WINDOW if tool == "read_file" else PROCESS_WINDOW,
                r,
            )
            for name in labels
            for tool in ("read_file", "execute")
        ]
        run_side_by_side(ctx, "journal", variants, repeats)

    res.comparisons = [
        Comparison(
            "trivial calls/s with the sqlite journal vs the memory journal",
            "trivial_toolwire-sqlite",
            "trivial_toolwire",
        ),
        Comparison(
            "execute true calls/s with the sqlite journal vs the memory journal",
            "execute_toolwire-sqlite",
            "execute_toolwire",
        ),
    ]
    return res
