"""Scenario `sandbox`: what confining a command costs (PROTOCOL.md 10.4, issue 32).

`execute true` (`sh -c true`, `stream: false`) over one WebSocket to one `toolwire serve`, at 1
and at 8 in flight, each call once with `sandbox: {"filesystem": "workspace_write", "network":
false}` (the command is spawned by the confined thread of that policy, Landlock and the TCP
socket filter in force: actors/confined.py) and once without, in the same run and rotation. The
goal of issue 32: sandboxed >= 0.9x unsandboxed (Codex's read-only sandbox, measured in the
issue: 0.2x).
"""

from __future__ import annotations

from typing import Any

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    ScenarioResult,
    agent,
    run_side_by_side,
)
from toolwire.benchmarks.scenarios.common import pipelined_execute_true, servers

CONCURRENCY = (1, 8)
SANDBOX = {"filesystem": "workspace_write", "network": False}


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    n_calls = ctx.size(2_000, 40)
    repeats = ctx.repeats(5)
    res.params = {
        "calls_per_variant": n_calls,
        "concurrency": list(CONCURRENCY),
        "command": "true (via /bin/sh -c)",
        "sandbox": SANDBOX,
        "repeats": repeats,
    }
    kinds = {"plain": None, "sandboxed": SANDBOX}
    meas = {
        (kind, c): res.measurement(
            f"{kind}_c{c}",
            f"execute true, {c} in flight, "
            + ("no sandbox" if sandbox is None else "workspace_write, network false"),
            "calls/s",
        )
        for kind, sandbox in kinds.items()
        for c in CONCURRENCY
    }

    with servers(ctx, "toolwire") as srv:

        def variant(kind: str, c: int) -> Any:
            def measure(r: int) -> None:
                pipelined_execute_true(
                    srv["toolwire"],
                    srv.token,
                    f"sandbox-{kind}-{c}-{r}",
                    n_calls,
                    c,
                    sandbox=kinds[kind],
                ).record(meas[(kind, c)])

            return agent(measure)

        variants = [variant(kind, c) for c in CONCURRENCY for kind in kinds]
        run_side_by_side(ctx, "sandbox", variants, repeats)

    for c in CONCURRENCY:
        res.comparisons.append(
            Comparison(
                f"execute true, {c} in flight, sandboxed vs unsandboxed",
                f"sandboxed_c{c}",
                f"plain_c{c}",
                goal=Goal("ratio>=", 0.9, ">= 0.9x unsandboxed"),
            )
        )
    return res
