"""The root actor: the chat registry, policy, limits, the sweeper and orderly shutdown.

`Agent` owns one nursery; each chat runs as a `ChatActor` task inside it (a nursery of its own).
Requests come in as plain method calls from the transport (no WebSocket in here) and are routed
to the chat they name; `""` is the chat-less namespace, a chat of its own.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from typing import Any

import trio

from toolwire.actors import keeper_store, kept
from toolwire.actors.calls import CallSpec
from toolwire.actors.chat import ChatActor
from toolwire.actors.chat_state import ChatState
from toolwire.actors.context import AgentContext, Limits, wall_clock_ms
from toolwire.actors.journal import JournalError, wall_ms_to_monotonic
from toolwire.actors.outbox import Outbox
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.results import ToolwireError
from toolwire.actors.tools.registry import TOOL_NAMES

log = logging.getLogger("toolwire.agent")

# Kept importable from here: the transport, the simulation and tests name them so.
__all__ = ["Agent", "AgentContext", "Limits", "wall_clock_ms"]


# Recovery lets other tasks run after this many records: a large journal takes seconds to
# rebuild, and meanwhile the server must answer its probes (`/healthz` 200, `/readyz` 503).
RECOVERY_YIELD_ROWS = 1000

# How often the sweeper forgets expired records and exited processes. Forgetting is also checked
# on every insert, so this only bounds how long an idle chat holds memory past its expiry.
SWEEP_INTERVAL_S = 60.0


class Agent:
    def __init__(
        self,
        ctx: AgentContext,
        agent_id: str | None = None,
        *,
        state_class: type[ChatState] = ChatState,
    ) -> None:
        self.ctx = ctx
        # Every chat's state machine: ChatState itself (the simulation runs known bugs planted in
        # subclasses of it to prove its checker can fail).
        self._state_class = state_class
        self._chat_config = ctx.chat_config()
        self.agent_id = agent_id or f"toolwire-{os.uname().nodename}"
        self.boot_id = str(uuid.uuid4())  # new on every start (PROTOCOL.md 4, welcome)
        self.tools = list(TOOL_NAMES)
        self.chats: dict[str, ChatActor] = {}
        # Recent results of every chat; new on every start, like all the agent's memory.
        self.results = ResultCache(ctx.result_cache_entries, ctx.result_cache_bytes)
        self.recovered = 0  # records rebuilt from the journal at start
        # True once recovery is done and durable and requests are taken (`/readyz`).
        self.ready = False
        self.stopping = False  # shutdown() began: requests are refused
        # Why the agent must stop (its journal can no longer write), once it must: readiness
        # goes false at once, and whoever runs the agent stops it (transport/server.py).
        self.failure: str | None = None
        self._failed = trio.Event()
        self._nursery: trio.Nursery | None = None
        # The journal's last write before this agent's first: a store may count writes a dead
        # agent queued and never committed, which never become durable, so recovery and
        # shutdown wait only for writes queued after this one.
        self._journal_seq_at_start = ctx.journal.queued_seq

    async def run(self, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.ctx.journal.on_failure = self._journal_failed
            await nursery.start(self.ctx.journal.run)
            self._journal_seq_at_start = self.ctx.journal.queued_seq
            readopted: dict[tuple[str, str], kept.Readopted] = {}
            keeper = self.ctx.keeper
            if keeper is not None:
                keeper.nursery = nursery
                nursery.start_soon(keeper.client.run)
                # Before any request: every command the keeper held for the last agent is
                # found again, so its chat never answers without it (PROTOCOL.md 10.1).
                limits = self.ctx.limits
                for found in kept.readopt(
                    keeper.client, limits.output_retention_bytes, limits.result_output_bytes
                ):
                    readopted[(found.meta.chat_id, found.meta.call_id)] = found
                # From here on a full socket is waited for off the loop (`KeeperClient.send`):
                # not before, where `readopt` waits for its replies without yielding.
                keeper.client.nursery = nursery
            self.recovered = await self._recover(readopted)
            self._drop_unclaimed(readopted)
            # Recovery ends every call that was running when the agent died `unknown`. That
            # outcome is on disk before the agent takes requests: a retry right after a restart
            # is told "done" with its result, never "running" while the write is under way.
            await self._wait_own_writes_durable()
            nursery.start_soon(self._sweeper)
            self.ready = True
            task_status.started(self)
            await trio.sleep_forever()

    def _journal_failed(self, reason: str) -> None:
        """A journal that can no longer write takes at most once with it: no call may start
        (its start could not be saved) and no result can be saved. So the agent stops, and
        says why first, in one line (before the journal fails the changes it still held)."""
        if self.failure is not None:
            return
        self.failure = reason
        self.ready = False
        self.stopping = True  # no request is taken from here on
        log.critical(
            "%s; the agent stops: not ready, running commands stopped, connections closed "
            "with 1011, exit status 1",
            reason,
            extra={"journal_failure": reason},
        )
        self._failed.set()

    async def wait_failed(self) -> str:
        """Return `failure` once the agent must stop because its journal failed."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    async def _recover(self, readopted: dict[tuple[str, str], kept.Readopted]) -> int:
        """Rebuild every journaled record (in touch order, so forgetting stays ordered), each
        with its command's process if the keeper recorded one."""
        now_wall, now = self.ctx.wall_ms(), trio.current_time()
        recovered = 0
        for row in self.ctx.journal.recover():
            touched_at = wall_ms_to_monotonic(row.touched_at_ms, now_wall, now)
            found = readopted.pop((row.chat_id, row.call_id), None)
            self.chat(row.chat_id).restore(row, touched_at, found)
            recovered += 1
            if recovered % RECOVERY_YIELD_ROWS == 0:
                # Nothing takes requests yet (the server answers 503 until `ready`); what runs
                # meanwhile is the server's probes and the tasks restored records started.
                await trio.lowlevel.checkpoint()
        self._recover_chat_rows()
        return recovered

    def _drop_unclaimed(self, readopted: dict[tuple[str, str], kept.Readopted]) -> None:
        """Processes of calls the journal no longer has (forgotten, or never made durable):
        no call can answer for them, so none is left running unseen."""
        for found in readopted.values():
            handle = found.handle
            if handle is not None and found.status is None:
                handle.signal_group(signal.SIGKILL)
            if handle is not None:
                handle.release()
            else:
                if found.status is None:
                    kept.stop_orphan(found.meta)  # its keeper is gone; it may still run
                keeper_store.remove(found.path)

    def _recover_chat_rows(self) -> None:
        """After the records, each chat's approvals (9.5) and close (9.6), handed to the chat:
        its ChatState decides what still holds (a chat with no record left drops them)."""
        journal = self.ctx.journal
        approved: dict[str, list[str]] = {}
        for chat_id, tool in journal.load_approvals():
            approved.setdefault(chat_id, []).append(tool)
        closed = set(journal.load_closed())
        for chat_id in dict.fromkeys([*approved, *closed]):
            self.chat(chat_id).recovered(tuple(approved.get(chat_id, ())), chat_id in closed)

    def chat(self, chat_id: str) -> ChatActor:
        if self.stopping:
            raise ToolwireError(
                "internal", "the agent is shutting down; send this again once it restarted"
            )
        chat = self.chats.get(chat_id)
        if chat is None:
            if self._nursery is None:
                raise RuntimeError("the agent is not running")
            chat = ChatActor(
                self.ctx,
                chat_id,
                self._nursery.start_soon,
                results=self.results,
                config=self._chat_config,
                state_class=self._state_class,
            )
            self.chats[chat_id] = chat
        return chat

    # Requests, routed to their chat. Each raises ToolwireError and changes nothing on bad input.

    def call(
        self,
        outbox: Outbox,
        chat_id: str,
        spec: CallSpec,
        *,
        stream: bool,
        rid: Any,
        from_offset: int = 0,
    ) -> None:
        self.chat(chat_id).call(outbox, spec, stream=stream, rid=rid, from_offset=from_offset)

    def attach(
        self, outbox: Outbox, chat_id: str, call_id: str, from_offset: int, rid: Any
    ) -> None:
        self.chat(chat_id).attach(outbox, call_id, from_offset, rid)

    def detach(self, outbox: Outbox, chat_id: str, call_id: str) -> None:
        self.chat(chat_id).detach(outbox, call_id)

    def cancel(self, outbox: Outbox, chat_id: str, call_ids: list[str], rid: Any) -> None:
        self.chat(chat_id).cancel(outbox, call_ids, rid)

    def approve(
        self,
        outbox: Outbox,
        chat_id: str,
        call_id: str,
        approved: bool,
        rid: Any,
        reason: str | None = None,
        scope: str = "call",
    ) -> None:
        self.chat(chat_id).approve(outbox, call_id, approved, rid, reason, scope)

    def turn(
        self,
        outbox: Outbox,
        chat_id: str,
        turn_id: str,
        specs: list[CallSpec],
        *,
        stream: bool,
        rid: Any,
    ) -> None:
        self.chat(chat_id).turn(outbox, turn_id, specs, stream=stream, rid=rid)

    def interrupt(self, outbox: Outbox, chat_id: str, turn_id: str | None, rid: Any) -> None:
        self.chat(chat_id).interrupt(outbox, turn_id, rid)

    def close_chat(self, outbox: Outbox, chat_id: str, rid: Any) -> None:
        self.chat(chat_id).close_chat(outbox, rid)

    # Housekeeping and shutdown

    async def _sweeper(self) -> None:
        while True:
            await trio.sleep(SWEEP_INTERVAL_S)
            self.sweep()

    def sweep(self) -> None:
        for chat_id, chat in list(self.chats.items()):
            chat.sweep()
            if chat.idle:
                # Memory is bounded by live records: an empty chat costs nothing to recreate.
                del self.chats[chat_id]
                chat.forgotten()

    async def shutdown(self) -> None:
        """Stop gracefully (PROTOCOL.md 9.3): no request is taken from here on; every chat
        stops its running calls and process groups (SIGTERM, `kill_grace_ms`, SIGKILL) and
        saves them `canceled` with the shutdown's text; then every queued journal write is
        made durable, so a repeat after a restart gets those results."""
        self.stopping = True
        if self.ctx.keep_on_shutdown and self.ctx.keeper is not None:
            # `--on-shutdown keep` (10.1): every command goes on, held by the keeper, its call
            # unresolved in the journal; the next agent re-adopts them.
            self.ctx.keeper.client.close()
        else:
            async with trio.open_nursery() as nursery:
                for chat in list(self.chats.values()):
                    nursery.start_soon(chat.shutdown)
        try:
            await self._wait_own_writes_durable()
        except JournalError:
            if self.failure is None and self.ctx.journal.failure is None:
                raise
            # The journal failed: what it could not save was answered from memory (9.9).

    async def _wait_own_writes_durable(self) -> None:
        """Until every journal write this agent queued is durable (commits are in order: its
        last one is enough). Writes of a dead agent before it are not waited for: those it
        never committed never will be (see `_journal_seq_at_start`)."""
        journal = self.ctx.journal
        if journal.queued_seq != self._journal_seq_at_start:
            await journal.wait_durable(journal.queued_seq)
