"""Which way each seed runs: through the real agent (`agent`), through the real WebSocket server
in front of it (`wire`, the wire slice), or against pure `ChatState`s with no trio (`pure`,
simulation/pure_seed.py). `toolwire sim --mode mix` (the default) gives each seed the mode its
plan and a stream of its own (`"<seed>/mode"`) choose; `--mode agent|wire|pure` forces one,
which replays a seed in the mode it failed in.
"""

from __future__ import annotations

import random
import time
import traceback
from collections import Counter
from dataclasses import replace

from toolwire.simulation.planted import PLANTED
from toolwire.simulation.pure_seed import PureOutcome, play
from toolwire.simulation.runner import SeedResult, run_world
from toolwire.simulation.scenario import Plan, make_plan, scenario_for
from toolwire.simulation.trace import EFFECT, EV, REQ, Trace, render_lines

MODES = ("mix", "agent", "wire", "pure")
# Of the seeds outside the wire slice, the share that runs pure. A pure seed costs a small
# fraction of an agent seed, so this buys many more schedules per second without taking the
# real shell (pipes, outboxes, followers, the journal's code) out of most seeds.
PURE_SHARE = 0.3


def mode_for(seed: int, plan: Plan) -> str:
    """The mode of a seed in the mix: the wire slice keeps its share (plan.wire), then a seeded
    draw splits the rest between the pure mode and the real agent."""
    if plan.wire:
        return "wire"
    return "pure" if random.Random(f"{seed}/mode").random() < PURE_SHARE else "agent"


def run_pure_seed(
    seed: int,
    scenario: str = "mix",
    *,
    plant: str | None = None,
    keep_trace: bool = False,
    digest: bool = False,
    plan: Plan | None = None,
) -> SeedResult:
    """One seed's plan against pure ChatStates (simulation/pure_seed.py): deterministic, no
    trio. Its violations use the checker's codes."""
    started = time.perf_counter()
    if plan is None:
        plan = make_plan(seed, scenario_for(scenario, seed))
    state_class = PLANTED[plant] if plant else None
    try:
        outcome = play(plan, state_class) if state_class is not None else play(plan)
    except Exception as exc:  # a bug of ChatState (or of the model): reported, not fatal
        text = "".join(traceback.format_exception(exc))
        last = text.strip().splitlines()[-1]
        outcome = PureOutcome([f"[l.exception] the run raised: {last}\n{text}"], Trace(), 0, 0.0)
    trace = outcome.trace
    counts = Counter(e[0] for e in trace.entries)
    result = SeedResult(
        seed=seed,
        scenario=plan.scenario.name,
        wire=False,
        mode="pure",
        calls=outcome.calls,
        requests=counts[REQ],
        events=counts[EV],
        effects=counts[EFFECT],
        entries=len(trace.entries),
        faults=dict(sorted(trace.faults.items())),
        violations=outcome.violations,
        virtual_s=outcome.virtual_s,
    )
    if digest or keep_trace:
        result.digest = trace.digest()
    if keep_trace:
        result.trace = render_lines(trace.entries)
    result.wall_s = time.perf_counter() - started
    return result


def run_seed(
    seed: int,
    scenario: str = "mix",
    *,
    mode: str = "mix",
    plant: str | None = None,
    keep_trace: bool = False,
    digest: bool = False,
) -> SeedResult:
    """One seed in its mode (see the module docstring)."""
    plan = make_plan(seed, scenario_for(scenario, seed))
    chosen = mode_for(seed, plan) if mode == "mix" else mode
    if chosen == "pure":
        return run_pure_seed(seed, plant=plant, keep_trace=keep_trace, digest=digest, plan=plan)
    if chosen not in ("agent", "wire"):
        raise ValueError(f"unknown mode {mode!r}")
    plan = replace(plan, wire=chosen == "wire")
    return run_world(seed, plant=plant, keep_trace=keep_trace, digest=digest, plan=plan)


def run_mode_seeds(
    seeds: list[int], scenario: str, plant: str | None, mode: str = "mix"
) -> list[SeedResult]:
    """One worker's share (kept small in the parent: no traces)."""
    return [run_seed(seed, scenario, mode=mode, plant=plant) for seed in seeds]
