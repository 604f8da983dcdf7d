"""Big messages (a `write_file` of several MiB) are made ready off the event loop
(`transport/big_messages.py`): the args fingerprint on a worker thread, in pieces, and the
bounds pre-scan in pieces. The pieces give exactly the answers of the whole computations, and
at most once holds through a real server: a repeat with the same args gets the saved result,
one with other args is refused."""

from __future__ import annotations

import gc
import re
import sys
import threading
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import LiveServer
from toolwire.actors import calls, records
from toolwire.actors.records import args_fingerprint, args_fingerprint_in_pieces
from toolwire.transport import big_messages, bounds
from toolwire.transport.big_messages import BIG_MESSAGE_BYTES

# JSON-like args as a decoder gives them, with strings and bytes long enough to be cut into
# pieces of a few characters, and strings that spell (part of) the placeholder.
_texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["\x00toolwire.piece.0.\x00", '"\\\x00toolwire.piece.1.\x00"', 'é💥\n\t"\\']),
)
_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
    _texts, st.binary(max_size=40),
)  # fmt: skip
_args = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(_texts, inner, max_size=4)
    ),
    max_leaves=12,
)


@given(tool=st.text(max_size=10), args=_args, piece=st.sampled_from([3, 6, 9, 30]))
def test_the_fingerprint_in_pieces_is_the_fingerprint(tool: str, args: Any, piece: int) -> None:
    assert args_fingerprint_in_pieces(tool, args, piece) == args_fingerprint(tool, args)


def test_the_fingerprint_in_pieces_of_a_big_write_is_the_fingerprint() -> None:
    content = ("line of a big file é\n" * 100_000) + "\x00tail"
    args = {"path": "big.txt", "content": content, "raw": bytes(range(256)) * 5000}
    assert args_fingerprint_in_pieces("write_file", args) == args_fingerprint("write_file", args)
    other = args | {"content": content[:-1] + "L"}
    assert args_fingerprint_in_pieces("write_file", other) != args_fingerprint("write_file", args)


def test_the_fingerprint_in_pieces_keeps_no_reference_to_the_content() -> None:
    # The content of a 16 MiB write must be freed when its call is done, not when the cyclic
    # garbage collector next runs: a reference cycle here kept 15 of them alive (240 MB) and
    # made every new message's decode pay for fresh pages on the loop.
    content = "x" * (3 * 1024 * 1024)
    args = {"path": "big.txt", "content": content, "more": [content]}
    held = sys.getrefcount(content)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        args_fingerprint_in_pieces("write_file", args)
        assert sys.getrefcount(content) == held
    finally:
        if was_enabled:
            gc.enable()


_frame_text = st.text(alphabet=st.sampled_from('0123456789{[]}"x é\n'), max_size=300)


@given(frame=st.one_of(_frame_text, st.binary(max_size=300)), piece=st.integers(1, 40))
def test_the_bounds_scan_in_pieces_is_the_whole_scan(frame: str | bytes, piece: int) -> None:
    answers = list(bounds.may_exceed_bounds_in_pieces(frame, piece))
    assert answers[-1] == bounds.may_exceed_bounds(frame)
    assert all(a is None for a in answers[:-1])


@given(text=_frame_text)
def test_a_text_frame_may_exceed_the_bounds_exactly_when_deep_or_a_long_digit_run(
    text: str,
) -> None:
    # The fast digit-run scan answers as the regular expression does (and so does the scan
    # in pieces, above).
    deep = text.count("{") + text.count("[") > bounds.MAX_NESTING_DEPTH
    long_digits = re.search("[0-9]{19}", text) is not None
    assert bounds.may_exceed_bounds(text) == (deep or long_digits)


