"""ChatState under every interleaving hypothesis finds: the rules of PROTOCOL.md 5.0-5.7 as
invariants, checked after every step (actors/chat_state.py is pure: no trio, no clock).

`World` (simulation/pure_world.py, shared with the pure seed mode of `toolwire sim`) plays the
shell's part the way actors/chat.py does, with everything that takes time left pending until a
rule lets it happen: journal commits, tools on threads, process exits and reaps, the grace of a
stop, timers, read-backs. So the rules can race a cancel against a
command's natural end or against its durable start, an approval against its expiry, an
interrupt against a finish, a repeat against a read-back, forgetting against a pinned read,
and restart the agent at any point (what was committed survives; nothing else does).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.chat_state_support import stop_command
from toolwire.actors.calls import CallSpec
from toolwire.actors.effects import (
    ApproveRequest,
    AttachRequest,
    CallRequest,
    CancelRequest,
    CloseChatRequest,
    DetachRequest,
    Follow,
    InterruptRequest,
    ResolveTurn,
    Send,
    Shutdown,
    Sweep,
    ToolEnded,
    TurnPlanned,
    TurnRequest,
)
from toolwire.actors.events import ResultEvent, TurnPlanEvent
from toolwire.actors.reservations import reserve
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_CANCELED_WHILE_RUNNING,
    TEXT_SHUTDOWN,
    Outcome,
    ToolReport,
    text_killed_after,
)
from toolwire.simulation.pure_world import EXITED_RETENTION_S, FORGET_AFTER_S, World, Written

CALL_IDS = ["k1", "k2", "k3", "k4"]
# The tools the machine calls, by what they make the state machine do: a command (a process
# group), an inline write (an effect journaled first), an inline read (no start row), a
# thread-run search and a stoppable wait (each a task the shell runs).
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "cmd": ("execute", {"command": "make test"}),
    "bg": ("execute", {"command": "serve"}),
    "hard": ("execute", {"command": "build", "kill_after_ms": 5000}),
    "write": ("write_file", {"path": "f", "content": "x"}),
    "read": ("read_file", {"path": "f"}),
    "search": ("search_files", {"pattern": "x"}),
    "wait": ("process_output", {"process_id": "k1", "wait": True}),
}


class ChatStateMachine(RuleBasedStateMachine):
    world: World

    @initialize(keeps=st.booleans())
    def start(self, keeps: bool) -> None:
        self.world = World(journal_keeps_results=keeps, spawn_replies_later=True)
        self.sent_specs: list[CallSpec] = []

    conns = st.integers(0, 1)
    call_ids = st.sampled_from(CALL_IDS)

    def conn(self, index: int) -> str:
        return self.world.conns[index]

    # -- requests ------------------------------------------------------------------------------

    @rule(conn=conns, call_id=call_ids, kind=st.sampled_from(sorted(CALLS)),
          approval=st.booleans(), stream=st.booleans(), timeout=st.booleans())  # fmt: skip
    def call(
        self, conn: int, call_id: str, kind: str, approval: bool, stream: bool, timeout: bool
    ) -> None:
        tool, args = CALLS[kind]
        spec = CallSpec(
            call_id,
            tool,
            args,
            timeout_ms=5000 if timeout and kind == "cmd" else None,
            background=kind == "bg",
            approval=approval,
        )
        if self.world.request(CallRequest(self.conn(conn), spec, stream, None)):
            self.sent_specs.append(spec)

    @precondition(lambda self: self.sent_specs)
    @rule(conn=conns, data=st.data(), stream=st.booleans())
    def call_again(self, conn: int, data: st.DataObject, stream: bool) -> None:
        """A retry: a call sent before, again (on either connection, streaming or not)."""
        spec = data.draw(st.sampled_from(self.sent_specs))
        self.world.request(CallRequest(self.conn(conn), spec, stream, None))

    @rule(conn=conns, call_id=call_ids, offset=st.integers(0, 5))
    def attach(self, conn: int, call_id: str, offset: int) -> None:
        self.world.request(AttachRequest(self.conn(conn), call_id, offset, None))

    @rule(conn=conns, call_id=call_ids)
    def detach(self, conn: int, call_id: str) -> None:
        self.world.request(DetachRequest(self.conn(conn), call_id))

    @rule(conn=conns, call_id=call_ids, approved=st.booleans(), chat_scope=st.booleans())
    def approve(self, conn: int, call_id: str, approved: bool, chat_scope: bool) -> None:
        scope = "chat" if chat_scope else "call"
        self.world.request(ApproveRequest(self.conn(conn), call_id, approved, None, None, scope))

    @rule(conn=conns, call_ids=st.lists(st.sampled_from(CALL_IDS), min_size=1, max_size=2))
    def cancel(self, conn: int, call_ids: list[str]) -> None:
        owed = self.world.owed[self.conn(conn)]
        owed.cancels += len(call_ids)  # before: the reply may come at once
        if not self.world.request(CancelRequest(self.conn(conn), tuple(call_ids), None)):
            owed.cancels -= len(call_ids)

    @rule(conn=conns, turn_id=st.sampled_from(["t1", "t2"]),
          calls=st.lists(st.tuples(st.sampled_from(CALL_IDS), st.sampled_from(sorted(CALLS))),
                         min_size=1, max_size=3, unique_by=lambda c: c[0]),
          stream=st.booleans(), approval=st.booleans())  # fmt: skip
    def turn(
        self,
        conn: int,
        turn_id: str,
        calls: list[tuple[str, str]],
        stream: bool,
        approval: bool,
    ) -> None:
        specs = tuple(
            CallSpec(call_id, CALLS[kind][0], CALLS[kind][1], background=kind == "bg",
                     approval=approval and i == 0)
            for i, (call_id, kind) in enumerate(calls)
        )  # fmt: skip
        owed = self.world.owed[self.conn(conn)]
        owed.turns[turn_id] += 1
        before = self.world.turn_calls.get(turn_id)
        self.world.turn_calls[turn_id] = [s.call_id for s in specs]
        turn = TurnRequest(self.conn(conn), turn_id, specs, stream, None)
        if not self.world.request(turn):
            owed.turns[turn_id] -= 1
            if before is not None:
                self.world.turn_calls[turn_id] = before

    @rule(conn=conns, turn_id=st.none() | st.sampled_from(["t1", "t2"]))
    def interrupt(self, conn: int, turn_id: str | None) -> None:
        owed = self.world.owed[self.conn(conn)]
        owed.interrupts += 1
        if not self.world.request(InterruptRequest(self.conn(conn), turn_id, None)):
            owed.interrupts -= 1

    @rule(conn=conns)
    def close_chat(self, conn: int) -> None:
        owed = self.world.owed[self.conn(conn)]
        owed.closes += 1
        self.world.request(CloseChatRequest(self.conn(conn), None))

    # -- what happens meanwhile ----------------------------------------------------------------

    @precondition(lambda self: self.world.pending_writes)
    @rule(n=st.integers(1, 4))
    def commit(self, n: int) -> None:
        self.world.commit(n)

    @precondition(lambda self: self.world.resolving)
    @rule(data=st.data(), fails=st.booleans())
    def paths_resolved(self, data: st.DataObject, fails: bool) -> None:
        """The shell's worker thread has resolved what a turn's calls reserve (or raised: the
        calls the turn created then fail, saying why). Until then the turn is admitted but
        unplanned: its calls start not, nothing of it is sent, and cancels, interrupts,
        repeats, detaches and closes of it are handled meanwhile."""
        turn_id = data.draw(st.sampled_from(sorted(self.world.resolving)))
        self.world.paths_resolved(turn_id, fails=fails)

    @precondition(lambda self: self.world.spawning)
    @rule(data=st.data(), how=st.sampled_from(["spawned", "spawned", "failed", "unanswered"]))
    def keeper_answers_a_spawn(self, data: st.DataObject, how: str) -> None:
        """The keeper's reply to a spawn comes (through the keeper client's reader), or the
        shell gives up on it. Until then the call runs without a process: cancels,
        interrupts, closes, repeats, attaches and sweeps of it are handled meanwhile, and
        nothing is done to its process before the reply (`World.check_not_spawning`)."""
        call_id = data.draw(st.sampled_from(sorted(self.world.spawning)))
        self.world.spawn_answered(call_id, how)

    @precondition(lambda self: self.world.spawning)
    @rule(conn=conns, data=st.data(), how=st.sampled_from(["cancel", "interrupt", "close_chat"]))
    def stop_a_command_being_spawned(self, conn: int, data: st.DataObject, how: str) -> None:
        """A cancel, an interrupt or a close aimed right into the window between `Spawn` and
        the keeper's reply (the other rules reach it too, but seldom)."""
        call_id = data.draw(st.sampled_from(sorted(self.world.spawning)))
        if how == "cancel":
            self.cancel(conn, [call_id])
        elif how == "interrupt":
            self.interrupt(conn, None)
        else:
            self.close_chat(conn)

    @precondition(lambda self: self.world.tasks)
    @rule(data=st.data())
    def tool_ends(self, data: st.DataObject) -> None:
        call_id = data.draw(st.sampled_from(sorted(self.world.tasks)))
        del self.world.tasks[call_id]
        report = ToolReport(outcome=Outcome.COMPLETED, text="done")
        self.world.feed(ToolEnded(call_id, report))

    @precondition(lambda self: self.world.procs)
    @rule(data=st.data())
    def process_moves(self, data: st.DataObject) -> None:
        """The command exits, is reaped, or its stop moves on (the grace ends, it is gone)."""
        call_id = data.draw(st.sampled_from(sorted(self.world.procs)))
        self.world.advance_process(call_id)

    @precondition(lambda self: self.world.timers)
    @rule(data=st.data())
    def timer_fires(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.world.timers)))
        self.world.fire(key)

    @precondition(lambda self: self.world.reads)
    @rule()
    def read_back(self) -> None:
        self.world.read_back()

    @precondition(lambda self: self.world.reads)
    @rule()
    def read_back_fails(self) -> None:
        """The journal cannot give the saved results back (issue 26): each delivery waiting
        on them still gets one answer per call, `unknown`, and nothing is saved over them."""
        self.world.read_back(fails=True)

    @rule(seconds=st.sampled_from([1.0, 15.0, 40.0]))
    def time_passes(self, seconds: float) -> None:
        self.world.now += seconds
        self.world.wall_ms += int(seconds * 1000)
        self.world.request(Sweep())
        self.world.check_listing()

    @rule(n=st.integers(1, 2))
    def journal_refuses(self, n: int) -> None:
        self.world.refusals = n

    @rule(n=st.integers(1, 2))
    def a_group_step_fails(self, n: int) -> None:
        """The shell cannot carry out the next step (or two) on a process group (a stop, a
        kill, a watch): the call ends `unknown`, the group gets SIGKILL, and if that fails too,
        the group is given up; nothing waits for it forever (`World.check_group_lost`)."""
        self.world.group_failures = n

    @precondition(lambda self: self.world.procs)
    @rule(data=st.data())
    def a_group_breaks(self, data: st.DataObject) -> None:
        """From now on every step on one command's group fails in the shell: after the first
        (`GroupLost`), the SIGKILL too, so the group must be given up."""
        self.world.broken_groups.add(data.draw(st.sampled_from(sorted(self.world.procs))))

    @rule()
    def journal_refuses_the_close(self) -> None:
        self.world.close_refusals = 1

    @rule()
    def restart(self) -> None:
        self.world.restart()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def records_are_consistent(self) -> None:
        if not hasattr(self, "world"):
            return
        state = self.world.state
        for record in state.records:
            if record.published:
                assert record.done
            if record.done:
                assert record.outcome is not None
            assert record.pins >= 0
        # A grace still running on a group means the group is known.
        for call_id, proc in self.world.procs.items():
            if proc.stopping in ("term", "kill"):
                assert call_id in state.groups

    @invariant()
    def the_agents_budget_counts_what_the_chat_holds(self) -> None:
        """Records and process slots are counted in the agent-wide budget where they come and
        go (the record table, `_hold_slot`, `_free_slot`): after every input the counts are
        what the chat holds, refusals and restarts included."""
        if not hasattr(self, "world"):
            return
        state = self.world.state
        assert self.world.budget.records == len(state.records)
        assert self.world.budget.processes == state.running_process_count

    def teardown(self) -> None:
        if hasattr(self, "world"):
            self.world.quiesce()
            self.world.check_all_answered()
            assert self.world.state.replies_waiting == 0, "a reply still waits in a quiet chat"
            # What exited stays listed for its retention (a sweep now drops none of it), and
            # leaves the listing once that has passed (5.2).
            self.world.request(Sweep())
            self.world.now += EXITED_RETENTION_S
            self.world.request(Sweep())
            self.world.check_listing()


