"""transport/frames.py: the server's data frames, read back by wsproto's own frame parser (the
client side, which insists that a server's frames are unmasked)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from wsproto.frame_protocol import FrameProtocol, Opcode

from toolwire.transport import frames

# Around each boundary of the length encoding: 7 bits, 16 bits, 64 bits.
_lengths = st.sampled_from([0, 1, 125, 126, 127, 65535, 65536, 70000]) | st.integers(0, 300)


def _parse(data: bytes) -> list[tuple[Opcode, bytes | str]]:
    parser = FrameProtocol(client=True, extensions=[])
    parser.receive_bytes(data)
    got: list[tuple[Opcode, bytes | str]] = []
    for frame in parser.received_frames():
        assert frame.frame_finished and frame.message_finished
        assert isinstance(frame.payload, bytes | str)
        got.append((frame.opcode, frame.payload))
    return got


@given(st.lists(_lengths.map(lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256))))
def test_binary_frames_read_back_as_sent(payloads: list[bytes]) -> None:
    assert _parse(b"".join(frames.frame_parts(frames.BINARY, payloads))) == [
        (Opcode.BINARY, payload) for payload in payloads
    ]


@given(st.lists(st.text(max_size=200) | _lengths.map(lambda n: "é" * (n // 2) + "x" * (n % 2))))
def test_text_frames_read_back_as_sent(texts: list[str]) -> None:
    payloads = [text.encode() for text in texts]
    assert _parse(b"".join(frames.frame_parts(frames.TEXT, payloads))) == [
        (Opcode.TEXT, text) for text in texts
    ]


def test_the_header_uses_the_shortest_length_encoding() -> None:
    assert len(frames.frame_header(frames.TEXT, 125)) == 2
    assert len(frames.frame_header(frames.TEXT, 126)) == 4
    assert len(frames.frame_header(frames.TEXT, 65535)) == 4
    assert len(frames.frame_header(frames.TEXT, 65536)) == 10
