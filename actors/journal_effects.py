"""How a chat carries out the journal's effects (actors/effects.py): rows written, touched and
deleted, approvals saved, results read back. Each completion is fed back to the chat's
`ChatState` as an input; nothing here decides anything."""

from __future__ import annotations

import logging
from collections.abc import Callable

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


class JournalEffects:
    __slots__ = ("_chat_id", "_ctx", "_feed", "_tasks")

    def __init__(
        self, chat_id: str, ctx: AgentContext, feed: Callable[[Input], None], tasks: TaskHost
    ) -> None:
        self._chat_id = chat_id
        self._ctx = ctx
        self._feed = feed
        self._tasks = tasks

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
            self._feed(JournalFailed(effect.row.call_id))
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
        if journal.is_durable(seq):
            self._feed(then)
        else:
            # Fed by the commit that makes it durable, with every other row that commit
            # covers: no task per call.
            journal.when_durable(seq, lambda: self._feed(then))

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
        self._feed(ResultsRead(results))