# The suite's share; TOOLWIRE_STATE_EXAMPLES=20000 for a long search.
ChatStateMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("TOOLWIRE_STATE_EXAMPLES", "400")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestChatStateMachine = ChatStateMachine.TestCase


def test_a_refused_request_changes_nothing() -> None:
    world = World(journal_keeps_results=False)
    assert not world.request(CallRequest("a0", CallSpec("k1", "nope", {}), False, None))
    assert not world.request(AttachRequest("a0", "k1", 0, None))
    assert not world.state.records


@pytest.mark.parametrize("keeps", [False, True])
def test_a_cancel_racing_the_durable_start_ends_not_run_and_nothing_runs(keeps: bool) -> None:
    world = World(journal_keeps_results=keeps)
    world.request(CallRequest("a0", CallSpec("k1", "write_file", CALLS["write"][1]), True, None))
    world.request(CancelRequest("a0", ("k1",), None))
    world.owed["a0"].cancels += 1
    world.quiesce()
    world.check_all_answered()
    assert world.effects_run[("k1", 0)] == 0
    assert world.committed["k1"].result is not None
    assert world.committed["k1"].result.outcome is Outcome.NOT_RUN


def test_a_command_that_ends_while_its_cancel_is_on_the_way_keeps_its_real_result() -> None:
    world = World(journal_keeps_results=False)
    world.request(CallRequest("a0", CallSpec("k1", "execute", CALLS["cmd"][1]), True, None))
    world.commit(len(world.pending_writes))  # the start is durable: the command spawns
    world.advance_process("k1")  # it exits (not reaped yet) ...
    world.request(CancelRequest("a0", ("k1",), None))  # ... as the cancel arrives
    world.owed["a0"].cancels += 1
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.COMPLETED and not result.canceled


