"""The best WebSocket echo this machine does in Python over one connection
(`python -m toolwire.benchmarks.wsproto_echo_server`).

The stock trio-websocket echo (`echo_server.py`) pays for trio-websocket's reader task, its
message queue and a send lock per message: toolwire's server avoids all three, so beating that
echo says little about "close to the limit". This echo does what toolwire's transport does and
nothing else: wsproto parses what one socket read brought, every complete message read in it is
echoed in one go (`transport/frames.py` headers beside the payloads, one `writev`), through the
same write-coalescing stream (`transport/buffered.py`) and with the same receive size.
"""

from __future__ import annotations

import signal
import sys
from functools import partial

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Request,
    TextMessage,
)

from toolwire.transport.buffered import WriteBufferedStream
from toolwire.transport.frames import BINARY, TEXT, frame_parts
from toolwire.transport.server import RECEIVE_BUFFER_BYTES


async def echo_connection(stream: trio.SocketStream) -> None:
    buffered = WriteBufferedStream(stream)
    ws = WSConnection(ConnectionType.SERVER)
    parts: dict[bool, list[bytes]] = {True: [], False: []}  # is text -> fragments so far
    async with trio.open_nursery() as nursery:
        nursery.start_soon(buffered.flusher)
        try:
            while True:
                data = await buffered.receive_some(RECEIVE_BUFFER_BYTES)
                if not data:
                    break
                ws.receive_data(data)
                texts: list[bytes] = []
                blobs: list[bytes] = []
                closing = False
                for event in ws.events():
                    if isinstance(event, Request):
                        await buffered.send_all(ws.send(AcceptConnection()))
                    elif isinstance(event, TextMessage):
                        parts[True].append(event.data.encode())
                        if event.message_finished:
                            texts.append(b"".join(parts[True]))
                            parts[True].clear()
                    elif isinstance(event, BytesMessage):
                        parts[False].append(bytes(event.data))
                        if event.message_finished:
                            blobs.append(b"".join(parts[False]))
                            parts[False].clear()
                    elif isinstance(event, Ping):
                        await buffered.send_all(ws.send(event.response()))
                    elif isinstance(event, CloseConnection):
                        await buffered.send_all(ws.send(event.response()))
                        closing = True
                # Everything this read brought goes back in one write, as toolwire's sender
                # batches the replies to a burst of requests.
                out = frame_parts(TEXT, texts) + frame_parts(BINARY, blobs)
                if out:
                    await buffered.send_parts(out)
                if closing:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.move_on_after(1):
                await buffered.aclose()
            nursery.cancel_scope.cancel()


async def main() -> None:
    async with trio.open_nursery() as nursery:
        serve = partial(trio.serve_tcp, echo_connection, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        print(f"PORT {listeners[0].socket.getsockname()[1]}", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
    sys.exit(0)
