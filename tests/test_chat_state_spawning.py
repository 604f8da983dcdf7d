"""ChatState while a command is being spawned: between `Spawn` and the keeper's reply
(`Spawned`, `SpawnFailed`, or the shell giving up: `ToolFailed`) other inputs come, and none of
them is lost (docs/durability.md, "While a command is spawned").

The World (simulation/pure_world.py) holds each spawn's reply until the test says
(`spawn_replies_later`); `World.check_not_spawning` and `World.check_spawned` check, at every
step, that nothing is done to a command before its `Spawned` and that a stop asked meanwhile is
carried out by it. The state machine of tests/test_chat_state.py plays the same window under
every interleaving; these are its cases one by one.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chat_state_support import stop_command
from toolwire.actors.calls import CallSpec
from toolwire.actors.effects import (
    AttachRequest,
    CallRequest,
    ProcessSnapshot,
    Publish,
    Spawned,
    StartTimer,
    StopGroup,
    Sweep,
)
from toolwire.actors.events import ChatClosedEvent, StartedEvent
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_SHUTDOWN,
    Outcome,
    ToolwireError,
)
from toolwire.simulation.pure_world import World

COMMAND = {"command": "make test"}


def _spawning(*, background: bool = False, timeout_ms: int | None = None) -> World:
    """A chat whose `execute` k1 is durably started and asked of the keeper, unanswered."""
    world = World(journal_keeps_results=False, spawn_replies_later=True)
    spec = CallSpec("k1", "execute", COMMAND, background=background, timeout_ms=timeout_ms)
    assert world.request(CallRequest("a0", spec, True, None))
    world.commit(len(world.pending_writes))  # the start is durable: `Spawn` goes out
    assert "k1" in world.spawning and "k1" not in world.procs
    record = world.state.records.get("k1")
    assert record is not None and not record.done
    return world


def _replied(world: World, kind: str) -> bool:
    owed = world.owed["a0"]
    if kind == "cancel":
        return owed.cancel_results == 1
    if kind == "interrupt":
        return owed.interrupted == 1
    if kind == "close_chat":
        return owed.closed == 1
    return not world.state.groups and world.state.replies_waiting == 0


def _recorded(world: World, method: str) -> list[Any]:
    """What the World's shell `method` is given from here on (its last argument: the event
    sent, the effect carried out), in order; the method still runs."""
    got: list[Any] = []
    original = getattr(world, method)

    def record(*args: Any) -> None:
        got.append(args[-1])
        original(*args)

    setattr(world, method, record)
    return got


def _sent(world: World) -> list[Any]:
    """Every event the World's shell sends from here on, in order."""
    return _recorded(world, "sent")


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("kind", ["cancel", "interrupt", "close_chat", "shutdown"])
def test_a_stop_while_the_command_is_spawned_stops_it_once_the_keeper_answers(
    kind: str, background: bool
) -> None:
    """5.3, 5.7, 9.6, 9.3: the stop is taken at once, but there is no process to signal yet:
    nothing is sent to it and the reply waits. The keeper's `Spawned` then stops the group at
    once, and the call ends `canceled` (with 9.3's text for the shutdown), its reply after."""
    world = _spawning(background=background)
    sent = _sent(world)
    stop_command(world, kind)
    world.commit(len(world.pending_writes))
    assert not _replied(world, kind), "answered while the command may be starting"
    world.spawn_answered("k1")  # World.check_spawned: the StopGroup came with it
    assert world.procs["k1"].stopping == "term"
    world.quiesce()
    world.check_all_answered()
    assert _replied(world, kind)
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.CANCELED and result.canceled
    if kind == "shutdown":
        assert result.text == TEXT_SHUTDOWN
    if kind == "close_chat":
        (closed,) = [e for e in sent if isinstance(e, ChatClosedEvent)]
        assert closed.process_ids == ["k1"], "chat_closed does not name the process it stopped"
        assert closed.call_ids == ["k1"]
    assert not world.state.groups


def test_a_cancel_while_the_spawn_fails_gets_the_failure_and_stops_nothing() -> None:
    """The keeper could not spawn it: nothing ran, and the cancel's reply carries the call's
    one true result, `failed`, saying why."""
    world = _spawning()
    stop_command(world, "cancel")
    world.spawn_answered("k1", "failed")
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.FAILED
    assert "did not start" in result.text
    assert world.owed["a0"].cancel_results == 1 and "k1" not in world.procs


