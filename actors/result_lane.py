"""The ordered delivery of a chat's saved results.

A request owed finished results (a repeat `call`, an `attach`, a `cancel_result`, a
`turn_result`, `interrupted`) gets them at once when they are on the heap and nothing of its
chat waits before it; otherwise it queues in the chat's `ResultLane`, which reads the missing
results back from the journal in batches and sends every delivery in request order. So a
turn_result never overtakes a call's result, nor `interrupted` a turn_result.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from toolwire.actors.journal import JournalError
from toolwire.actors.records import ToolCallRecord
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.results import Result

if TYPE_CHECKING:
    from toolwire.actors.agent import AgentContext

# Sends the results a request is owed, in the order of its records, once they are at hand.
Send = Callable[[list[Result]], None]


def saved_result(results: ResultCache, chat_id: str, record: ToolCallRecord) -> Result | None:
    """A published record's result if it is on the heap; None if it must be read back."""
    if record.result is not None:
        return record.result
    return results.get((chat_id, record.call_id))


class ResultLane:
    """The deliveries of one chat still waiting for results read back from the journal.

    It lives only while something waits (the chat holds none while idle); the records of a
    waiting delivery are pinned by the chat until this lane sends it."""

    __slots__ = ("_chat_id", "_ctx", "_results", "deliveries")

    def __init__(self, chat_id: str, ctx: AgentContext, results: ResultCache) -> None:
        self._chat_id = chat_id
        self._ctx = ctx
        self._results = results
        self.deliveries: deque[tuple[list[ToolCallRecord], Send]] = deque()

    async def run(self) -> None:
        """Send the waiting deliveries in order, reading their results back in batches."""
        lane = self.deliveries
        while lane:
            batch = list(lane)
            # What is on the heap now is taken now (the cache may evict it while we wait),
            # the rest comes in one journal read for every delivery waiting (a turn, a
            # burst of retries). A saved result never changes, so either is the same.
            held: dict[str, Result] = {}
            wanted: dict[str, ToolCallRecord] = {}
            for records, _ in batch:
                for record in records:
                    result = saved_result(self._results, self._chat_id, record)
                    if result is None:
                        wanted[record.call_id] = record
                    else:
                        held[record.call_id] = result
            held.update(await self._read_results(list(wanted.values())))
            for records, send in batch:
                lane.popleft()
                for record in records:
                    record.unpin()
                send([held[record.call_id] for record in records])

    async def _read_results(self, records: list[ToolCallRecord]) -> dict[str, Result]:
        """Read released results back from the journal (and keep them among the recent)."""
        if not records:
            return {}
        keys = [(self._chat_id, record.call_id) for record in records]
        found = await self._ctx.journal.read_results(keys)
        loaded: dict[str, Result] = {}
        for key, result in zip(keys, found, strict=True):
            if result is None:
                # A pinned record is never forgotten, so its row cannot be gone: the journal
                # lost a durable result. Stop rather than answer anything else.
                raise JournalError(f"the journal has no saved result for {key[0]!r}/{key[1]!r}")
            self._results.put(key, result)
            loaded[key[1]] = result
        return loaded
