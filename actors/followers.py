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
)
from toolwire.actors.outbox import Outbox, Subscription


class _CallIO:
    """The follows of one call, and whether its result went out."""

    __slots__ = ("published", "subs")

    def __init__(self) -> None:
        self.subs: dict[Outbox, Subscription] = {}
        self.published = False


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

    def _subscribe(self, outbox: Outbox, call_id: str, io: _CallIO, stream: bool) -> Subscription:
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
        sub.stream = sub.stream or stream
        return sub

    def follow(self, effect: Follow) -> None:
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        io = self._io_for(effect.call_id)
        before = io.subs.get(outbox)
        # Already streaming output to this connection for an earlier request: that request's
        # output must not be skipped, so the cursor only ever moves back (PROTOCOL.md 9.9).
        was_following = before is not None and before.following
        sub = self._subscribe(outbox, effect.call_id, io, effect.stream)
        if effect.resolved_events:
            sub.resolved_events = True
        for event in effect.events:
            outbox.put(event, sub)
        if effect.mode is FollowMode.LIVE:
            wanted = effect.from_offset or 0
            sub.cursor = min(sub.cursor, wanted) if was_following else wanted
            sub.finished = False
            if effect.started is not None:
                outbox.put(effect.started, sub)
            sub.output_ready()
        elif effect.mode is FollowMode.SUBSCRIBE and effect.from_offset and not was_following:
            # A new call asked to start its output at an offset (PROTOCOL.md 10.2).
            sub.cursor = effect.from_offset
        elif effect.mode is FollowMode.REPLAY:
            io.published = True
            if not was_following:
                # No live output for this connection: a process that outlived its call (a
                # timeout) goes on printing, but no output follows a result.
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
            sub = self._subscribe(outbox, effect.call_id, io, False)
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
        if effect.keep or sub.results_queued:
            # Its events stop now, but each request already made still gets its `accepted`
            # (queued) and its one `result` (PROTOCOL.md 9.9): the subscription stays for them.
            sub.detached = True
        else:
            del io.subs[sub.outbox]
            sub.active = False
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

    def maybe_close_output(self, call_id: str) -> None:
        """Shrink a finished process's output to the result's size once no follower lags:
        while its call is followed the full retention stays (PROTOCOL.md 5.2). Then, once
        the call is published and no follower needs its output, drop its follows."""
        io = self._io.get(call_id)
        if io is None:
            return
        proc = self.processes.get(call_id)
        if proc is not None and not proc.output.closed:
            if not proc.output_closed.is_set():
                return  # the command may still print
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