def _write(call_id: str, content: str) -> dict[str, Any]:
    return {
        "type": "call",
        "chat_id": "big",
        "call_id": call_id,
        "tool": "write_file",
        "args": {"path": "big.txt", "content": content},
        "stream": False,
    }


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_a_big_call_is_fingerprinted_off_the_loop_and_runs_at_most_once(
    live: LiveServer, encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The args of a big call are fingerprinted on a worker thread, never on the event loop's
    (before: `ChatState` fingerprinted them on the loop, 20-30 ms for 16 MiB); the answer is
    the chat's own: the same args again get the saved result, other args a conflict."""
    loop_thread = threading.current_thread()
    threads: list[tuple[bool, int]] = []  # (on the loop's thread, size of the content)

    def watched(real: Any) -> Any:
        def fingerprint(tool: str, args: Any, *rest: Any) -> bytes:
            size = len(args.get("content", "")) if isinstance(args, dict) else 0
            threads.append((threading.current_thread() is loop_thread, size))
            result: bytes = real(tool, args, *rest)
            return result

        return fingerprint

    monkeypatch.setattr(calls, "args_fingerprint", watched(records.args_fingerprint))
    monkeypatch.setattr(
        big_messages, "args_fingerprint_in_pieces", watched(records.args_fingerprint_in_pieces)
    )
    content = "x" * 99 + "\n"
    content = content * (BIG_MESSAGE_BYTES // len(content) + 1000)
    async with live.connect(encoding=encoding) as conn:
        await conn.send(_write("w1", content))
        first = await conn.recv_until(lambda m: m["type"] in ("result", "error"))
        assert first[-1]["type"] == "result" and first[-1]["outcome"] == "completed", first[-1]
        assert (live.workspace / "big.txt").read_text() == content
        assert [on_loop for on_loop, size in threads if size >= len(content)] == [False]

        (live.workspace / "big.txt").write_text("changed since")
        await conn.send(_write("w1", content))  # a retry: the saved result, not a second write
        again = await conn.recv_until(lambda m: m["type"] in ("result", "error"))
        assert again[-1]["type"] == "result" and again[-1]["data"] == first[-1]["data"]
        assert (live.workspace / "big.txt").read_text() == "changed since"

        await conn.send(_write("w1", content[:-1] + "y"))  # other args, same id: refused
        refused = await conn.recv_until(lambda m: m["type"] in ("result", "error"))
        assert refused[-1]["type"] == "error" and refused[-1]["code"] == "conflict", refused[-1]
        small = await conn.call("big", "w1", "write_file", {"path": "big.txt", "content": "s"})
        assert small["type"] == "error" and small["code"] == "conflict"
        assert (live.workspace / "big.txt").read_text() == "changed since"
    assert not any(on_loop for on_loop, size in threads if size >= len(content))


async def test_a_big_turn_is_fingerprinted_off_the_loop_and_repeats_match(live: LiveServer) -> None:
    content = "y" * (BIG_MESSAGE_BYTES + 10)
    turn = {
        "type": "turn",
        "chat_id": "bigturn",
        "turn_id": "t1",
        "stream": False,
        "calls": [
            {"call_id": "a", "tool": "write_file", "args": {"path": "a.txt", "content": content}},
            {"call_id": "b", "tool": "read_file", "args": {"path": "a.txt"}},
        ],
    }
    async with live.connect(encoding="msgpack") as conn:
        await conn.send(turn)
        first = await conn.recv_until(lambda m: m["type"] in ("error", "turn_result"))
        assert first[-1]["type"] == "turn_result", first[-1]
        start = len(conn.seen)
        await conn.send(turn)  # the same turn: its calls' saved results
        again = await conn.recv_until(lambda m: m["type"] in ("error", "turn_result"))
        assert again[-1]["type"] == "turn_result", again[-1]
        assert again[-1]["results"] == first[-1]["results"]
        changed = msgspec.json.decode(msgspec.json.encode(turn))
        changed["calls"][0]["args"]["content"] = content[:-1] + "z"
        await conn.send(changed)
        refused = await conn.recv_until(lambda m: m["type"] == "error")
        assert refused[-1]["code"] == "conflict", refused[-1]
        assert all(m["type"] != "error" for m in conn.seen[start : len(conn.seen) - 1])
    assert (live.workspace / "a.txt").read_text() == content


async def test_big_messages_of_many_connections_are_made_ready_one_at_a_time(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two chat servers each send a big call at once: their fingerprints are computed on a
    worker thread one after the other, never side by side (`ONE_BIG_MESSAGE`), as threads
    that hold the GIL in turns with the loop would otherwise leave it one turn in as many;
    both calls still complete. Two fingerprints that did run at once would meet at the
    barrier; one at a time, the first waits out the barrier's timeout alone."""
    barrier = threading.Barrier(2, timeout=2.0)
    met: list[bool] = []
    real = records.args_fingerprint_in_pieces

    def fingerprint(tool: str, args: Any, *rest: Any) -> bytes:
        try:
            barrier.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
        result: bytes = real(tool, args, *rest)
        return result

    monkeypatch.setattr(big_messages, "args_fingerprint_in_pieces", fingerprint)
    content = "z" * (BIG_MESSAGE_BYTES + 10)
    async with live.connect(encoding="msgpack") as one, live.connect(encoding="msgpack") as two:
        first = _write("w1", content) | {
            "chat_id": "one",
            "args": {"path": "one.txt", "content": content},
        }
        second = _write("w2", content) | {
            "chat_id": "two",
            "args": {"path": "two.txt", "content": content},
        }
        await one.send(first)
        await two.send(second)
        for conn in (one, two):
            answers = await conn.recv_until(lambda m: m["type"] in ("result", "error"))
            assert answers[-1]["type"] == "result", answers[-1]
            assert answers[-1]["outcome"] == "completed", answers[-1]
    assert met == [False, False]
    assert (live.workspace / "one.txt").read_text() == content
    assert (live.workspace / "two.txt").read_text() == content
