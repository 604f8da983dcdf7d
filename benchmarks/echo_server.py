"""The transport's limit: a raw trio-websocket echo server
(`python -m toolwire.benchmarks.echo_server`).

Every message comes back as it came. It reads with the same receive buffer as toolwire's
server, and keeps the 64-message queue toolwire's server had before its reader started handing
messages to the session directly (`transport/connection.py`), so the only differences the
benchmark sees are toolwire's own work: decoding, the actors, encoding, and its write coalescing.
"""

from __future__ import annotations

import signal
import sys

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from toolwire.transport.server import RECEIVE_BUFFER_BYTES

# trio-websocket's queue between its reader and `get_message`: > 1, so a reader waiting for the
# echo to be taken still answers pings.
MESSAGE_QUEUE_SIZE = 64


async def echo(request: WebSocketRequest) -> None:
    ws = await request.accept()
    try:
        while True:
            await ws.send_message(await ws.get_message())
    except ConnectionClosed:
        pass


async def main() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_websocket(
                echo,
                "127.0.0.1",
                0,
                None,
                message_queue_size=MESSAGE_QUEUE_SIZE,
                receive_buffer_size=RECEIVE_BUFFER_BYTES,
                task_status=task_status,
            )
        )
        print(f"PORT {server.port}", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
    sys.exit(0)
