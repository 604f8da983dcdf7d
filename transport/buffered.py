"""A stream whose writes never block: they go to a buffer that one flusher task drains.

Why: trio-websocket serialises every frame through one send lock, and its reader answers a ping
by taking that lock. When both peers send bulk data and ping each other, each side's sender holds
the lock while blocked on a full socket, each side's reader waits for the lock to send its pong,
so neither side reads, and both stall forever (trio-websocket 0.12.2; the asyncio `websockets`
client pings every 20 s by default). Under this wrapper `send_all` only appends, so the lock is
never held across a blocking socket write and our reader always keeps reading. Backpressure moves
up to the one place that produces bulk data: the connection's sender awaits `wait_writable()`
before it takes more events.

A bonus: every frame queued while a write is in flight leaves in the next single `send` syscall.
Per-message syscalls, not the codec, dominate the cost of small messages, so this coalescing is
what lets many small messages per second through one connection.

On a plain TCP stream, a write that finds nothing queued before it goes to the socket at once,
without blocking (what the socket cannot take now is queued for the flusher). Handing every write
to the flusher cost two task switches per write (its wake-up, and the checkpoint trio's
`send_all` makes after a send): at one request in flight, about a fifth of the scheduler rounds
of an `execute` call (issue 6).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import trio

# Buffers per writev: far below any system's IOV_MAX (1024 on Linux); more are joined first.
_MAX_PARTS = 512


class WriteBufferedStream(trio.abc.Stream):
    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self._buffer = bytearray()
        self._in_flight = 0  # bytes of the write under way (taken out of the buffer)
        self._flushing = False
        self._data_ready = trio.Event()
        self._space = trio.Event()
        self._closed = False
        self._broken: BaseException | None = None
        # Only a plain socket can be written directly: TLS must go through its record layer.
        self._socket = inner.socket if isinstance(inner, trio.SocketStream) else None

    @property
    def buffered_bytes(self) -> int:
        """Bytes not yet handed to the kernel: queued, plus the write under way."""
        return len(self._buffer) + self._in_flight

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.send_parts([data])

    async def send_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """`send_all(b"".join(parts))` without the join: parts that go straight to the socket
        are never copied (one `writev`); only what waits for the flusher is."""
        if self._broken is not None:
            raise trio.BrokenResourceError("the connection is broken") from self._broken
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        if not self._flushing:
            # Before the flusher runs (the handshake), write straight through.
            await self.inner.send_all(b"".join(parts))
            return
        await trio.lowlevel.checkpoint_if_cancelled()
        if len(parts) > _MAX_PARTS:
            parts = [b"".join(parts)]
        sent = 0
        if not self._buffer and not self._in_flight:
            sent = self._write_now(parts)
        for part in parts:
            if sent >= len(part):
                sent -= len(part)
                continue
            self._buffer += memoryview(part)[sent:] if sent else part
            sent = 0
        if self._buffer:
            self._data_ready.set()

    def _write_now(self, parts: Sequence[bytes | bytearray | memoryview]) -> int:
        """Write what the socket takes right now without blocking (one `writev`); the bytes
        written. 0 when it is full, not a plain socket, or failing: the flusher then meets the
        error and reports the stream broken, as before."""
        if self._socket is None:
            return 0
        # Asked each time, never kept: once closed it is -1, so a number reused by another file
        # can never be written to.
        fd = self._socket.fileno()
        if fd < 0:
            return 0
        try:
            return os.writev(fd, parts)
        except OSError:
            return 0

    async def wait_send_all_might_not_block(self) -> None:
        await self.wait_writable(0)

    async def wait_writable(self, limit: int) -> None:
        """Wait until at most `limit` bytes are buffered (raises once the stream broke)."""
        while self.buffered_bytes > limit:
            if self._broken is not None:
                raise trio.BrokenResourceError("the connection is broken") from self._broken
            if self._closed and not self._flushing:
                raise trio.ClosedResourceError("the stream is closed")
            await self._space.wait()
        if self._broken is not None:
            raise trio.BrokenResourceError("the connection is broken") from self._broken

    async def flusher(self) -> None:
        """Drain the buffer into the inner stream until closed. Run it in the connection's
        nursery; it ends (without raising) when the stream closes or breaks."""
        self._flushing = True
        try:
            while True:
                if not self._buffer:
                    if self._closed:
                        return
                    await self._data_ready.wait()
                    self._data_ready = trio.Event()
                    continue
                # Take the whole buffer as it is (no copy) and start a new one for the frames
                # queued while it is written.
                chunk, self._buffer = self._buffer, bytearray()
                self._in_flight = len(chunk)
                await self.inner.send_all(chunk)
                self._in_flight = 0
                self._space.set()
                self._space = trio.Event()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._broken = exc
            self._buffer.clear()
        finally:
            self._flushing = False
            self._space.set()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        """Flush what is buffered (a close frame, usually), then close the inner stream."""
        self._closed = True
        self._data_ready.set()
        try:
            # Until everything, the write under way included, reached the kernel: closing the
            # inner stream under the last write would cut the close frame in half.
            while self.buffered_bytes and self._flushing and self._broken is None:
                await self._space.wait()
        finally:
            if self._broken is not None:
                await trio.aclose_forcefully(self.inner)
            else:
                await self.inner.aclose()
