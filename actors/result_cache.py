"""The most recently saved or read results, kept on the heap (pure: no trio, no I/O).

With a journal that keeps results (`Journal.keeps_results`), a finished record drops its result
once the journal holds it, and a repeat, attach, cancel or turn reads it back from the journal.
Most repeats come right after the first request (a retried request, a reconnect, a second
replica), so this cache keeps the newest results of the whole agent and answers them without
the journal. It is bounded twice: by entries, and by the approximate bytes the results hold, so
a few large outputs cannot pin much memory and many small ones cannot pin many objects.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from toolwire.actors.results import Result

# A result's bookkeeping beyond its strings (the Struct, its ints, the cache slot): an estimate,
# so the byte bound means what it says for small results too.
RESULT_OVERHEAD_BYTES = 256
# Each value inside `data` (a dict slot, a list slot, a small int or a short string's header).
VALUE_OVERHEAD_BYTES = 56

# 1,024 recent results answer the retries of the last ~1,000 calls across all chats; 8 MiB bounds
# what they hold when they carry long outputs (a Result's output alone may reach 64 KiB).
DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 8 * 1024 * 1024

Key = tuple[str, str]  # (chat_id, call_id)


def _data_size(value: Any) -> int:
    if isinstance(value, str):
        return VALUE_OVERHEAD_BYTES + len(value)
    if isinstance(value, dict):
        return VALUE_OVERHEAD_BYTES + sum(_data_size(k) + _data_size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return VALUE_OVERHEAD_BYTES + sum(_data_size(v) for v in value)
    if isinstance(value, bytes):
        return VALUE_OVERHEAD_BYTES + len(value)
    return VALUE_OVERHEAD_BYTES


def result_size(result: Result) -> int:
    """About how many bytes of heap a result holds (its text, output and data)."""
    size = RESULT_OVERHEAD_BYTES + len(result.text) + len(result.output)
    if result.data is not None:
        size += _data_size(result.data)
    return size


class ResultCache:
    """An LRU of results by `(chat_id, call_id)`, bounded by entries and by bytes."""

    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("the result cache's bounds must be >= 0")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Key, tuple[Result, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def get(self, key: Key) -> Result | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Key, result: Result) -> None:
        """Keep `result` as the newest entry, evicting the oldest beyond either bound. A result
        larger than the whole byte bound is not kept (it would evict everything else)."""
        self.discard(key)
        size = result_size(result)
        if size > self.max_bytes or self.max_entries == 0:
            return
        self._entries[key] = (result, size)
        self.bytes += size
        entries = self._entries
        while len(entries) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, evicted) = entries.popitem(last=False)
            self.bytes -= evicted

    def discard(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[1]
