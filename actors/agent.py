"""The root actor: the chat registry, policy, limits, the sweeper and orderly shutdown.

`Agent` owns one nursery; each chat runs as a `ChatActor` task inside it (a nursery of its own).
Requests come in as plain method calls from the transport (no WebSocket in here) and are routed
to the chat they name; `""` is the chat-less namespace, a chat of its own.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from toolwire.actors import processes
from toolwire.actors.chat import CallSpec, ChatActor
from toolwire.actors.journal import Journal, MemoryJournal, wall_ms_to_monotonic
from toolwire.actors.metrics import CallCounters
from toolwire.actors.outbox import Outbox
from toolwire.actors.result_cache import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, ResultCache
from toolwire.actors.tools.registry import TOOL_NAMES


@dataclass(frozen=True)
class Limits:
    """Every limit is explicit, reported in `welcome`, and has its reason beside it."""

    # Largest WebSocket message accepted (1009 above it). 16 MiB holds a write_file of a large
    # source file with room to spare, while bounding what one message can make us buffer.
    max_message_bytes: int = 16 * 1024 * 1024
    # Output retained per running process for streaming and re-attach (PROTOCOL.md 5.2).
    output_retention_bytes: int = 1024 * 1024
    # Output carried in a Result: 16 KiB head + 48 KiB tail (PROTOCOL.md 5.2).
    result_output_bytes: int = 64 * 1024
    # Longest blocking wait of process_output: 5 minutes, as in the anchor's agent.
    max_wait_ms: int = 5 * 60 * 1000
    # Records untouched this long may be forgotten (5.4); the anchor's agent uses one hour.
    forget_after_s: int = 3600
    # Exited processes stay listed this long (5.2); one hour, as the anchor's agent.
    exited_retention_s: int = 3600
    # Running processes per chat. A model in a loop can start processes faster than they exit;
    # 64 leaves room for real parallel builds while keeping one chat from exhausting the host.
    max_processes_per_chat: int = 64

    def as_dict(self) -> dict[str, int]:
        return {
            "max_message_bytes": self.max_message_bytes,
            "output_retention_bytes": self.output_retention_bytes,
            "result_output_bytes": self.result_output_bytes,
            "max_wait_ms": self.max_wait_ms,
            "forget_after_s": self.forget_after_s,
            "exited_retention_s": self.exited_retention_s,
            "max_processes_per_chat": self.max_processes_per_chat,
        }


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class AgentContext:
    """What every chat of one agent shares. Time and processes are injectable so that the
    simulation harness runs the same actors in virtual time with scripted processes."""

    workspace: str
    limits: Limits = field(default_factory=Limits)
    approve_tools: frozenset[str] = frozenset()
    approval_timeout_s: float | None = None
    # SIGTERM, then SIGKILL after this grace (PROTOCOL.md 5.3: kill_grace_ms default 2000).
    kill_grace_s: float = 2.0
    backend: processes.ProcessBackend = field(default_factory=processes.RealProcessBackend)
    wall_ms: Callable[[], int] = wall_clock_ms
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    # Where records survive restarts. MemoryJournal keeps nothing (tests, simulations, benches).
    journal: Journal = field(default_factory=MemoryJournal)
    # With a journal that keeps results, the recent results kept on the heap besides it (the
    # agent's whole LRU, see actors/result_cache.py); older ones are read back when needed.
    result_cache_entries: int = DEFAULT_MAX_ENTRIES
    result_cache_bytes: int = DEFAULT_MAX_BYTES
    # The operator's counters (`/metrics`); None counts nothing (the benchmark's baseline).
    metrics: CallCounters | None = field(default_factory=lambda: CallCounters(TOOL_NAMES))

    def __post_init__(self) -> None:
        for name in ("approval_timeout_s", "kill_grace_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")


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
        chat_class: type[ChatActor] = ChatActor,
    ) -> None:
        self.ctx = ctx
        # The simulation harness plants known bugs in a ChatActor subclass to prove its checker
        # can fail; production always uses ChatActor itself.
        self._chat_class = chat_class
        self.agent_id = agent_id or f"toolwire-{os.uname().nodename}"
        self.boot_id = str(uuid.uuid4())  # new on every start (PROTOCOL.md 4, welcome)
        self.tools = list(TOOL_NAMES)
        self.chats: dict[str, ChatActor] = {}
        # Recent results of every chat; new on every start, like all the agent's memory.
        self.results = ResultCache(ctx.result_cache_entries, ctx.result_cache_bytes)
        self.recovered = 0  # records rebuilt from the journal at start
        # True once recovery is done and durable and requests are taken (`/readyz`).
        self.ready = False
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.ctx.journal.run)
            journal = self.ctx.journal
            queued_before = journal.queued_seq
            self.recovered = await self._recover()
            # Recovery ends every call that was running when the agent died `unknown`. That
            # outcome is on disk before the agent takes requests: a retry right after a restart
            # is told "done" with its result, never "running" while the write is under way.
            # Only recovery's own writes are waited for (a store may count writes a dead agent
            # queued and never committed).
            if journal.queued_seq != queued_before:
                await journal.wait_durable(journal.queued_seq)
            nursery.start_soon(self._sweeper)
            self.ready = True
            task_status.started(self)
            await trio.sleep_forever()

    async def _recover(self) -> int:
        """Rebuild every journaled record (in touch order, so forgetting stays ordered)."""
        now_wall, now = self.ctx.wall_ms(), trio.current_time()
        recovered = 0
        for row in self.ctx.journal.recover():
            touched_at = wall_ms_to_monotonic(row.touched_at_ms, now_wall, now)
            self.chat(row.chat_id).restore(row, touched_at)
            recovered += 1
            if recovered % RECOVERY_YIELD_ROWS == 0:
                # Nothing takes requests yet (the server answers 503 until `ready`); what runs
                # meanwhile is the server's probes and the tasks restored records started.
                await trio.lowlevel.checkpoint()
        self._recover_approvals()
        return recovered

    def _recover_approvals(self) -> None:
        """Tools approved for a whole chat (9.5), after its records: an approval lasts while
        the chat has records, so one whose chat has none left (a crash between forgetting the
        last record and forgetting its approvals) is dropped now."""
        journal = self.ctx.journal
        stale: dict[str, None] = {}
        for chat_id, tool in journal.load_approvals():
            chat = self.chats.get(chat_id)
            if chat is not None and chat.records:
                chat.restore_approval(tool)
            else:
                stale[chat_id] = None
        for chat_id in stale:
            journal.forget_approvals(chat_id)

    def chat(self, chat_id: str) -> ChatActor:
        chat = self.chats.get(chat_id)
        if chat is None:
            if self._nursery is None:
                raise RuntimeError("the agent is not running")
            chat = self._chat_class(
                self.ctx, chat_id, self._nursery.start_soon, results=self.results
            )
            self.chats[chat_id] = chat
        return chat

    # Requests, routed to their chat. Each raises ToolwireError and changes nothing on bad input.

    def call(self, outbox: Outbox, chat_id: str, spec: CallSpec, *, stream: bool, rid: Any) -> None:
        self.chat(chat_id).call(outbox, spec, stream=stream, rid=rid)

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

    async def stop_processes(self, grace_s: float) -> None:
        """End every running process group: SIGTERM, then SIGKILL after `grace_s`."""
        running = [p for chat in self.chats.values() for p in chat.running_processes()]
        if not running:
            return
        async with trio.open_nursery() as nursery:
            for proc in running:
                proc.canceled = True
                nursery.start_soon(processes.terminate, proc, grace_s)
