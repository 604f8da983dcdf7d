"""Explicit operation lists for the simulation's property-based test (tests/test_simulation.py:
hypothesis draws a `Program`).

A `Program` fixes the shape of a run (chats, messages, calls per message) and lists its
operations: faults at virtual times (drop a connection, stall a reader, crash the agent) and
orchestrator moves during a given message (interrupt, cancel, hand the chat to another
replica). Everything else (which tools, what the commands print) comes from the seed. Shrinking
a failing program removes operations and calls until the smallest world that still fails is
left; `run_program` replays it deterministically like any seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from toolwire.simulation.runner import SeedResult, run_world
from toolwire.simulation.scenario import SCENARIOS, Plan, make_plan

FAULT_KINDS = ("drop", "stall", "crash")
MOVE_KINDS = ("interrupt", "cancel", "takeover")


@dataclass(frozen=True)
class Fault:
    at: float  # virtual seconds
    kind: str  # drop / stall / crash


@dataclass(frozen=True)
class Move:
    chat: int
    message: int
    delay: float  # virtual seconds after the message was sent
    kind: str  # interrupt / cancel / takeover


@dataclass(frozen=True)
class Program:
    seed: int
    chats: int = 1
    messages: int = 1
    calls: int = 2
    replicas: int = 2
    turn_share: float = 0.5
    gated_share: float = 0.0
    duplicate_share: float = 0.0
    faults: tuple[Fault, ...] = ()
    moves: tuple[Move, ...] = ()
    rmw_cycles: float = 0.0  # read-modify-write cycles per chat (mean), on the shared files


def plan_for(program: Program) -> Plan:
    scenario = replace(
        SCENARIOS["calm"],
        name="ops",
        description="a hypothesis-drawn program",
        chats=(program.chats, program.chats),
        messages=(program.messages, program.messages),
        calls=(program.calls, program.calls),
        replicas=(program.replicas, program.replicas),
        turn_share=program.turn_share,
        gated_share=program.gated_share,
        duplicate_share=program.duplicate_share,
        policy_share=0.0,
        rmw_cycles=program.rmw_cycles,
    )
    plan = make_plan(program.seed, scenario)
    plan.faults = sorted((f.at, f.kind) for f in program.faults)
    for move in program.moves:
        if move.chat < len(plan.chats) and move.message < len(plan.chats[move.chat].messages):
            plan.chats[move.chat].messages[move.message].moves.append((move.delay, move.kind))
    return plan


def run_program(
    program: Program, *, plant: str | None = None, keep_trace: bool = False
) -> SeedResult:
    return run_world(program.seed, plant=plant, keep_trace=keep_trace, plan=plan_for(program))