def test_the_group_gets_its_grace_after_the_shell_exits() -> None:
    """5.3: the shell exiting during the grace does not end the stop; SIGKILL comes only
    when the grace is over (or the group empty), and the result only when the group is gone."""
    world = World(journal_keeps_results=False)
    world.request(CallRequest("a0", CallSpec("k1", "execute", CALLS["cmd"][1]), True, None))
    world.commit(len(world.pending_writes))
    world.request(CancelRequest("a0", ("k1",), None))
    world.owed["a0"].cancels += 1
    assert world.procs["k1"].stopping == "term"
    world.procs["k1"].state = "zombie"
    world.reap("k1")  # the shell is gone; its children still clean up
    assert world.procs["k1"].stopping == "term", "the grace was cut short"
    assert world.state.records.get("k1") is not None
    assert not world.state.records.get("k1").done  # type: ignore[union-attr]
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.CANCELED and result.canceled


class _StopWorld(World):
    """Counts the ends of the chat's part of a shutdown."""

    shutdowns_done = 0

    def shutdown_done(self) -> None:
        self.shutdowns_done += 1


@pytest.mark.parametrize("stop", ["close_chat", "shutdown"])
def test_a_stop_does_not_wait_for_the_hard_deadline_of_a_command_that_ended(stop: str) -> None:
    """9.6 and 9.3 with 9.2: a command that exited on its own with its `kill_after_ms` still
    ahead leaves an empty group, kept (unwatched) for that deadline. A close or a shutdown
    finds nothing of it to stop: `chat_closed` (or the end of the shutdown) comes at once, not
    when the deadline, which can be hours away, fires (`toolwire sim --scenario interactive
    --mode agent`, seeds 62169 and 62459: the session ended with the chat_closed still owed)."""
    world = _StopWorld(journal_keeps_results=False)
    world.request(CallRequest("a0", CallSpec("k1", "execute", CALLS["hard"][1]), True, None))
    world.commit(len(world.pending_writes))  # the start is durable: the command spawns
    world.advance_process("k1")  # it exits ...
    world.advance_process("k1")  # ... is reaped, and its output pipe closes: the group is spent
    world.commit(len(world.pending_writes))  # its result is durable and sent
    assert world.owed["a0"].results["k1"] == 1
    assert ("k1", "kill_after") in world.timers, "the hard deadline is still ahead"
    stop_command(world, stop)
    world.commit(len(world.pending_writes))  # the close row is durable (a shutdown has none)
    # Nothing else happens: no process moves, no timer fires.
    if stop == "close_chat":
        assert world.owed["a0"].closed == 1, "chat_closed waits for the hard deadline"
    else:
        assert world.shutdowns_done == 1, "the shutdown waits for the hard deadline"
    assert "k1" not in world.state.groups
    assert ("k1", "kill_after") not in world.timers, "a deadline for a group that is gone"
    world.quiesce()
    world.check_all_answered()


