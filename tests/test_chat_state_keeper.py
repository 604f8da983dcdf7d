"""What ChatState decides of a command the keeper held across a restart (PROTOCOL.md 10.1),
pure: the journal's rows come from the pure World (simulation/pure_world.py), then a new
ChatState gets `Restored` with what the keeper recorded (`KeptCall`) and its effects are read.
The real-process side is tests/test_keeper.py."""

from __future__ import annotations

from typing import Any

from toolwire.actors.calls import CallSpec
from toolwire.actors.chat_state import ChatState
from toolwire.actors.effects import (
    Adopt,
    Adopted,
    CallRequest,
    Effect,
    HolderGone,
    KeptCall,
    KillAfter,
    MarkTimedOut,
    ProcessExited,
    ProcessSnapshot,
    ReleaseKept,
    Restored,
    StartTimer,
)
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.results import (
    TEXT_AGENT_RESTARTED,
    TEXT_KEEPER_GONE,
    Outcome,
    Result,
    text_killed_after,
)
from toolwire.simulation.pure_world import World

PRINTED = ProcessSnapshot("k1", None, None, False, "printed\n", 8, 0)


def _running_row(args: dict[str, Any], *, background: bool = False) -> tuple[World, JournalRow]:
    """A command started and durable in the journal, as the agent had it when it died."""
    world = World(journal_keeps_results=True)
    spec = CallSpec("k1", "execute", args, background=background)
    assert world.request(CallRequest(world.conns[0], spec, False, None))
    for _ in range(5):  # its start row durable, so it spawns (the process is left running)
        world.commit(len(world.pending_writes))
    assert "k1" in world.procs and world.procs["k1"].state == "running"
    return world, world.committed["k1"]


def _restart(
    world: World, row: JournalRow, kept: KeptCall, after_s: float
) -> tuple[ChatState, list[Effect], float, int]:
    """A new agent `after_s` seconds later (both clocks: trio's starts anew at 0)."""
    state = ChatState("c", world.config, ResultCache(max_entries=2))
    now, wall = 0.0, world.wall_ms + int(after_s * 1000)
    return state, state.handle(Restored(row, now - 1.0, kept), now, wall), now, wall


def _result(effects: list[Effect]) -> Result | None:
    for effect in effects:
        result = getattr(effect, "row", None)
        if result is not None and result.result is not None:
            return result.result  # type: ignore[no-any-return]
    return None


def test_a_held_command_is_adopted_and_its_hard_deadline_counts_from_its_first_start() -> None:
    """10.1 and 9.2: re-adopted before any request; a `kill_after_ms` that passed while no
    agent ran fires as soon as the process is back (its timer is due at once)."""
    args = {"command": "build", "kill_after_ms": 5000}
    world, row = _running_row(args)
    kept = KeptCall(args, True, PRINTED)
    state, effects, now, wall = _restart(world, row, kept, after_s=30.0)
    assert Adopt("k1") in effects
    assert _result(effects) is None  # still unresolved: it goes on
    effects = state.handle(Adopted("k1", 4242, PRINTED), now, wall)
    (timer,) = [e for e in effects if isinstance(e, StartTimer)]
    assert timer.fire == KillAfter("k1") and timer.at <= now


def test_a_held_command_whose_deadline_is_ahead_keeps_the_rest_of_it() -> None:
    args = {"command": "build", "kill_after_ms": 60_000}
    world, row = _running_row(args)
    state, _effects, now, wall = _restart(world, row, KeptCall(args, True, PRINTED), 20.0)
    effects = state.handle(Adopted("k1", 4242, PRINTED), now, wall)
    (timer,) = [e for e in effects if isinstance(e, StartTimer)]
    assert 39.0 <= timer.at - now <= 40.0  # 60 s from the first start, 20 s of it gone


def test_a_command_gone_unrecorded_ends_unknown_with_the_output_recorded_up_to_then() -> None:
    args = {"command": "build"}
    world, row = _running_row(args)
    _state, effects, _now, _wall = _restart(world, row, KeptCall(args, False, PRINTED), 1.0)
    assert not [e for e in effects if isinstance(e, Adopt)]
    assert ReleaseKept("k1") in effects  # its file has nothing more to give
    result = _result(effects)
    assert result is not None and result.outcome is Outcome.UNKNOWN
    assert result.text == TEXT_AGENT_RESTARTED and result.output == "printed\n"


def test_a_background_command_whose_call_returned_is_adopted_and_listed() -> None:
    args = {"command": "serve"}
    world, row = _running_row(args, background=True)
    assert row.result is not None  # its call returned before the restart
    state, effects, now, wall = _restart(world, row, KeptCall(args, True, PRINTED), 1.0)
    assert Adopt("k1") in effects
    state.handle(Adopted("k1", 4242, PRINTED), now, wall)
    assert state.running_process_count == 1


def test_a_keeper_killed_under_a_live_agent_ends_the_call_unknown_with_its_output() -> None:
    world, _row = _running_row({"command": "build"})
    effects = world.state.handle(HolderGone("k1", PRINTED), world.now, world.wall_ms)
    result = _result(effects)
    assert result is not None and result.outcome is Outcome.UNKNOWN
    assert result.text == TEXT_KEEPER_GONE and result.output == "printed\n"
    assert world.state.running_process_count == 0


def test_a_held_command_whose_record_cannot_take_it_back_is_released_not_left_running() -> None:
    """Its recorded args no longer parse (another build wrote them): not adopted, so the shell
    stops and drops it rather than hold it unseen; the call ends `unknown`."""
    world, row = _running_row({"command": "build"})
    kept = KeptCall({"command": 5}, True, PRINTED)
    _state, effects, _now, _wall = _restart(world, row, kept, 1.0)
    assert ReleaseKept("k1") in effects and Adopt("k1") not in effects
    result = _result(effects)
    assert result is not None and result.outcome is Outcome.UNKNOWN


def test_a_command_its_keeper_stopped_at_its_hard_deadline_ends_timed_out_with_its_text() -> None:
    """9.2 while no agent ran (10.1): the keeper already stopped the group, so the agent stops
    nothing again; the listing says `timed_out` and the owed result gives the deadline's text,
    also when the process is already gone when it is re-adopted."""
    args = {"command": "build", "kill_after_ms": 5000}
    world, row = _running_row(args)
    kept = KeptCall(args, True, PRINTED, killed_after=True)
    state, _effects, now, wall = _restart(world, row, kept, after_s=30.0)
    effects = state.handle(Adopted("k1", 4242, PRINTED), now, wall)
    assert MarkTimedOut("k1") in effects
    assert not [e for e in effects if isinstance(e, StartTimer) and e.key[1] == "kill_after"]
    ended = ProcessSnapshot("k1", None, "SIGTERM", True, "printed\n", 8, 0)
    effects = state.handle(ProcessExited("k1", ended), now, wall)
    result = _result(effects)
    assert result is not None and result.outcome is Outcome.TIMED_OUT and result.timed_out
    assert result.text == text_killed_after(5000)
