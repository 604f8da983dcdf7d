"""How a chat carries out the journal's effects (actors/effects.py): rows written, touched and
deleted, approvals saved, results read back. Each completion is fed back to the chat's
`ChatState` as an input; nothing here decides anything."""

from __future__ import annotations

import logging
from typing import Protocol

from toolwire.actors.context import AgentContext
from toolwire.actors.effects import (
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
    ResultsRead,
)
from toolwire.actors.journal import JournalError
from toolwire.actors.task_host import TaskHost

log = logging.getLogger("toolwire.chat")


class Fed(Protocol):
    """Where the completions go: the chat's interpreter (ChatActor)."""

    def feed(self, event: Input) -> None: ...

    def feed_all(self, events: list[Input]) -> None: ...


class JournalEffects:
    # The chat itself rather than two bound methods of it: 120 bytes less per idle chat.
    __slots__ = ("_chat", "_chat_id", "_ctx", "_tasks", "_waiting")

    def __init__(self, chat_id: str, ctx: AgentContext, chat: Fed, tasks: TaskHost) -> None:
        self._chat_id = chat_id
        self._ctx = ctx
        self._chat = chat
        self._tasks = tasks
        # What waits for a change of this chat to be durable, in sequence order (the journal
        # numbers changes in the order they are queued). None while nothing waits: most chats
        # are idle, and an empty list costs each of them 56 bytes.
        self._waiting: list[tuple[int, Input]] | None = None

    def write(self, effect: JournalWrite) -> None:
        journal = self._ctx.journal
        try:
            seq = journal.write(effect.row)
        except Exception:
            log.exception(
                "journaling %s failed",
                effect.row.call_id,
                extra={"chat_id": self._chat_id, "call_id": effect.row.call_id},
            )
            self._chat.feed(JournalFailed(effect.row.call_id))
            return
        if effect.then is not None:
            self._feed_when_durable(seq, effect.then)

    def touch(self, effect: JournalTouch) -> None:
        self._ctx.journal.touch(self._chat_id, effect.call_id, effect.wall_ms)

    def delete(self, effect: JournalDelete) -> None:
        self._ctx.journal.delete(self._chat_id, effect.call_id)

    def approve_tool(self, effect: JournalApproveTool) -> None:
        self._ctx.journal.approve_tool(self._chat_id, effect.tool)

    def forget_approvals(self, effect: JournalForgetApprovals) -> None:
        self._ctx.journal.forget_approvals(self._chat_id)

    def close(self, effect: JournalClose) -> None:
        # No `JournalFailed` path: the journal refuses a queued change only once its writer
        # failed, and then the agent stops (a close is not a call that could end otherwise).
        seq = self._ctx.journal.mark_closed(self._chat_id, effect.closed_at_ms)
        self._feed_when_durable(seq, effect.then)

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
            # oldest change durable feeds the chat everything it covers in one go.
            journal.when_durable(seq, self._release_durable)

    def _release_durable(self) -> None:
        waiting = self._waiting
        assert waiting is not None
        journal = self._ctx.journal
        covered = 0
        while covered < len(waiting) and journal.is_durable(waiting[covered][0]):
            covered += 1
        ready = [then for _, then in waiting[:covered]]
        del waiting[:covered]
        if waiting:
            journal.when_durable(waiting[0][0], self._release_durable)
        else:
            self._waiting = None
        self._chat.feed_all(ready)

    def reopen(self, effect: JournalReopen) -> None:
        self._ctx.journal.forget_closed(self._chat_id)

    def read_back(self, effect: ReadBack) -> None:
        self._tasks.start_soon(self._read_back, effect.call_ids)

    async def _read_back(self, call_ids: tuple[str, ...]) -> None:
        keys = [(self._chat_id, call_id) for call_id in call_ids]
        found = await self._ctx.journal.read_results(keys)
        results = {}
        for (chat_id, call_id), result in zip(keys, found, strict=True):
            if result is None:
                # A pinned record is never forgotten, so its row cannot be gone: the journal
                # lost a durable result. Stop rather than answer anything else.
                raise JournalError(f"the journal has no saved result for {chat_id!r}/{call_id!r}")
            results[call_id] = result
        self._chat.feed(ResultsRead(results))
