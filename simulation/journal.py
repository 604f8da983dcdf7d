"""A journal in memory and virtual time that survives simulated crashes.

`SimJournal` behaves like `actors.journal.SqliteJournal` as far as the chat actors can tell:
writes are queued synchronously, one writer task commits everything queued meanwhile after a
small virtual-time delay (group commit), and `wait_durable` returns (and `when_durable`'s
callbacks run, all those a commit covers in one go) once a change is committed.
Committed rows live in a plain dict that outlives the agent; `crash()` throws away whatever was
queued or in the middle of a commit, exactly what a `kill -9` loses. Like the SQLite journal it
keeps results: `read_results` answers from the committed rows after a small virtual-time delay
(drawn from a stream of its own, so runs that never read keep their traces).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import msgspec
import trio

from toolwire.actors.journal import CommitWaiters, Journal, JournalRow
from toolwire.actors.results import Result


class SimJournal(Journal):
    enabled = True
    keeps_results = True

    def __init__(
        self,
        rng: random.Random,
        delay_s: tuple[float, float] = (0.0005, 0.004),
        read_rng: random.Random | None = None,
        read_delay_s: tuple[float, float] = (0.0, 0.002),
    ):
        self._rng = rng
        self._delay_s = delay_s
        self._read_rng = read_rng if read_rng is not None else random.Random(0)
        self._read_delay_s = read_delay_s
        self.reads = 0  # results read back (the chat actors had released them)
        # The "disk": committed rows, in first-commit order (a dict keeps it: no hash order).
        self.rows: dict[tuple[str, str], JournalRow] = {}
        # The "disk" of `approve` with scope "chat": (chat_id, tool) pairs, in commit order.
        self.approvals: dict[tuple[str, str], None] = {}
        # The "disk" of `close_chat` (9.6): closed chats' ids, in commit order.
        self.closed: dict[str, None] = {}
        self._ops: list[tuple[int, str, JournalRow | tuple[str, str, int]]] = []
        self._queued_seq = 0
        self._durable_seq = 0
        self._committed = trio.Event()
        self._waiters = CommitWaiters()
        self._wakeup = trio.Event()
        self.lost_writes = 0
        # A crash fences the journal until the next agent's writer starts: a task of the dead
        # agent that was already scheduled when it died may still run up to its next
        # checkpoint, but a dead process writes nothing, so its writes are dropped.
        self._epoch = 0
        self._fenced = False
        self._counted_seq = 0  # writes up to here were already counted as lost

    def _queue(self, op: str, payload: JournalRow | tuple[str, str, int]) -> int:
        self._queued_seq += 1
        if self._fenced:
            # Counted as lost here, once: the next agent's stop must not count it again (it
            # was never that agent's write).
            self.lost_writes += 1
            self._counted_seq = self._queued_seq
            return self._queued_seq
        self._ops.append((self._queued_seq, op, payload))
        self._wakeup.set()
        return self._queued_seq

    def write(self, row: JournalRow) -> int:
        return self._queue("put", row)

    def touch(self, chat_id: str, call_id: str, wall_ms: int) -> None:
        self._queue("touch", (chat_id, call_id, wall_ms))

    def delete(self, chat_id: str, call_id: str) -> None:
        self._queue("delete", (chat_id, call_id, 0))

    def approve_tool(self, chat_id: str, tool: str) -> int:
        return self._queue("approve_tool", (chat_id, tool, 0))

    def forget_approvals(self, chat_id: str) -> None:
        self._queue("forget_approvals", (chat_id, "", 0))

    def load_approvals(self) -> list[tuple[str, str]]:
        return list(self.approvals)

    def mark_closed(self, chat_id: str, closed_at_ms: int) -> int:
        return self._queue("mark_closed", (chat_id, "", closed_at_ms))

    def forget_closed(self, chat_id: str) -> None:
        self._queue("forget_closed", (chat_id, "", 0))

    def load_closed(self) -> list[str]:
        return list(self.closed)

    @property
    def queued_seq(self) -> int:
        return self._queued_seq

    def is_durable(self, seq: int) -> bool:
        return seq <= self._durable_seq

    async def wait_durable(self, seq: int) -> None:
        while seq > self._durable_seq:
            await self._committed.wait()
        await trio.lowlevel.checkpoint()

    def when_durable(self, seq: int, fn: Callable[[], None]) -> None:
        if seq <= self._durable_seq:
            fn()
        elif not self._fenced:  # a dead agent's callback never runs
            self._waiters.add(seq, fn)

    def load(self) -> list[JournalRow]:
        return [msgspec.structs.replace(row) for row in self.rows.values()]

    async def read_results(self, keys: Sequence[tuple[str, str]]) -> list[Result | None]:
        # The reader thread's hop: other tasks run meanwhile; then what is committed by now.
        await trio.sleep(self._read_rng.uniform(*self._read_delay_s))
        self.reads += len(keys)
        found: list[Result | None] = []
        for key in keys:
            row = self.rows.get(key)
            found.append(None if row is None else row.result)
        return found

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        epoch = self._epoch
        self._fenced = False
        task_status.started()
        while True:
            if not self._ops:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                continue
            batch = self._ops
            self._ops = []
            # The commit takes a little time; a crash meanwhile loses the whole batch.
            await trio.sleep(self._rng.uniform(*self._delay_s))
            if epoch != self._epoch:
                return  # this writer's agent died while the batch was on its way to disk
            for _, op, payload in batch:
                self._apply(op, payload)
            self._durable_seq = batch[-1][0]
            self._committed.set()
            self._committed = trio.Event()
            self._waiters.release(self._durable_seq)

    def _apply(self, op: str, payload: JournalRow | tuple[str, str, int]) -> None:
        if isinstance(payload, JournalRow):
            self.rows[(payload.chat_id, payload.call_id)] = payload
            return
        chat_id, call_id, wall_ms = payload
        if op == "approve_tool":
            self.approvals[(chat_id, call_id)] = None  # call_id holds the tool's name
        elif op == "mark_closed":
            self.closed.setdefault(chat_id)
        elif op == "forget_closed":
            self.closed.pop(chat_id, None)
        elif op == "forget_approvals":
            for key in [key for key in self.approvals if key[0] == chat_id]:
                del self.approvals[key]
        elif op == "touch":
            row = self.rows.get((chat_id, call_id))
            if row is not None:
                row.touched_at_ms = wall_ms
        else:
            self.rows.pop((chat_id, call_id), None)

    def crash(self) -> int:
        """The agent died: what was not committed is gone. Returns how many writes were lost."""
        lost = self._queued_seq - max(self._durable_seq, self._counted_seq)
        self._counted_seq = self._queued_seq
        self.lost_writes += lost
        self._epoch += 1
        self._fenced = True
        self._ops = []
        # The lost sequence numbers never become durable for the dead agent: a task of it that
        # still runs up to its next checkpoint must find its start NOT durable (or it would
        # act after its death). The next agent's writes get higher numbers.
        self._committed = trio.Event()
        self._waiters.clear()
        self._wakeup = trio.Event()
        return lost