def test_a_read_that_ends_at_once_sends_its_accepted_with_its_durable_result() -> None:
    """With a journal, `read_file` waits only for its result's commit: its `accepted` goes
    out with the result (one write for the client), but never after the reply to a later
    request naming the call, and an effectful call still gets its `accepted` at once."""
    world = World(journal_keeps_results=True)
    read = CallSpec("k1", "read_file", CALLS["read"][1])
    world.request(CallRequest("a0", read, False, None))
    assert world.owed["a0"].accepted["k1"] == 0, "accepted went out a commit ahead"
    world.request(CallRequest("b0", read, False, None))  # a repeat before the commit
    assert world.owed["a0"].accepted["k1"] == 1 and world.owed["b0"].accepted["k1"] == 1
    world.request(CallRequest("a0", CallSpec("k2", "write_file", CALLS["write"][1]), False, None))
    assert world.owed["a0"].accepted["k2"] == 1, "an effectful call waited for its commit"
    world.request(CallRequest("a0", CallSpec("k3", "read_file", CALLS["read"][1]), False, None))
    assert world.owed["a0"].accepted["k3"] == 0
    world.commit(len(world.pending_writes))
    assert world.owed["a0"].accepted["k3"] == 1 and world.owed["a0"].results["k3"] == 1
    world.quiesce()
    world.check_all_answered()


