"""What every chat of one agent shares: limits, policy, the clocks, the process backend, the
journal and the operator's counters. Imported by the agent, its chats and the transport; it
imports none of them (only the leaf modules whose types it holds), so the import graph of
`actors/` points one way: agent -> chat -> chat_state.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from toolwire.actors import processes
from toolwire.actors.budget import AgentBudget
from toolwire.actors.chat_state import MAX_IDS_PER_REQUEST, ChatConfig
from toolwire.actors.command_env import command_environment
from toolwire.actors.hidden_paths import HiddenPaths
from toolwire.actors.journal import Journal, MemoryJournal
from toolwire.actors.kept import KeptProcessBackend
from toolwire.actors.metrics import CallCounters
from toolwire.actors.result_cache import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES
from toolwire.actors.sandbox import Enforcement
from toolwire.actors.sandbox_policy import FULL, SandboxPolicy
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
    # Ids one request may name (a cancel's call_ids, a turn's calls): see MAX_IDS_PER_REQUEST
    # in actors/chat_state.py for its reason.
    max_ids_per_request: int = MAX_IDS_PER_REQUEST
    # The bounds of the whole agent (issue 27: per-chat limits let a client spread its load
    # over chats). Records held in memory, over all chats: each costs about 1.7 KB while its
    # call is recent (measured: 60,000 calls over 15,000 chats grew the agent from 64 to
    # 168 MiB), so 100,000 keep the table under about 170 MiB; forgotten after forget_after_s,
    # that is 100,000 calls an hour, some 28 a second for a whole hour. At the cap new calls
    # get over_limit; nothing held is dropped (docs/semantics.md, "Bounds"). Precedent:
    # memcached's and Redis's maxmemory cap what the cache may hold rather than the host.
    max_records: int = 100_000
    # Processes running over all chats: 256 is four chats at max_processes_per_chat, the count
    # issue 27 reached with four chats, and about what the default `ulimit -u` of a desktop
    # user (often 4096 to 63,000) and a 2-core host's RAM can take with room for the rest of
    # the machine. Precedent: systemd's default TasksMax is 15% of the kernel's pid limit.
    max_processes: int = 256
    # Bytes of messages being received and decoded at once, over all connections: a reader
    # whose message would go past it waits before reading more (back-pressure through TCP),
    # except the message that began first, which always goes on (so the limit must hold one
    # message of max_message_bytes). Four messages of the maximum size: 20 concurrent 16 MiB
    # messages took the agent to 861 MiB (issue 27). Precedent: nginx's
    # client_body_buffer_size and HAProxy's tune.bufsize bound what a request may hold in
    # memory at once, and the rest waits in the kernel's socket buffers.
    max_message_bytes_in_flight: int = 4 * 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "max_ids_per_request",
            "max_records",
            "max_processes",
            "max_message_bytes_in_flight",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"limit {name} must be an integer >= 1, not {value!r}")
        if self.max_message_bytes_in_flight < self.max_message_bytes:
            raise ValueError(
                f"max_message_bytes_in_flight ({self.max_message_bytes_in_flight}) must hold at "
                f"least one message of max_message_bytes ({self.max_message_bytes})"
            )

    def as_dict(self) -> dict[str, int]:
        return {
            "max_message_bytes": self.max_message_bytes,
            "output_retention_bytes": self.output_retention_bytes,
            "result_output_bytes": self.result_output_bytes,
            "max_wait_ms": self.max_wait_ms,
            "forget_after_s": self.forget_after_s,
            "exited_retention_s": self.exited_retention_s,
            "max_processes_per_chat": self.max_processes_per_chat,
            "max_ids_per_request": self.max_ids_per_request,
            "max_records": self.max_records,
            "max_processes": self.max_processes,
            "max_message_bytes_in_flight": self.max_message_bytes_in_flight,
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
    # Where `execute` commands are held when they must outlive the agent (PROTOCOL.md 10.1,
    # `toolwire serve` with a state dir): the keeper; None: the agent holds them (`backend`).
    keeper: KeptProcessBackend | None = None
    # `--on-shutdown keep`: a graceful shutdown leaves every command running for the next
    # agent to re-adopt, instead of stopping them (10.1).
    keep_on_shutdown: bool = False
    wall_ms: Callable[[], int] = wall_clock_ms
    # What every command's environment starts from: the agent's, without its secrets
    # (actors/command_env.py). `toolwire serve` also leaves out whatever holds its token.
    base_env: dict[str, str] = field(default_factory=lambda: command_environment(os.environ))
    # Where records survive restarts. MemoryJournal keeps nothing (tests, simulations, benches).
    journal: Journal = field(default_factory=MemoryJournal)
    # With a journal that keeps results, the recent results kept on the heap besides it (the
    # agent's whole LRU, see actors/result_cache.py); older ones are read back when needed.
    result_cache_entries: int = DEFAULT_MAX_ENTRIES
    result_cache_bytes: int = DEFAULT_MAX_BYTES
    # The operator's counters (`/metrics`); None counts nothing (the benchmark's baseline).
    metrics: CallCounters | None = field(default_factory=lambda: CallCounters(TOOL_NAMES))
    # The floor of every call's sandbox (`toolwire serve --sandbox/--sandbox-network`), and what
    # the kernel can enforce (PROTOCOL.md 10.4; a lower Landlock ABI shows an older kernel).
    sandbox_floor: SandboxPolicy = FULL
    sandbox: Enforcement = field(default_factory=Enforcement.probe)
    # The agent's own files (its state dir, its token file), which no tool reads or writes and
    # no command under a filesystem sandbox reaches (actors/hidden_paths.py).
    hidden: HiddenPaths = field(default_factory=HiddenPaths)
    # What every chat holds together, against the agent-wide limits (actors/budget.py).
    budget: AgentBudget = field(init=False)

    def __post_init__(self) -> None:
        self.budget = AgentBudget(
            max_records=self.limits.max_records, max_processes=self.limits.max_processes
        )
        for name in ("approval_timeout_s", "kill_grace_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")

    def effective_sandbox(self, asked: SandboxPolicy | None) -> SandboxPolicy:
        """A call's sandbox as it runs: the stricter of the floor and its own, on each point."""
        return self.sandbox_floor if asked is None else self.sandbox_floor.meet(asked)

    def admit_sandbox(self, tool: str, asked: SandboxPolicy | None) -> None:
        """Refuse (`sandbox_unsupported`) a command whose sandbox this kernel cannot enforce,
        before anything runs. File tools are checked by the agent itself, on any kernel."""
        if tool == "execute":
            self.sandbox.check(self.effective_sandbox(asked))

    def chat_config(self) -> ChatConfig:
        """The policy and limits a chat's state machine decides by (no clocks, no I/O)."""
        return ChatConfig(
            max_processes_per_chat=self.limits.max_processes_per_chat,
            forget_after_s=self.limits.forget_after_s,
            kill_grace_s=self.kill_grace_s,
            approve_tools=self.approve_tools,
            approval_timeout_s=self.approval_timeout_s,
            journal_enabled=self.journal.enabled,
            journal_keeps_results=self.journal.keeps_results,
            max_ids_per_request=self.limits.max_ids_per_request,
            exited_retention_s=self.limits.exited_retention_s,
        )
