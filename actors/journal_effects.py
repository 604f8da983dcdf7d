"""How a chat carries out the journal's effects (actors/effects.py): rows written, touched and
deleted, approvals saved, results read back. Each completion is fed back to the chat's
`ChatState` as an input; nothing here decides anything.

A journal failure ends at most the calls it concerns: a row the journal refuses comes back as
`JournalFailed` (or `CloseFailed`) for its own call (or close), a read that keeps failing as
`ResultsReadFailed` for the calls it was for, and each is logged with the chat and the call. A
change nobody waits for (a touch, a delete, an approval's row) that the journal refuses is only
logged, with what it means after a restart. None of it raises into the chat's interpreter or
its nursery: that would end every other call of the agent (issue 26)."""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from toolwire.actors.context import AgentContext
from toolwire.actors.effects import (
    CloseDurable,
    CloseFailed,
    Input,
    JournalApproveTool,
    JournalClose,
    JournalDelete,
    JournalFailed,
    JournalForgetApprovals,
    JournalReopen,
    JournalTouch,
    JournalWrite,
    ReadBack,
    ResultDurable,
    ResultsRead,
    ResultsReadFailed,
    StartDurable,
)
from toolwire.actors.task_host import TaskHost

log = logging.getLogger("toolwire.chat")

# A read-back that fails is tried again this many times, after these pauses, before the calls
# it was for are answered without their saved results: a reader can meet a passing error (an
# interrupted system call, a busy lock, an NFS hiccup) that the next try does not. Short and
# few, like SQLite's own busy handler: a repeat waits at most their sum (about a second) for
# an answer, and a disk that stays unreadable is not hammered.
READ_RETRY_DELAYS_S = (0.05, 0.25, 1.0)


class Fed(Protocol):
    """Where the completions go: the chat's interpreter (ChatActor)."""

    def feed(self, event: Input) -> None: ...

    def feed_all(self, events: list[Input]) -> None: ...


class ForgottenChat:
    """What a chat's journal effects feed once the agent has dropped the chat (idle: nothing of
    it waits for the journal). Anything fed is a defect, logged, never raised: it comes from a
    journal callback, where raising would end every other chat's work."""

    __slots__ = ("chat_id",)

    def __init__(self, chat_id: str) -> None:
        self.chat_id = chat_id

    def feed(self, event: Input) -> None:
        self.feed_all([event])

    def feed_all(self, events: list[Input]) -> None:
        log.error(
            "chat %r was forgotten with journal completions still to come: %r",
            self.chat_id,
            events,
            extra={"chat_id": self.chat_id},
        )