def test_a_result_the_journal_refused_twice_is_kept_on_the_heap_even_without_a_call() -> None:
    """A record rebuilt at a restart has no call to amend: when the journal refuses the row of
    its `unknown` result twice, it is answered from memory and must stay there (a read-back
    would find the older `running` row), however many results pass through the cache."""
    world = World(journal_keeps_results=True, cache_entries=1)
    world.request(CallRequest("a0", CallSpec("k1", "execute", CALLS["cmd"][1]), False, None))
    world.commit(len(world.pending_writes))  # the start is durable: the command runs
    world.refusals = 2
    world.restart()  # k1 was running: it ends `unknown`, and that row is refused twice
    conn = world.conns[0]
    for call_id in ("k2", "k3"):  # each result pushes the one before out of the cache
        world.request(CallRequest(conn, CallSpec(call_id, "read_file", {"path": "f"}), False, None))
        world.commit(len(world.pending_writes))
    world.request(CallRequest(conn, CallSpec("k1", "execute", CALLS["cmd"][1]), False, None))
    assert not world.reads, "the refused result was read back from the journal"
    world.quiesce()
    world.check_all_answered()


def test_a_forgotten_call_id_is_not_answered_with_what_the_lane_held_for_its_old_record() -> None:
    """Found by the machine above: a delivery behind a read-back took an old record's result
    for the lane; the record was forgotten, a new one took its id, and its cancel_result came
    out with the old result."""
    machine = ChatStateMachine()
    machine.start(keeps=True)
    steps: list[tuple[str, dict[str, Any]]] = [
        ("journal_refuses", {"n": 1}), ("cancel", {"call_ids": ["k1"], "conn": 0}),
        ("commit", {"n": 1}), ("journal_refuses", {"n": 1}),
        ("cancel", {"call_ids": ["k2"], "conn": 0}), ("commit", {"n": 1}),
        ("journal_refuses", {"n": 1}),
        ("call", {"approval": False, "call_id": "k3", "conn": 0, "kind": "bg", "stream": False,
                  "timeout": False}),
        ("commit", {"n": 1}), ("journal_refuses", {"n": 1}),
        ("cancel", {"call_ids": ["k1", "k2"], "conn": 0}), ("read_back", {}),
        ("journal_refuses", {"n": 2}), ("time_passes", {"seconds": 40.0}), ("commit", {"n": 1}),
        ("cancel", {"call_ids": ["k1"], "conn": 0}), ("read_back", {}),
        ("cancel", {"call_ids": ["k1", "k1"], "conn": 0}),
    ]  # fmt: skip
    for name, kwargs in steps:
        getattr(machine, name)(**kwargs)
        machine.records_are_consistent()
    machine.teardown()


