"""Run one seed (or many, in parallel processes) and report what the checker found."""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import trio

from toolwire.actors.chat_state import ChatState
from toolwire.simulation.checker import check
from toolwire.simulation.orchestrator import ChatDriver
from toolwire.simulation.planted import PLANTED
from toolwire.simulation.scenario import SHARED_FILES, Plan, make_plan, scenario_for
from toolwire.simulation.trace import EFFECT, EV, REQ, Trace, render_lines
from toolwire.simulation.virtual_trio import deterministic_scheduling, run_in_virtual_time
from toolwire.simulation.world import (
    World,
    instrumented,
    make_workspace,
    quiet_runtime_logs,
    remove_workspace,
)


@dataclass
class SeedResult:
    seed: int
    scenario: str
    wire: bool = False  # connections went through the real WebSocket server
    mode: str = "agent"  # agent / wire / pure (simulation/modes.py)
    calls: int = 0
    requests: int = 0
    events: int = 0
    effects: int = 0
    entries: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    digest: str | None = None
    virtual_s: float = 0.0
    wall_s: float = 0.0
    trace: list[str] | None = None

    @property
    def ok(self) -> bool:
        return not self.violations


def run_world(
    seed: int,
    scenario: str = "mix",
    *,
    plant: str | None = None,
    keep_trace: bool = False,
    digest: bool = False,
    plan: Plan | None = None,
) -> SeedResult:
    """Run one seed: build its plan (or take the one given), run the world in virtual time,
    then check the trace. Deterministic: the same arguments give the same trace."""
    started = time.perf_counter()
    sc = scenario_for(scenario, seed)
    if plan is None:
        plan = make_plan(seed, sc)
    else:
        sc = plan.scenario
    state_class = PLANTED[plant] if plant else ChatState
    result = SeedResult(
        seed=seed, scenario=sc.name, wire=plan.wire, mode="wire" if plan.wire else "agent"
    )
    workspace = make_workspace(plan.files)
    trace = Trace()
    try:
        world = World(plan, workspace, state_class=state_class, trace=trace)
        drivers = [ChatDriver(world, chat) for chat in plan.chats]
        runs = [d.run for d in drivers]
        end = [0.0]

        async def main() -> None:
            try:
                await world.run(runs)
            finally:
                end[0] = trio.current_time()

        deterministic_scheduling(seed)
        crashed: list[str] = []
        with quiet_runtime_logs(), instrumented(world):
            try:
                run_in_virtual_time(main)
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                crashed.append("".join(traceback.format_exception(exc)).strip().splitlines()[-1])
                crashed.append("".join(traceback.format_exception(exc)))
        stuck = list(world.stuck)
        stop_errors = list(dict.fromkeys(world.stop_errors))
        if stuck:
            stuck.extend(f"unfinished: {d.describe()}" for d in drivers if d.state is not None)
        violations = check(
            trace.entries,
            calls=world.calls,
            processes=world.processes,
            workspace=workspace,
            approval_timeout_s=plan.approval_timeout_s,
            end_time=end[0],
            stuck=stuck,
            shared_files={p: plan.files[p] for p in SHARED_FILES if p in plan.files},
            kill_grace_s=plan.kill_grace_s,
        )
        result.violations = [str(v) for v in violations]
        for error in stop_errors:
            result.violations.append(
                f"[l.stop_raised] stopping the agent (a crash) raised instead of ending quietly: "
                f"{error}"
            )
        if crashed:
            result.violations.insert(0, f"[l.exception] the run raised: {crashed[0]}\n{crashed[1]}")
        result.virtual_s = end[0]
    finally:
        remove_workspace(workspace)
    counts = Counter(e[0] for e in trace.entries)
    result.calls = len(world.calls)
    result.requests = counts[REQ]
    result.events = counts[EV]
    result.effects = counts[EFFECT]
    result.entries = len(trace.entries)
    result.faults = dict(sorted(trace.faults.items()))
    if digest or keep_trace:
        result.digest = trace.digest()
    if keep_trace:
        result.trace = render_lines(trace.entries)
    result.wall_s = time.perf_counter() - started
    return result


def chunks(seeds: list[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(seeds), size):
        yield seeds[i : i + size]
