"""The connections that follow each call of one chat, as the shell keeps them: one
`Subscription` per (connection, call), whose output cursor the connection's sender reads
(actors/outbox.py). `ChatState` decides who follows what and who is owed which reply; this
carries out its sending effects and keeps a finished command's retained output only as long as
a follower still needs it (PROTOCOL.md 5.2).
"""

from __future__ import annotations

import functools

from toolwire.actors import processes
from toolwire.actors.effects import (
    Detach,
    Follow,
    FollowMode,
    Forgotten,
    Publish,
    Send,
    SendReplay,
    SendResult,
    ShrinkOutput,
)
from toolwire.actors.outbox import Outbox, Subscription


class _CallIO:
    """The follows of one call, whether its result went out, and whether its command's
    output is to shrink (`ShrinkOutput`) once no follower lags."""

    __slots__ = ("published", "shrink", "subs")

    def __init__(self) -> None:
        self.subs: dict[Outbox, Subscription] = {}
        self.published = False
        self.shrink = False


class Followers:
    """Every follow of one chat's calls (see the module docstring)."""

    __slots__ = ("_io", "chat_id", "processes")

    def __init__(self, chat_id: str, table: processes.ProcessTable) -> None:
        self.chat_id = chat_id
        self.processes = table
        self._io: dict[str, _CallIO] = {}

    def __len__(self) -> int:
        return len(self._io)

    def _io_for(self, call_id: str) -> _CallIO:
        io = self._io.get(call_id)
        if io is None:
            io = self._io[call_id] = _CallIO()
        return io

    def _subscribe(self, outbox: Outbox, call_id: str, io: _CallIO) -> Subscription:
        sub = io.subs.get(outbox)
        if sub is None or not sub.active:
            sub = Subscription(outbox, self.chat_id, call_id)
            # A partial, not a lambda: called once per result, it adds no Python frame.
            sub.on_caught_up = functools.partial(self.maybe_close_output, call_id)
            io.subs[outbox] = sub
            proc = self.processes.get(call_id)
            if proc is not None:
                sub.buffer = proc.output
        sub.detached = False  # a new request on this connection follows the call again
        return sub

    def follow(self, effect: Follow) -> None:
        """Carry out a `Follow` as ChatState decided it: how the connection streams, where its
        cursor goes (PROTOCOL.md 9.9: `rewind_only`), whether a replay is queued."""
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        if effect.mode is FollowMode.ANSWER:
            # A new call that sends nothing but its result (a `Send`): no subscription, so
            # nothing of it is kept here, and nothing to release when it ends.
            for event in effect.events:
                outbox.put(event)
            return
        io = self._io_for(effect.call_id)
        sub = self._subscribe(outbox, effect.call_id, io)
        if effect.mode is not FollowMode.REPLAY:
            sub.stream = effect.stream
            sub.resolved_events = effect.resolved_events
        for event in effect.events:
            outbox.put(event, sub)
        if effect.mode is FollowMode.LIVE:
            wanted = effect.from_offset or 0
            sub.cursor = min(sub.cursor, wanted) if effect.rewind_only else wanted
            sub.finished = False
            if effect.started is not None:
                outbox.put(effect.started, sub)
            sub.output_ready()
        elif effect.mode is FollowMode.SUBSCRIBE and effect.from_offset:
            # A new call asked to start its output at an offset (PROTOCOL.md 10.2); ChatState
            # gives one only for a call it just made, which nobody followed before.
            sub.cursor = effect.from_offset
        elif effect.mode is FollowMode.REPLAY:
            io.published = True
            if not sub.following:
                # No live output for this connection: a process that outlived its call (a
                # timeout) goes on printing, but no output follows a result. (One still
                # draining the output a queued result owes goes on until that result.)
                sub.finished = True
            # Counted as queued while it is read back from the journal.
            sub.results_queued += 1
            if effect.from_offset is not None:
                sub.replays_pending += 1

    @staticmethod
    def send(effect: Send) -> None:
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        outbox.put(effect.event)

    def publish(self, effect: Publish) -> None:
        io = self._io.get(effect.call_id)
        if io is None:
            return
        to = effect.to
        for sub in io.subs.values():
            if sub.active and not sub.detached and (to is None or sub.outbox in to):
                sub.outbox.put(effect.event, sub)

    def send_result(self, effect: SendResult) -> None:
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        sub = self._io_for(effect.call_id).subs.get(outbox)
        if sub is None:
            outbox.put(effect.event)  # its follow was dropped (a closed connection)
        else:
            outbox.put_result(sub, effect.event)

    def send_replay(self, effect: SendReplay) -> None:
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        io = self._io_for(effect.call_id)
        sub = io.subs.get(outbox)
        if sub is None:
            # Its follow went (a detach): the replay still goes out, without output.
            sub = self._subscribe(outbox, effect.call_id, io)
            sub.detached = True
        else:
            sub.results_queued -= 1
        outbox.put_replay(sub, effect.event, effect.from_offset)

    def detach(self, effect: Detach) -> None:
        io = self._io.get(effect.call_id)
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        sub = io.subs.get(outbox) if io is not None else None
        if io is None or sub is None:
            return
        # Its events stop now (PROTOCOL.md 9.9). With `keep` the follow stays for the results
        # still owed to it; without, it goes, but stays active: a reply already queued for it
        # (a result, a replay) still goes out.
        sub.detached = True
        if not effect.keep:
            del io.subs[sub.outbox]
        self.maybe_close_output(effect.call_id)

    def forgotten(self, effect: Forgotten) -> None:
        """The record is gone: its follows stop."""
        io = self._io.pop(effect.call_id, None)
        if io is not None:
            for sub in io.subs.values():
                sub.active = False

    def call_ended(self, call_id: str) -> None:
        """The call's result went out: its follows go once nothing needs them."""
        io = self._io.get(call_id)
        if io is not None:
            io.published = True
            self.maybe_close_output(call_id)  # and releases the follows if nothing needs them

    def output_arrived(self, call_id: str) -> None:
        io = self._io.get(call_id)
        if io is not None:
            for sub in io.subs.values():
                sub.output_ready()

    def shrink_output(self, effect: ShrinkOutput) -> None:
        """ChatState decided the command's output shrinks (PROTOCOL.md 5.2): now, or once no
        follower still reads the full retention from its cursor."""
        proc = self.processes.get(effect.call_id)
        if proc is None or proc.output.closed:
            return
        io = self._io.get(effect.call_id)
        if io is None:
            proc.output.close()
            return
        io.shrink = True
        self.maybe_close_output(effect.call_id)

    def maybe_close_output(self, call_id: str) -> None:
        """Shrink a finished process's output to the result's size, as `ShrinkOutput` said,
        once no follower lags. Then, once the call is published and no follower needs its
        output, drop its follows."""
        io = self._io.get(call_id)
        if io is None:
            return
        proc = self.processes.get(call_id)
        if proc is not None and not proc.output.closed:
            if not io.shrink:
                return  # not decided yet: the command may still print
            subs = io.subs
            for outbox, sub in list(subs.items()):
                if not sub.active or outbox.closed:
                    del subs[outbox]
            if any(sub.lagging for sub in subs.values()):
                return
            proc.output.close()
        # Here no process of the call prints any more (none, or its output closed): a
        # published call keeps nothing here once no follower needs its output: idle records
        # stay small (10,000 chats of records).
        if not io.published:
            return
        for sub in io.subs.values():
            if sub.results_queued or sub.replays_pending:
                return  # a replay still to be sent reads the retained output through its follow
        del self._io[call_id]
        if not self._io:
            self._io = {}  # an emptied dict keeps its grown table: 120 bytes per idle chat

    # -----------------------------------------------------------------------------------------

    def spawned(self, call_id: str, proc: processes.ProcessRecord) -> None:
        """The call's command started: its followers read its output from now on."""
        io = self._io.get(call_id)
        if io is not None:
            for sub in io.subs.values():
                sub.buffer = proc.output