@pytest.mark.parametrize("kind", ["cancel", "interrupt", "close_chat", "shutdown"])
@pytest.mark.parametrize("deadline_first", [False, True])
def test_when_a_stop_and_the_hard_deadline_meet_the_first_decides_the_result(
    kind: str, deadline_first: bool
) -> None:
    """docs/protocol.md, "Hard deadline": a stop taken before `kill_after_ms` passed ends the
    call as that stop says (the deadline then finds the group stopping and changes nothing);
    a stop that comes during the deadline's grace finds the outcome fixed: `timed_out` with
    9.10's text, and a cancel's reply carries that same result (seeds 60051 and 62683 of
    `interactive` played the first order)."""
    world = World(journal_keeps_results=False)
    world.request(CallRequest("a0", CallSpec("k1", "execute", CALLS["hard"][1]), True, None))
    world.commit(len(world.pending_writes))  # the start is durable: the command spawns
    assert ("k1", "kill_after") in world.timers
    if deadline_first:
        world.fire(("k1", "kill_after"))
        assert world.procs["k1"].stopping == "term"
        stop_command(world, kind)
    else:
        stop_command(world, kind)
        assert world.procs["k1"].stopping == "term"
        world.fire(("k1", "kill_after"))
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None
    if deadline_first:
        assert result.outcome is Outcome.TIMED_OUT and result.timed_out
        assert result.text == text_killed_after(5000)
    else:
        assert result.outcome is Outcome.CANCELED and result.canceled and not result.timed_out
        assert result.text == (TEXT_SHUTDOWN if kind == "shutdown" else TEXT_CANCELED_WHILE_RUNNING)


def test_a_failed_read_back_answers_unknown_once_and_the_saved_result_stays() -> None:
    """Issue 26: the journal cannot give back a saved result. The repeat waiting on it gets
    `unknown` with the agent-failure text (its `accepted` went out, so it must get a result),
    nothing is written over the saved row, and the next repeat reads the real result."""
    world = World(journal_keeps_results=True, cache_entries=0)
    read = CallSpec("k1", "read_file", CALLS["read"][1])
    world.request(CallRequest("a0", read, False, None))
    world.commit(len(world.pending_writes))
    saved = world.committed["k1"].result
    assert saved is not None and saved.outcome is Outcome.COMPLETED
    world.request(CallRequest("b0", read, False, None))
    assert world.reads == [("k1",)] and world.owed["b0"].results["k1"] == 0
    answers: list[Any] = []
    sent = world.sent

    def recording(conn: Any, event: Any) -> None:
        answers.append(event)
        sent(conn, event)

    world.sent = recording  # type: ignore[method-assign]
    world.read_back(fails=True)
    results = [e.result for e in answers if isinstance(e, ResultEvent)]
    assert [(r.outcome, r.text) for r in results] == [(Outcome.UNKNOWN, TEXT_AGENT_FAILURE)]
    assert world.owed["b0"].results["k1"] == 1
    assert not any(isinstance(w, Written) for w in world.pending_writes), "saved over it"
    assert world.committed["k1"].result == saved
    answers.clear()
    world.request(CallRequest("b0", read, False, None))
    world.read_back()
    world.quiesce()
    assert [e.result for e in answers if isinstance(e, ResultEvent)] == [saved]
    world.check_all_answered()


def test_a_stream_false_call_sent_again_after_a_detach_brings_no_started() -> None:
    """PROTOCOL.md 9.9: a detach ends what the connection streamed; a `stream: false` repeat
    of the call then follows without `started` or output (the follow kept for the first
    request's result once carried its stream on, and `started` went out again)."""
    world = World(journal_keeps_results=False)
    cmd = CallSpec("k1", "execute", CALLS["cmd"][1])
    assert world.request(CallRequest("a0", cmd, True, None))
    world.commit(len(world.pending_writes))  # the start is durable: it spawns, `started` goes
    assert world.request(DetachRequest("a0", "k1"))
    assert world.request(CallRequest("a0", cmd, False, None))
    assert ("a0", "k1") not in world.streams
    world.quiesce()
    world.check_all_answered()


def test_a_repeated_request_moves_the_cursor_back_only_while_output_is_owed() -> None:
    """PROTOCOL.md 9.9: an attach from an offset after where an earlier request's output is
    still owed leaves the cursor there; after a detach the next attach starts where it asks."""
    world = World(journal_keeps_results=False)
    cmd = CallSpec("k1", "execute", CALLS["cmd"][1])
    assert world.request(CallRequest("a0", cmd, True, None))
    world.commit(len(world.pending_writes))
    assert world.request(AttachRequest("a0", "k1", 3, None))
    assert world.cursors[("a0", "k1")] == 0, "the attach skipped output the call still owes"
    assert world.request(DetachRequest("a0", "k1"))
    assert world.request(AttachRequest("a0", "k1", 3, None))
    assert world.cursors[("a0", "k1")] == 3
    world.quiesce()
    world.check_all_answered()


