"""Scenario `request_cost`: what one request costs per id it names, from 10 to 10,000 ids.

Issue 27: a `cancel` of 20,000 unknown ids took 28.5 s in a real agent, during which every
other chat waited; the chat's state machine asked every pending reply again after each input,
and a turn's planner compared each call with every other one of its segment. This measures the
pure `ChatState` (with a journal, as `toolwire serve` runs it: each durable row is one more
input) taking a request and every completion it causes, for each request that names many
calls: a cancel of unknown ids and of parked calls, an interrupt of parked calls and of a
turn, a close_chat, a whole turn of reads (one segment, run 8 at a time) and of writes of one
file (one segment each). Time per id at 10,000 ids against time per id at 10 ids, side by
side in one run: flat means linear. tests/test_request_cost.py checks the same requests by
counting the work, deterministically.

The sizes go past `max_ids_per_request` (1,000) on purpose: the limit bounds the line, and the
curve shows the work per id would stay flat past it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from toolwire.actors import effects as fx
from toolwire.actors.calls import CallSpec
from toolwire.actors.chat_state import ChatConfig, ChatState
from toolwire.actors.reservations import reserve
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.results import Outcome, ToolReport
from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    ScenarioResult,
    run_side_by_side,
)

CONN = "bench-conn"
WORKSPACE = "/nonexistent-workspace"
# Work per id at the largest size may be at most this many times that at 10 ids.
FLAT_RATIO = 2.0


def chat_state(max_ids: int = 1_000_000) -> ChatState:
    """A chat as `toolwire serve` runs it (a journal: every row waits for its commit), with no
    bound on the ids of one request, so the curve can go past the limit."""
    config = ChatConfig(
        max_processes_per_chat=64,
        forget_after_s=3600,
        kill_grace_s=2.0,
        journal_enabled=True,
        max_ids_per_request=max_ids,
    )
    return ChatState("chat", config, ResultCache())


def turn_request(specs: tuple[CallSpec, ...], *, stream: bool) -> fx.TurnRequest:
    return fx.TurnRequest(CONN, "turn", specs, stream, None)


def drive(state: ChatState, first: fx.Input) -> list[fx.Effect]:
    """Apply `first`, then every completion its effects report, one input at a time as the
    shell does (each durable row, each tool's end and a turn's plan is one more `handle`).
    Returns what was sent to connections."""
    inbox = [first]
    sent: list[fx.Effect] = []
    index = 0
    while index < len(inbox):
        event = inbox[index]
        index += 1
        for effect in state.handle(event, 0.0, 1_000):
            if isinstance(effect, fx.JournalWrite | fx.JournalClose):
                if effect.then is not None:
                    inbox.append(effect.then)
            elif isinstance(effect, fx.ResolveTurn):
                # As the shell does (its paths resolved against a workspace that does not
                # exist: nothing on disk to see).
                found = reserve(effect.specs, WORKSPACE)
                inbox.append(fx.TurnPlanned(effect.turn_id, found))
            elif isinstance(effect, fx.RunTool):
                report = ToolReport(outcome=Outcome.COMPLETED, text="done")
                inbox.append(fx.ToolEnded(effect.call_id, report))
            elif isinstance(effect, fx.Send):
                sent.append(effect)
    return sent


def _park(state: ChatState, n: int) -> None:
    for i in range(n):
        spec = CallSpec(f"gate-{i}", "read_file", {"path": f"f{i}"}, approval=True)
        drive(state, fx.CallRequest(CONN, spec, True, None))


def reads(n: int) -> tuple[CallSpec, ...]:
    return tuple(CallSpec(f"read-{i}", "read_file", {"path": f"dir/f{i}"}) for i in range(n))


def _cancel_unknown(n: int) -> tuple[ChatState, fx.Input]:
    return chat_state(), fx.CancelRequest(CONN, tuple(f"id-{i}" for i in range(n)), None)


def _cancel_parked(n: int) -> tuple[ChatState, fx.Input]:
    state = chat_state()
    _park(state, n)
    return state, fx.CancelRequest(CONN, tuple(f"gate-{i}" for i in range(n)), None)


def _interrupt_parked(n: int) -> tuple[ChatState, fx.Input]:
    state = chat_state()
    _park(state, n)
    return state, fx.InterruptRequest(CONN, None, None)


def _interrupt_turn(n: int) -> tuple[ChatState, fx.Input]:
    """A turn of n gated reads: one segment, 8 parked at once, the rest waiting for a slot."""
    state = chat_state()
    specs = tuple(
        CallSpec(f"t-{i}", "read_file", {"path": f"d/f{i}"}, approval=True) for i in range(n)
    )
    drive(state, turn_request(specs, stream=True))
    return state, fx.InterruptRequest(CONN, "turn", None)


def _close_parked(n: int) -> tuple[ChatState, fx.Input]:
    state = chat_state()
    _park(state, n)
    return state, fx.CloseChatRequest(CONN, None)


def _turn_of_reads(n: int) -> tuple[ChatState, fx.Input]:
    """Planned (n distinct paths: one segment), run 8 at a time, answered."""
    return chat_state(), turn_request(reads(n), stream=True)


def _turn_of_writes(n: int) -> tuple[ChatState, fx.Input]:
    """n writes of one file: each conflicts with the one before, n segments in a row."""
    specs = tuple(
        CallSpec(f"w-{i}", "write_file", {"path": "same", "content": "x"}) for i in range(n)
    )
    return chat_state(), turn_request(specs, stream=False)


# Each request that names many calls: n -> (the chat set up, uncounted; the request).
REQUESTS: dict[str, Callable[[int], tuple[ChatState, fx.Input]]] = {
    "cancel_unknown": _cancel_unknown,
    "cancel_parked": _cancel_parked,
    "interrupt_parked": _interrupt_parked,
    "interrupt_turn": _interrupt_turn,
    "close_chat_parked": _close_parked,
    "turn_reads": _turn_of_reads,
    "turn_writes": _turn_of_writes,
}
LABELS = {
    "cancel_unknown": "cancel of unknown ids",
    "cancel_parked": "cancel of parked calls",
    "interrupt_parked": "interrupt of parked calls",
    "interrupt_turn": "interrupt of a turn's calls",
    "close_chat_parked": "close_chat of parked calls",
    "turn_reads": "turn of reads (one segment)",
    "turn_writes": "turn of writes of one file (a segment each)",
}


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    sizes = [10, 100, 1_000, 10_000] if not ctx.quick else [10, 100, 1_000]
    repeats = ctx.repeats(5)
    res.params = {"sizes": sizes, "repeats": repeats, "journal": "every row one more input"}
    per_id = {
        (kind, n): res.measurement(
            f"{kind}_{n}", f"{LABELS[kind]}, {n} ids", "us/id", higher_is_better=False
        )
        for kind in REQUESTS
        for n in sizes
    }

    def variant(kind: str, n: int) -> Callable[[int], None]:
        def measure(_repeat: int) -> None:
            state, request = REQUESTS[kind](n)
            t0 = time.perf_counter()
            drive(state, request)
            per_id[(kind, n)].add((time.perf_counter() - t0) * 1e6 / n)

        return measure

    if ctx.against is not None:
        # Nothing here is an agent server REF's interpreter could run: these rows are the
        # working tree's alone (REF's own `request_cost` is its own run of this scenario).
        res.notes.append(
            f"--against {ctx.against.label}: not run on REF (this scenario drives the working"
            " tree's ChatState inside the benchmark's own process, no agent server)"
        )
    variants = [variant(kind, n) for kind in REQUESTS for n in sizes]
    run_side_by_side(ctx, "request_cost", variants, repeats)
    largest = sizes[-1]
    res.comparisons = [
        Comparison(
            f"{LABELS[kind]}: time per id at {largest:,} ids vs at 10 ids",
            f"{kind}_{largest}",
            f"{kind}_10",
            goal=Goal("ratio<=", FLAT_RATIO, f"<= {FLAT_RATIO}x (flat: linear in the ids)"),
        )
        for kind in REQUESTS
    ]
    return res