class JournalEffects:
    # The chat itself rather than two bound methods of it: 120 bytes less per idle chat. The
    # chat owns this, so the two make a cycle: `forget_chat` breaks it when the chat is dropped.
    __slots__ = ("_chat", "_chat_id", "_ctx", "_tasks", "_waiting")

    def __init__(self, chat_id: str, ctx: AgentContext, chat: Fed, tasks: TaskHost) -> None:
        self._chat_id = chat_id
        self._ctx = ctx
        self._chat: Fed = chat
        self._tasks = tasks
        # What waits for a change of this chat to be durable, in sequence order (the journal
        # numbers changes in the order they are queued). None while nothing waits: most chats
        # are idle, and an empty list costs each of them 56 bytes.
        self._waiting: list[tuple[int, Input]] | None = None

    def forget_chat(self) -> None:
        """The chat is dropped: let go of it (see `ForgottenChat`)."""
        self._chat = ForgottenChat(self._chat_id)

    def write(self, effect: JournalWrite) -> None:
        journal = self._ctx.journal
        call_id = effect.row.call_id
        try:
            seq = journal.write(effect.row)
        except Exception as exc:
            self._refused("the row of", call_id, exc)
            self._chat.feed(JournalFailed(call_id))
            return
        if effect.then is not None:
            self._feed_when_durable(seq, effect.then)

    def touch(self, effect: JournalTouch) -> None:
        try:
            self._ctx.journal.touch(self._chat_id, effect.call_id, effect.wall_ms)
        except Exception as exc:
            self._refused("the touch of", effect.call_id, exc)

    def delete(self, effect: JournalDelete) -> None:
        try:
            self._ctx.journal.delete(self._chat_id, effect.call_id)
        except Exception as exc:
            self._refused("the delete of", effect.call_id, exc)

    def approve_tool(self, effect: JournalApproveTool) -> None:
        try:
            self._ctx.journal.approve_tool(self._chat_id, effect.tool)
        except Exception as exc:
            self._refused(f"the chat-wide approval of {effect.tool} in", None, exc)

    def forget_approvals(self, effect: JournalForgetApprovals) -> None:
        try:
            self._ctx.journal.forget_approvals(self._chat_id)
        except Exception as exc:
            self._refused("forgetting the approvals of", None, exc)

    def close(self, effect: JournalClose) -> None:
        try:
            seq = self._ctx.journal.mark_closed(self._chat_id, effect.closed_at_ms)
        except Exception as exc:
            self._refused("the close of", None, exc)
            self._chat.feed(CloseFailed())
            return
        self._feed_when_durable(seq, effect.then)

    def reopen(self, effect: JournalReopen) -> None:
        try:
            self._ctx.journal.forget_closed(self._chat_id)
        except Exception as exc:
            self._refused("the reopening of", None, exc)

    def _refused(self, what: str, call_id: str | None, exc: Exception) -> None:
        """Log a change the journal refused at once. A journal that failed as a whole refuses
        everything from then on, and the agent stopping says why once: no traceback per row."""
        journal = self._ctx.journal
        where = f"chat {self._chat_id!r}" if call_id is None else f"{self._chat_id}/{call_id}"
        log.error(
            "the journal refused %s %s: %s",
            what,
            where,
            exc,
            exc_info=None if journal.failure is not None else exc,
            extra={"chat_id": self._chat_id, "call_id": call_id},
        )

    def _feed_when_durable(self, seq: int, then: Input) -> None:
        journal = self._ctx.journal
        waiting = self._waiting
        if waiting is None:
            if journal.is_durable(seq):
                self._chat.feed(then)
                return
            waiting = self._waiting = []
        waiting.append((seq, then))
        if len(waiting) == 1:
            # One callback per chat and commit, not one per row: the commit that makes the
            # oldest change durable (or that fails it) feeds the chat everything it covers in
            # one go.
            journal.when_durable(seq, self._release_durable)

    def _release_durable(self) -> None:
        waiting = self._waiting
        assert waiting is not None
        journal = self._ctx.journal
        ready: list[Input] = []
        covered = 0
        for seq, then in waiting:
            if journal.is_durable(seq):
                ready.append(then)
            elif journal.failed(seq) is not None:
                ready.append(self._failure_of(seq, then))
            else:
                break
            covered += 1
        del waiting[:covered]
        if waiting:
            journal.when_durable(waiting[0][0], self._release_durable)
        else:
            self._waiting = None
        self._chat.feed_all(ready)

    def _failure_of(self, seq: int, then: Input) -> Input:
        """What the chat is told of a change the journal will never make durable (the journal
        logged the change and its error)."""
        if isinstance(then, StartDurable | ResultDurable):
            return JournalFailed(then.call_id)
        assert isinstance(then, CloseDurable), then
        return CloseFailed()

    def read_back(self, effect: ReadBack) -> None:
        self._tasks.start_soon(self._read_back, effect.call_ids)

    async def _read_back(self, call_ids: tuple[str, ...]) -> None:
        keys = [(self._chat_id, call_id) for call_id in call_ids]
        journal = self._ctx.journal
        found = None
        for delay in (*READ_RETRY_DELAYS_S, None):
            try:
                found = await journal.read_results(keys)
                break
            except Exception as exc:
                if delay is None or journal.failure is not None:
                    self._read_failed(call_ids, exc)
                    return
                log.warning(
                    "reading back saved results of chat %r failed (%s); trying again in %s s",
                    self._chat_id,
                    exc,
                    delay,
                    extra={"chat_id": self._chat_id, "call_ids": list(call_ids)},
                )
                await trio.sleep(delay)
        assert found is not None
        results = {}
        missing: list[str] = []
        for call_id, result in zip(call_ids, found, strict=True):
            if result is None:
                missing.append(call_id)
            else:
                results[call_id] = result
        if missing:
            # A pinned record is never forgotten, so its row cannot be gone: the journal lost
            # a durable result. What the agent can say of those calls is that it does not know.
            log.error(
                "the journal has no saved result for %s of chat %r; answered unknown",
                ", ".join(missing),
                self._chat_id,
                extra={"chat_id": self._chat_id, "call_ids": missing},
            )
            self._chat.feed(ResultsReadFailed(tuple(missing), results))
            return
        self._chat.feed(ResultsRead(results))

    def _read_failed(self, call_ids: tuple[str, ...], exc: Exception) -> None:
        log.error(
            "reading back saved results of chat %r failed (%s): %s answered unknown; their "
            "saved results stay in the journal for a later repeat",
            self._chat_id,
            exc,
            ", ".join(call_ids),
            extra={"chat_id": self._chat_id, "call_ids": list(call_ids)},
        )
        self._chat.feed(ResultsReadFailed(call_ids))