@pytest.mark.parametrize("failures", [1, 2])
def test_a_group_step_that_fails_at_once_lets_the_shutdown_finish(failures: int) -> None:
    """The shutdown's stop of a running command fails in the shell at once (and, with 2, the
    SIGKILL that follows too): the call ends `unknown`, the group is killed or given up, and
    the shutdown is over instead of waiting for a report that never comes (9.3)."""
    world = _StopWorld(journal_keeps_results=False)
    world.request(CallRequest("a0", CallSpec("k1", "execute", CALLS["cmd"][1]), True, None))
    world.commit(len(world.pending_writes))  # the start is durable: the command runs
    world.group_failures = failures
    world.feed(Shutdown())
    world.quiesce()
    assert world.shutdowns_done == 1, "the shutdown waits for a group step that failed"
    assert "k1" not in world.state.groups
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.UNKNOWN
    world.check_all_answered()


def test_a_chat_scope_approval_survives_a_restart_while_the_chat_has_records() -> None:
    """9.5: a tool approved for the whole chat stays approved after a restart (a new call of it
    runs without a gate) for as long as the chat has records, and goes with the last one."""
    world = World(journal_keeps_results=False)
    gated = CallSpec("k1", "write_file", CALLS["write"][1], approval=True)
    assert world.request(CallRequest("a0", gated, False, None))
    world.commit(len(world.pending_writes))  # the parked gate's row
    assert world.request(ApproveRequest("a0", "k1", True, None, None, "chat"))
    world.quiesce()
    world.restart()
    assert world.state.approved_tools == ("write_file",)
    again = CallSpec("k2", "write_file", CALLS["write"][1], approval=True)
    assert world.request(CallRequest(world.conns[0], again, False, None))
    assert world.state.records.get("k2").state.wire_state != "awaiting_approval"  # type: ignore[union-attr]
    world.quiesce()
    world.now += 2 * FORGET_AFTER_S
    world.request(Sweep())  # every record is forgotten: the approval goes with them
    world.commit(len(world.pending_writes))
    world.restart()
    assert world.state.approved_tools == () and not world.approvals
    world.check_all_answered()


def test_planning_a_turn_makes_no_filesystem_call() -> None:
    """Issue 28: ChatState.handle runs on the loop for every chat, so a slow or network
    workspace must not stall it: the shell resolves a turn's paths (its reservations) and
    ChatState plans with what it is handed, calling nothing that reads the filesystem."""
    import os
    import posixpath
    import sys
    from types import FrameType

    world = World(journal_keeps_results=False)
    specs = (
        CallSpec("k1", "read_file", {"path": "a/../f"}),
        CallSpec("k2", "write_file", {"path": "./f", "content": "x"}),
        CallSpec("k3", "search_files", {"pattern": "x"}),
    )
    turn = TurnRequest("a0", "t1", specs, True, None)
    planned = TurnPlanned("t1", reserve(specs, "/ws"))
    watched = {posixpath.realpath.__code__, posixpath.expanduser.__code__}
    builtins = {os.stat, os.lstat, os.readlink, os.listdir, os.scandir}
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in watched:
            seen.append(frame.f_code.co_name)
        elif event == "c_call" and arg in builtins:
            seen.append(arg.__name__)

    sys.setprofile(profile)
    try:
        asked = world.state.handle(turn, world.now, world.wall_ms)
        effects = world.state.handle(planned, world.now, world.wall_ms)
    finally:
        sys.setprofile(None)
    assert seen == []
    # The turn asks the shell for what its calls reserve, and sends nothing before its plan.
    assert [e for e in asked if isinstance(e, Send | Follow)] == []
    assert [e for e in asked if isinstance(e, ResolveTurn)] == [ResolveTurn("t1", specs)]
    # The plan is the one the resolved paths give: the write of f conflicts with its read.
    plans = [e for e in effects if isinstance(e, Send) and isinstance(e.event, TurnPlanEvent)]
    assert plans[0].event.segments == [["k1"], ["k2"], ["k3"]]


def test_a_close_whose_records_are_forgotten_while_it_stops_a_group_still_answers() -> None:
    """9.6: a close that waits for a group it stops gets its `chat_closed` once the group is
    gone, also when the chat's records were all forgotten meanwhile and its close row dropped
    with them (found by the machine: the World took that answer for one before its durable
    close)."""
    machine = ChatStateMachine()
    machine.start(keeps=False)
    machine.turn(approval=False, calls=[("k1", "bg")], conn=0, stream=False, turn_id="t1")
    machine.commit(n=1)
    machine.commit(n=1)
    machine.close_chat(conn=0)
    machine.commit(n=1)
    machine.time_passes(seconds=40.0)
    machine.teardown()


