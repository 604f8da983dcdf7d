"""The agent-wide bound on bytes of messages being received at once (issue 27, defect 5).

One message may be 16 MiB (`max_message_bytes`), but nothing bounded how many arrive at once:
20 concurrent 16 MiB messages took the agent to 861 MiB. Each connection's reader charges the
parts of a message it is assembling here, as they arrive, and the charge is released once the
message has been decoded and applied (or dropped). A reader whose part would go past
`max_message_bytes_in_flight` waits before it reads on: its socket is not read, so TCP pushes
back on that client while the others go on. Back-pressure rather than a refusal: the message is
valid, and a client that sent it cannot be told before it is whole.

No deadlock, whatever the mix: the message that began first (the oldest holder) always goes on,
and every other holder may only take bytes while the others together leave room for one whole
message beside them. So the oldest can always finish, its release lets the next one finish, and
the total never exceeds the limit. A message that arrives whole in one read is applied at once
and never waits (it holds no more than one socket read, and waiting would not free it).
"""

from __future__ import annotations

import trio


class MessageBytes:
    """Bytes of partly received messages, per connection, against one limit."""

    def __init__(self, limit: int, max_message_bytes: int) -> None:
        if limit < max_message_bytes:
            raise ValueError(
                f"max_message_bytes_in_flight ({limit}) must hold one message of "
                f"max_message_bytes ({max_message_bytes})"
            )
        self.limit = limit
        self.max_message_bytes = max_message_bytes
        self.held = 0
        # By holder, in the order their messages began (dicts keep insertion order).
        self._holders: dict[object, int] = {}
        self._released = trio.Event()
        self.waits = 0  # how many times a reader had to wait (for /metrics)

    def _may_take(self, holder: object, size: int) -> bool:
        holders = self._holders
        if not holders or next(iter(holders)) is holder:
            return True  # the oldest message always goes on
        oldest = holders[next(iter(holders))]
        others = self.held - oldest
        return others + size + self.max_message_bytes <= self.limit

    async def take(self, holder: object, size: int) -> None:
        """Charge `size` more bytes to `holder`'s message, once they fit."""
        if not self._may_take(holder, size):
            self.waits += 1
            while not self._may_take(holder, size):
                await self._released.wait()
        self._holders[holder] = self._holders.get(holder, 0) + size
        self.held += size

    def release(self, holder: object) -> None:
        """`holder`'s message was applied or dropped: its bytes are free."""
        size = self._holders.pop(holder, None)
        if size is None:
            return
        self.held -= size
        self._released.set()
        self._released = trio.Event()
