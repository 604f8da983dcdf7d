"""The server's own WebSocket framing (transport/frames.py), read back by wsproto as a client."""

from __future__ import annotations

import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, Message, TextMessage

from transport.frames import frame_parts

SIZES = [0, 1, 125, 126, 127, 65_535, 65_536, 65_537, 300_000]


def read_back(data: bytes) -> list[str | bytes]:
    """What a client makes of `data`: whole messages, in order."""
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(data)
    messages: list[str | bytes] = []
    parts: list[str | bytes] = []
    for event in client.events():
        assert isinstance(event, Message), event
        parts.append(event.data)
        if event.message_finished:
            if isinstance(event, TextMessage):
                messages.append("".join(str(p) for p in parts))
            else:
                assert isinstance(event, BytesMessage)
                messages.append(b"".join(bytes(p) for p in parts))  # type: ignore[arg-type]
            parts = []
    assert not parts
    return messages


@pytest.mark.parametrize("size", SIZES)
def test_text_and_binary_messages_of_every_length_class(size: int) -> None:
    text = ("é" * size)[: max(size // 2, 0)] + "x" * (size - size // 2)
    binary = bytes(i % 251 for i in range(size))
    payloads: list[str | bytes] = [text, binary]
    assert read_back(b"".join(frame_parts(payloads))) == payloads


def test_a_batch_is_one_message_per_payload_in_order() -> None:
    payloads: list[str | bytes] = [b"a" * n if n % 2 else "b" * n for n in SIZES]
    assert read_back(b"".join(frame_parts(payloads))) == payloads