# --- a turn whose paths are being resolved (issue 28) ---------------------------------------------

TURN_OF_WRITES = (
    CallSpec("k1", "write_file", {"path": "f", "content": "1"}),
    CallSpec("k2", "write_file", {"path": "f", "content": "2"}),
)


def _unplanned_turn(world: World, *, stream: bool = True) -> None:
    """A turn of two writes of one file, admitted, its paths still being resolved."""
    world.owed["a0"].turns["t1"] += 1
    world.turn_calls["t1"] = [s.call_id for s in TURN_OF_WRITES]
    assert world.request(TurnRequest("a0", "t1", TURN_OF_WRITES, stream, None))
    assert "t1" in world.resolving
    assert world.owed["a0"].turn_plans["t1"] == 0 and not world.owed["a0"].accepted


def test_an_interrupt_of_a_turn_being_planned_ends_its_calls_and_answers_after_its_plan() -> None:
    """5.7 with 5.6: the interrupt ends the queued calls at once (`not_run`, nothing runs); the
    turn's `turn_plan` still comes first, then its `turn_result` with those results, then the
    `interrupted`, once the paths are resolved."""
    world = World(journal_keeps_results=False)
    _unplanned_turn(world)
    world.owed["a0"].interrupts += 1
    assert world.request(InterruptRequest("a0", "t1", None))
    world.commit(len(world.pending_writes))  # the not_run results are durable
    assert world.owed["a0"].interrupted == 0, "interrupted before the turn's turn_result"
    assert world.owed["a0"].turn_results["t1"] == 0
    world.paths_resolved("t1")
    assert world.owed["a0"].turn_plans["t1"] == 1 and world.owed["a0"].interrupted == 1
    world.quiesce()
    world.check_all_answered()
    assert not any(world.effects_run.values()), "a call of the interrupted turn ran"
    for call_id in ("k1", "k2"):
        result = world.committed[call_id].result
        assert result is not None and result.outcome is Outcome.NOT_RUN


def test_a_turn_whose_paths_cannot_be_resolved_fails_its_calls_and_the_chat_goes_on() -> None:
    """The shell's resolution raised: each call the turn created ends `failed`, saying why,
    nothing runs, and the turn is answered; the chat takes the next call as usual."""
    world = World(journal_keeps_results=False)
    _unplanned_turn(world, stream=False)
    world.paths_resolved("t1", fails=True)
    world.quiesce()
    world.check_all_answered()
    for call_id in ("k1", "k2"):
        result = world.committed[call_id].result
        assert result is not None and result.outcome is Outcome.FAILED
        assert "could not resolve the paths of its turn (OSError: simulated)" in result.text
    assert not any(world.effects_run.values())
    assert world.request(CallRequest("a0", CallSpec("k3", "read_file", {"path": "f"}), False, None))
    world.quiesce()
    world.check_all_answered()


def test_a_plan_for_a_turn_that_is_gone_is_ignored() -> None:
    """A `TurnPlanned` that comes for no unplanned turn (the turn ended and was forgotten, or
    the chat restarted meanwhile) changes nothing and sends nothing."""
    world = World(journal_keeps_results=False)
    assert world.state.handle(TurnPlanned("t1", ()), world.now, world.wall_ms) == []
    _unplanned_turn(world)
    world.paths_resolved("t1")
    world.quiesce()
    world.check_all_answered()
    again = reserve(TURN_OF_WRITES, "/ws")
    assert world.state.handle(TurnPlanned("t1", again), world.now, world.wall_ms) == []


def test_a_detach_sent_after_a_turn_being_planned_stops_its_events_there() -> None:
    """9.9: a detach of a turn's call sent after the (streamed) turn applies once the turn's
    request follows the call: the connection still gets the call's `accepted` and `result`,
    but no event of it; a repeat after the detach follows it again."""
    world = World(journal_keeps_results=False)
    _unplanned_turn(world)
    assert world.request(DetachRequest("a0", "k1"))
    assert world.request(DetachRequest("a0", "k2"))
    assert world.request(CallRequest("a0", TURN_OF_WRITES[1], True, None))  # k2 followed again
    world.paths_resolved("t1")
    assert ("a0", "k1") not in world.streams
    assert ("a0", "k2") in world.streams
    world.quiesce()
    world.check_all_answered()