def test_a_spawn_the_shell_gave_up_on_ends_unknown_and_a_late_reply_is_stopped() -> None:
    """The keeper went (or did not answer in time) with the spawn in flight: the command may
    have started, so the call ends `unknown` (9.9's text). Should a `Spawned` still come for
    it, no call answers for that process: it is stopped at once, and the result stands."""
    world = _spawning()
    world.spawn_answered("k1", "unanswered")
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.UNKNOWN
    assert result.text == TEXT_AGENT_FAILURE
    late = Spawned("k1", 4242, ProcessSnapshot("k1", None, None, False, "", 0, 0))
    effects = world.state.handle(late, world.now, world.wall_ms)
    assert any(isinstance(e, StopGroup) and e.call_id == "k1" for e in effects)
    assert not any(isinstance(e, Publish) for e in effects), "a `started` for an ended call"
    assert "k1" in world.state.groups, "the orphan's group is held until it is gone"
    assert world.committed["k1"].result == result


def test_an_attach_while_the_command_is_spawned_gets_its_started_when_it_comes() -> None:
    """A repeat or an attach meanwhile follows the call as during its durable start: the
    `started` (with the pid) goes to it once the keeper answered, and its result after."""
    world = _spawning()
    assert world.request(AttachRequest("b0", "k1", 0, None))
    got: list[Publish] = _recorded(world, "publish")
    world.spawn_answered("k1")
    started = [p for p in got if isinstance(p.event, StartedEvent)]
    assert len(started) == 1 and started[0].to is not None and "b0" in started[0].to
    world.quiesce()
    world.check_all_answered()
    assert world.owed["b0"].results["k1"] == 1


def test_a_timeout_that_passes_while_the_command_is_spawned_counts_from_the_first_start() -> None:
    """5.2: the deadline is the first start's: its timer is set when the process is there, at
    that same moment, so a spawn slower than the timeout ends `timed_out` at once after it."""
    world = _spawning(timeout_ms=1000)
    deadline = world.state.records.get("k1").deadline  # type: ignore[union-attr]
    world.now += 5.0
    world.request(Sweep())
    assert ("k1", "deadline") not in world.timers
    timers: list[StartTimer] = _recorded(world, "start_timer")
    world.spawn_answered("k1")
    assert [t.at for t in timers if t.key == ("k1", "deadline")] == [deadline]
    world.fire(("k1", "deadline"))
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.TIMED_OUT


def test_a_command_being_spawned_holds_its_process_slot_and_keeps_the_chat() -> None:
    """It counts against max_processes_per_chat from its start, and a sweep meanwhile does not
    find the chat idle (its reply must find the chat)."""
    world = _spawning()
    for call_id in ("k2", "k3"):
        assert world.request(CallRequest("a0", CallSpec(call_id, "execute", COMMAND), True, None))
    assert world.state.running_process_count == 3
    refused = world.request(CallRequest("a0", CallSpec("k4", "execute", COMMAND), True, None))
    assert not refused and isinstance(world.refusal, ToolwireError)
    assert world.refusal.code == "over_limit"
    world.request(Sweep())
    assert not world.state.idle
    world.quiesce()
    world.check_all_answered()
    assert world.state.running_process_count == 0


STOPS = st.sampled_from(["cancel", "interrupt", "close_chat", "shutdown", "attach", "sweep"])


@settings(max_examples=200, deadline=None)
@given(
    before=st.lists(STOPS, max_size=3),
    answer=st.sampled_from(["spawned", "failed", "unanswered"]),
    background=st.booleans(),
)
def test_whatever_comes_while_the_command_is_spawned_is_answered_truthfully(
    before: list[str], answer: str, background: bool
) -> None:
    """Any mix of requests while the keeper has not answered, then any answer: every request
    is answered, nothing is done to the process before `Spawned` (the World's checks), and the
    call's result is what happened: a stop made it `canceled`, a failed spawn `failed`, a spawn
    given up on `unknown`."""
    world = _spawning(background=background)
    stopped = False
    for what in before:
        if what == "attach":
            assert world.request(AttachRequest("b0", "k1", 0, None))
        elif what == "sweep":
            world.request(Sweep())
        elif what != "shutdown" or not world.state.shutting_down:
            stop_command(world, what)
            stopped = True
    world.spawn_answered("k1", answer)
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None
    expected = {"failed": Outcome.FAILED, "unanswered": Outcome.UNKNOWN}.get(answer)
    if expected is None:
        expected = Outcome.CANCELED if stopped else Outcome.COMPLETED
    assert result.outcome is expected
    assert not world.state.groups
