"""Tests of actors/output.py against a plain `bytes` model.

The model keeps every byte ever appended; the expected retained ranges, reads and Result output
are computed from it with Python's own UTF-8 decoder as the oracle for character boundaries.
"""

from __future__ import annotations

import itertools
import tracemalloc
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire.actors.output import (
    DEFAULT_RESULT_BYTES,
    DEFAULT_RETENTION_BYTES,
    OMITTED_MARKER,
    RESULT_HEAD_BYTES,
    RUNNING_HEAD_BYTES,
    Chunk,
    OutputBuffer,
)

# -- the model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    retention: int
    head: int
    result: int
    result_head: int

    def buffer(self) -> OutputBuffer:
        return OutputBuffer(self.retention, self.head, self.result, self.result_head)


SMALL = Config(retention=64, head=16, result=32, result_head=8)


def decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _proper_prefixes() -> frozenset[bytes]:
    """Every proper prefix of the UTF-8 encoding of a valid code point (surrogates excluded).

    A prefix of at most 3 bytes fixes all but the low 6 bits, so one code point per 64 is enough.
    """
    prefixes: set[bytes] = set()
    for code_point in range(0x80, 0x110000, 64):
        if 0xD800 <= code_point <= 0xDFFF:
            continue
        encoded = chr(code_point).encode()
        prefixes.update(encoded[:length] for length in range(1, len(encoded)))
    return frozenset(prefixes)


PROPER_PREFIXES = _proper_prefixes()


def held_back(data: bytes) -> int:
    """Length of the incomplete character ending `data`: bytes that more bytes could complete."""
    for length in (3, 2, 1):
        if len(data) >= length and data[-length:] in PROPER_PREFIXES:
            return length
    return 0


def orphans(data: bytes) -> int:
    """Leading continuation bytes (at most 3): the rest of a character whose start is gone."""
    count = 0
    while count < min(3, len(data)) and 0x80 <= data[count] <= 0xBF:
        count += 1
    return count


def boundaries(data: bytes) -> set[int]:
    """Offsets where decoding can be split without changing the text: character starts."""
    full = decode(data)
    return {q for q in range(len(data) + 1) if decode(data[:q]) + decode(data[q:]) == full}


def open_state(cfg: Config, total: int) -> tuple[int, int]:
    """(end of head range, start of tail range) while the process runs."""
    head_end = min(total, cfg.head)
    return head_end, max(head_end, total - (cfg.retention - cfg.head))


def closed_state(cfg: Config, total: int) -> tuple[int, int]:
    """(end of head range, start of tail range) after close()."""
    head_end, tail_start = open_state(cfg, total)
    gap = tail_start > head_end
    new_head_end = min(cfg.result_head, head_end if gap else total)
    new_tail_start = max(total - (cfg.result - cfg.result_head), tail_start if gap else 0)
    return new_head_end, max(new_tail_start, new_head_end)


def ranges_of(head_end: int, tail_start: int, total: int) -> tuple[tuple[int, int], ...]:
    if tail_start == head_end:
        return ((0, total),) if total else ()
    return tuple(r for r in ((0, head_end), (tail_start, total)) if r[0] < r[1])


def model_ranges(cfg: Config, total: int, closed: bool) -> tuple[tuple[int, int], ...]:
    """The byte ranges a buffer of `cfg` must still hold after `total` bytes (PROTOCOL.md 5.2)."""
    return ranges_of(*(closed_state if closed else open_state)(cfg, total), total)


def expected_result(cfg: Config, model: bytes) -> tuple[str, int]:
    """The Result output, built from the model as PROTOCOL.md 5.2 describes it."""
    total = len(model)
    head_end, tail_start = open_state(cfg, total)
    gap = tail_start > head_end
    if not gap and total <= cfg.result:
        return decode(model), 0
    head = model[: min(cfg.result_head, head_end if gap else total)]
    head = head[: len(head) - held_back(head)]
    tail = model[max(total - (cfg.result - cfg.result_head), tail_start if gap else 0) :]
    tail = tail[orphans(tail) :]
    omitted = total - len(head) - len(tail)
    return decode(head) + "\n" + OMITTED_MARKER.format(n=omitted) + "\n" + decode(tail), omitted


def expected_result_since(
    cfg: Config, model: bytes, ranges: tuple[tuple[int, int], ...], start: int
) -> tuple[str, int]:
    """The Result output of the bytes from `start` on (a process_input's, PROTOCOL.md 9.1),
    from the model and the retained ranges: whole when all of them are retained and fit, else
    the head (from the range holding `start`, if any) and the tail around the marker."""
    total = len(model)
    holding = next(((a, b) for a, b in ranges if a <= start < b), None)
    whole = start == total or (holding is not None and holding[1] == total)
    if whole and total - start <= cfg.result:
        return decode(model[start:]), 0
    head_end = start if holding is None else min(start + cfg.result_head, holding[1])
    head = model[start:head_end]
    head = head[: len(head) - held_back(head)]
    # The tail comes from the range that ends at `total` (none if the newest bytes are gone).
    last_start = ranges[-1][0] if ranges and ranges[-1][1] == total else total
    tail = model[max(total - (cfg.result - cfg.result_head), last_start, head_end) :]
    tail = tail[orphans(tail) :]
    omitted = total - start - len(head) - len(tail)
    return decode(head) + "\n" + OMITTED_MARKER.format(n=omitted) + "\n" + decode(tail), omitted


def first_retained(ranges: tuple[tuple[int, int], ...], total: int, offset: int) -> int:
    for start, end in ranges:
        if offset < end:
            return max(offset, start)
    return total


class ReadOracle:
    """What read() must return, from the model and the retained ranges."""

    def __init__(self, model: bytes, ranges: tuple[tuple[int, int], ...], closed: bool) -> None:
        self.model = model
        self.total = len(model)
        self.closed = closed
        self.ranges = ranges
        # per range: (start, end, character starts in it (end included))
        self.info: list[tuple[int, int, list[int]]] = []
        for start, end in ranges:
            skip = orphans(model[start:end]) if start > 0 else 0
            starts = sorted(start + skip + q for q in boundaries(model[start + skip : end]))
            self.info.append((start, end, starts))

    def expected(self, offset: int, max_bytes: int) -> Chunk | None:
        begin = first_retained(self.ranges, self.total, offset)
        for _start, end, starts in self.info:
            if begin >= end:
                continue
            first = min(q for q in starts if q >= begin)
            if first == end:  # only the rest of a character whose start is elsewhere: go on
                continue
            final = self.closed or end < self.total  # nothing can follow `end` any more
            limit = min(end, first + max_bytes)
            stop = limit
            if not (final and limit == end):
                stop -= held_back(self.model[first:limit])
            if stop == first:
                if limit == end:
                    return None  # an incomplete character, held back
                stop = min(q for q in starts if q > first)  # one character > max_bytes
                if stop == end and not final and held_back(self.model[first:end]):
                    return None
            return Chunk(first, decode(self.model[first:stop]), stop)
        return None

    def check(self, chunk: Chunk | None, offset: int, max_bytes: int) -> None:
        assert chunk == self.expected(offset, max_bytes), (offset, max_bytes)


def check_state(buf: OutputBuffer, cfg: Config, model: bytes) -> tuple[tuple[int, int], ...]:
    """Where every reader resumes is where the model's retained ranges say; once closed, no
    more than a Result's `output` is held (the reads of `check_reads` see exactly these)."""
    total = len(model)
    ranges = model_ranges(cfg, total, buf.closed)
    assert buf.total == total
    for offset in range(total + 2):
        assert buf.first_retained(offset) == first_retained(ranges, total, offset)
    if buf.closed:
        assert sum(end - start for start, end in ranges) <= cfg.result
    return ranges


def check_reads(buf: OutputBuffer, cfg: Config, model: bytes, max_sizes: list[int]) -> None:
    oracle = ReadOracle(model, model_ranges(cfg, len(model), buf.closed), buf.closed)
    for max_bytes in max_sizes:
        for offset in range(len(model) + 2):
            oracle.check(buf.read(offset, max_bytes), offset, max_bytes)


# -- strategies --------------------------------------------------------------------------------

# ASCII, 2-, 3- and 4-byte characters, newlines and a NUL: the shapes of real build output.
TEXT = st.text(alphabet=st.sampled_from("ab \n\x00é€中😀🎉"), max_size=16)
# Bytes at the edges of UTF-8's validity table: leads whose allowed second byte is narrowed
# (E0, ED, F0, F4), never-valid bytes (C0, C1, F5, FF), and continuation bytes at each range edge.
EDGY = st.lists(
    st.sampled_from(
        b"\x41\x80\x8f\x90\x9f\xa0\xbf\xc0\xc1\xc2\xdf\xe0\xe1\xed\xef\xf0\xf1\xf4\xf5\xff"
    ),
    max_size=24,
).map(bytes)
PIECE = st.one_of(st.binary(max_size=24), TEXT.map(str.encode), EDGY)


@st.composite
def splits(draw: st.DrawFn, max_parts: int = 10) -> list[bytes]:
    """Output bytes split into appends at arbitrary byte positions (so inside characters)."""
    blob = b"".join(draw(st.lists(PIECE, max_size=max_parts)))
    cuts = sorted(draw(st.lists(st.integers(0, len(blob)), max_size=max_parts)))
    edges = [0, *cuts, len(blob)]
    return [blob[a:b] for a, b in itertools.pairwise(edges)]


@st.composite
def configs(draw: st.DrawFn) -> Config:
    retention = draw(st.integers(0, 72))
    result = draw(st.integers(0, 48))
    return Config(
        retention=retention,
        head=draw(st.integers(0, retention)),
        result=result,
        result_head=draw(st.integers(0, result)),
    )


CONFIGS = st.one_of(
    st.sampled_from([SMALL, Config(64, 0, 32, 0), Config(40, 40, 32, 32), Config(8, 4, 6, 2)]),
    configs(),
)

# -- properties --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(cfg=CONFIGS, pieces=splits(), max_bytes=st.sampled_from([1, 2, 3, 5, 64]))
def test_matches_bytes_model(cfg: Config, pieces: list[bytes], max_bytes: int) -> None:
    buf = cfg.buffer()
    model = b""
    for piece in pieces:
        buf.append(piece)
        model += piece
        check_state(buf, cfg, model)
        check_reads(buf, cfg, model, [max_bytes])
        assert buf.result_output() == expected_result(cfg, model)
    check_reads(buf, cfg, model, [1, 3, 4, 7, 1000])
    before = buf.result_output()
    buf.close()
    check_state(buf, cfg, model)
    check_reads(buf, cfg, model, [1, 3, 4, 7, 1000])
    assert buf.result_output() == before == expected_result(cfg, model)
    buf.close()  # idempotent
    check_state(buf, cfg, model)
    with pytest.raises(ValueError, match="closed"):
        buf.append(b"x")


ACTIONS = st.lists(
    st.one_of(
        PIECE.map(lambda b: ("append", b)),
        st.sampled_from([1, 2, 3, 6, 50]).map(lambda n: ("read", n)),
    ),
    max_size=40,
)


def drain(buf: OutputBuffer, cursor: int, max_bytes: int, out: list[Chunk]) -> int:
    while (chunk := buf.read(cursor, max_bytes)) is not None:
        out.append(chunk)
        cursor = chunk.next_offset
    return cursor


@settings(max_examples=300, deadline=None)
@given(cfg=CONFIGS, pieces=splits(), close=st.booleans(), data=st.data())
def test_result_output_from_an_offset_matches_the_model(
    cfg: Config, pieces: list[bytes], close: bool, data: st.DataObject
) -> None:
    """A process_input's output is the part of the process's output from where its write
    began: head and tail of those bytes within the result limits, every dropped or omitted
    byte counted, and from offset 0 exactly what the call's own result holds."""
    buf = cfg.buffer()
    model = b"".join(pieces)
    for piece in pieces:
        buf.append(piece)
    if close:
        buf.close()
    start = data.draw(st.integers(0, len(model)))
    text, truncated = buf.result_output(start)
    ranges = model_ranges(cfg, len(model), close)
    assert (text, truncated) == expected_result_since(cfg, model, ranges, start)
    assert buf.result_output(0) == buf.result_output()
    if truncated == 0:
        assert text == decode(model[start:])
    with pytest.raises(ValueError, match="start"):
        buf.result_output(len(model) + 1)


@settings(max_examples=200, deadline=None)
@given(
    cfg=st.sampled_from(
        [Config(4096, 16, 4096, 8), Config(4096, 16, 32, 8), Config(4096, 0, 4096, 0)]
    ),
    pieces=splits(max_parts=30),
    reads=st.lists(st.integers(1, 9), max_size=30),
)
def test_cursor_reproduces_decode_when_never_truncated(
    cfg: Config, pieces: list[bytes], reads: list[int]
) -> None:
    buf = cfg.buffer()
    chunks: list[Chunk] = []
    cursor = 0
    for index, piece in enumerate(pieces):
        buf.append(piece)
        if index < len(reads):
            cursor = drain(buf, cursor, reads[index], chunks)
            assert cursor >= buf.total - 3  # at most one incomplete character held back
    cursor = drain(buf, cursor, 64, chunks)
    assert cursor >= buf.total - 3  # nothing dropped: the cursor never jumped
    buf.close()
    cursor = drain(buf, cursor, 64, chunks)
    model = b"".join(pieces)
    assert cursor == len(model)
    assert "".join(chunk.data for chunk in chunks) == decode(model)
    # Contiguous offsets: nothing skipped, nothing read twice.
    assert [c.offset for c in chunks] == [0, *(c.next_offset for c in chunks)][: len(chunks)]


@settings(max_examples=200, deadline=None)
@given(cfg=CONFIGS, actions=ACTIONS)
def test_cursor_jumps_only_over_dropped_bytes(
    cfg: Config, actions: list[tuple[str, object]]
) -> None:
    buf = cfg.buffer()
    model = b""
    cursor = 0
    seen: list[Chunk] = []
    for kind, arg in [*actions, ("close", None), ("read", 7)]:
        if kind == "append":
            assert isinstance(arg, bytes)
            buf.append(arg)
            model += arg
            continue
        if kind == "close":
            buf.close()
            continue
        assert isinstance(arg, int)
        while (chunk := buf.read(cursor, arg)) is not None:
            assert chunk.data == decode(model[chunk.offset : chunk.next_offset])
            assert chunk.next_offset > chunk.offset >= cursor
            if chunk.offset != cursor:
                # A jump: the cursor's byte was dropped, or it is among the orphaned rest of a
                # character at the start of the tail range (whose own start was dropped).
                resumed = buf.first_retained(cursor)
                ranges = model_ranges(cfg, len(model), buf.closed)
                dropped = len(model) - sum(end - start for start, end in ranges)
                assert resumed != cursor or (dropped and cursor < ranges[-1][0] + 3)
                assert chunk.offset - resumed <= 3
            seen.append(chunk)
            cursor = chunk.next_offset
    # Closed and drained: all that is left after the cursor is at most the orphaned rest of a
    # character at the start of the tail range (nothing at all if nothing was dropped).
    rest = model[buf.first_retained(cursor) :]
    dropped = len(model) - sum(end - start for start, end in model_ranges(cfg, len(model), True))
    assert cursor == len(model) or (dropped and orphans(rest) == len(rest))


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(st.binary(max_size=64), EDGY), max_bytes=st.integers(1, 5))
def test_tiny_reads_of_binary_match_python_decoder(data: bytes, max_bytes: int) -> None:
    """max_bytes < 4 forces one-character reads: the buffer's idea of a character must agree
    with CPython's decoder byte for byte, invalid sequences included."""
    buf = OutputBuffer(retention_bytes=128, head_bytes=16)
    buf.append(data)
    buf.close()
    chunks: list[Chunk] = []
    assert drain(buf, 0, max_bytes, chunks) == len(data)
    assert "".join(c.data for c in chunks) == decode(data)


# -- explicit cases ----------------------------------------------------------------------------


def test_three_megabytes_keep_first_and_last_lines() -> None:
    lines = [f"line {n:07d} {'x' * 40}\n".encode() for n in range(60_000)]
    output = b"".join(lines)
    assert len(output) > 3_000_000
    buf = OutputBuffer()
    for start in range(0, len(output), 4096):
        buf.append(output[start : start + 4096])
    assert buf.total == len(output)
    # The first 64 KiB and the newest bytes, 1 MiB in all: a reader in between resumes there.
    tail_start = len(output) - (DEFAULT_RETENTION_BYTES - RUNNING_HEAD_BYTES)
    near_head_end = RUNNING_HEAD_BYTES - 5
    assert buf.read(near_head_end) == Chunk(
        near_head_end, decode(output[near_head_end:RUNNING_HEAD_BYTES]), RUNNING_HEAD_BYTES
    )
    assert buf.first_retained(RUNNING_HEAD_BYTES) == tail_start
    assert buf.read(len(output) // 2, 10) == Chunk(
        tail_start, decode(output[tail_start : tail_start + 10]), tail_start + 10
    )

    text, truncated = buf.result_output()
    tail_bytes = DEFAULT_RESULT_BYTES - RESULT_HEAD_BYTES
    assert truncated == len(output) - RESULT_HEAD_BYTES - tail_bytes
    assert text.startswith(decode(lines[0]))
    assert text.endswith(decode(lines[-1]))
    marker = "\n" + OMITTED_MARKER.format(n=truncated) + "\n"
    assert marker == f"\n[... {truncated} bytes omitted ...]\n"
    head, _, tail = text.partition(marker)
    assert head.encode() == output[:RESULT_HEAD_BYTES]
    assert tail.encode() == output[-tail_bytes:]

    buf.close()
    assert buf.first_retained(RESULT_HEAD_BYTES) == len(output) - tail_bytes
    assert buf.result_output() == (text, truncated)
    assert buf.read(0) == Chunk(0, decode(output[:RESULT_HEAD_BYTES]), RESULT_HEAD_BYTES)


def test_two_hundred_megabytes_append_in_bounded_memory() -> None:
    """A process printing without end costs the agent about twice its retention in memory,
    measured as Python allocates it. Speed lives in benchmarks/ (the streaming scenario),
    never in a timed assertion here."""
    piece = bytes(range(256)) * 256  # 64 KiB
    tracemalloc.start()
    try:
        buf = OutputBuffer()
        for _ in range(3200):
            buf.append(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The buffer stores the head and up to twice the tail (a dead prefix waits for
    # compaction); bytearray's over-allocation on growth adds up to half of that again (3.1 MiB
    # measured on CPython 3.11). 4 MiB is the bound: 200 MiB were printed.
    assert peak <= 4 * DEFAULT_RETENTION_BYTES
    tail_bytes = DEFAULT_RETENTION_BYTES - RUNNING_HEAD_BYTES
    assert buf.total == 3200 * len(piece)
    tail_start = buf.total - tail_bytes
    assert buf.first_retained(RUNNING_HEAD_BYTES) == tail_start
    expected = decode(piece[tail_start % len(piece) :][:256])
    assert buf.read(tail_start, 256) == Chunk(tail_start, expected, tail_start + 256)


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_character_split_across_appends_is_never_mangled(char: str) -> None:
    encoded = char.encode()
    for cut in range(1, len(encoded)):
        buf = OutputBuffer()
        buf.append(b"ab" + encoded[:cut])
        first = buf.read(0)
        assert first == Chunk(0, "ab", 2)
        assert buf.read(2) is None  # the incomplete character is held back, not replaced
        buf.append(encoded[cut:] + b"cd")
        assert buf.read(first.next_offset) == Chunk(2, char + "cd", 4 + len(encoded))
        assert buf.result_output() == ("ab" + char + "cd", 0)


def test_incomplete_character_at_close_decodes_as_replacement() -> None:
    buf = OutputBuffer()
    buf.append(b"ok \xe2\x82")
    assert buf.read(0) == Chunk(0, "ok ", 3)
    assert buf.read(3) is None
    buf.close()
    assert buf.read(3) == Chunk(3, "\ufffd", 5)
    assert buf.read(5) is None
    assert buf.result_output() == ("ok \ufffd", 0)


def test_tiny_max_bytes_still_progresses() -> None:
    text = "a😀€é" * 3
    buf = OutputBuffer()
    buf.append(text.encode())
    for max_bytes in (1, 2, 3):
        chunks: list[Chunk] = []
        cursor = drain(buf, 0, max_bytes, chunks)
        assert cursor == len(text.encode())
        assert "".join(c.data for c in chunks) == text
        assert all(len(c.data) == 1 or c.next_offset - c.offset <= max_bytes for c in chunks)


def test_read_from_dropped_offset_resumes_at_first_retained_byte() -> None:
    buf = SMALL.buffer()
    buf.append(b"".join(b"%02d" % n for n in range(50)))  # 100 ASCII bytes
    assert buf.first_retained(16) == 52  # 36 bytes dropped from the middle
    for offset in (16, 30, 51, 52):
        assert buf.read(offset, 8) == Chunk(52, "26272829", 60)
    assert buf.read(15, 8) == Chunk(15, "7", 16)  # stops at the gap; the caller calls again
    assert buf.read(100) is None
    assert buf.read(1000) is None


def test_read_skips_orphaned_continuation_bytes_after_gap() -> None:
    buf = SMALL.buffer()
    # 16-byte head, then "€" characters: the tail range (last 48 bytes) starts mid-character.
    buf.append(b"h" * 16 + "€".encode() * 30)
    tail_start = buf.first_retained(16)
    assert buf.total == 106
    assert tail_start == 58 and (tail_start - 16) % 3 == 0  # 58 is a lead byte here
    buf.append(b"x")  # now the tail starts at 59: inside a "€"
    chunk = buf.read(17)
    assert chunk is not None
    assert chunk.offset == 61  # 59 and 60 are the rest of a "€" whose first byte was dropped
    assert chunk.data == "€" * 15 + "x"
    text, truncated = buf.result_output()
    assert text == "h" * 8 + f"\n[... {truncated} bytes omitted ...]\n" + "€" * 7 + "x"
    assert truncated == 107 - 8 - 22


def test_empty_append_is_a_no_op_and_empty_buffer_reads_nothing() -> None:
    buf = OutputBuffer()
    buf.append(b"")
    assert (buf.total, buf.first_retained(0)) == (0, 0)
    assert buf.read(0) is None
    assert buf.result_output() == ("", 0)
    buf.close()
    assert buf.closed
    assert buf.read(0) is None
    assert buf.result_output() == ("", 0)


def test_defaults_are_the_protocol_limits() -> None:
    assert DEFAULT_RETENTION_BYTES == 1024 * 1024
    assert RUNNING_HEAD_BYTES == 64 * 1024
    assert DEFAULT_RESULT_BYTES == 64 * 1024
    assert RESULT_HEAD_BYTES == 16 * 1024
    assert OMITTED_MARKER.format(n=7) == "[... 7 bytes omitted ...]"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"retention_bytes": -1}, "retention_bytes"),
        ({"head_bytes": -1}, "head_bytes"),
        ({"result_bytes": -1, "result_head_bytes": 0}, "result_bytes"),
        ({"result_head_bytes": -1}, "result_head_bytes"),
        ({"retention_bytes": 10, "head_bytes": 11}, "head_bytes"),
        ({"result_bytes": 10, "result_head_bytes": 11}, "result_head_bytes"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, int], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        OutputBuffer(**kwargs)


def test_bad_read_arguments() -> None:
    buf = OutputBuffer()
    buf.append(b"abc")
    with pytest.raises(ValueError, match="max_bytes"):
        buf.read(0, 0)
    with pytest.raises(ValueError, match="offset"):
        buf.read(-1)
    with pytest.raises(ValueError, match="offset"):
        buf.first_retained(-1)


def test_an_incomplete_character_where_the_call_ended_is_final_there() -> None:
    """A call that ended (its Result says `output_bytes`) while the buffer stays open: the
    character cut by that end reads as one U+FFFD at its offset (PROTOCOL.md 9.9); without
    `final_at` it is held back, since more bytes could still complete it."""
    buffer = OutputBuffer()
    buffer.append(b"ab\xe2")
    assert buffer.read(0) == Chunk(0, "ab", 2)
    assert buffer.read(2) is None
    assert buffer.read(2, final_at=3) == Chunk(2, "\ufffd", 3)
    assert buffer.read(0, final_at=3) == Chunk(0, "ab\ufffd", 3)
    buffer.append(b"\x82\xac")  # the command went on and completed it: the bytes decide
    assert buffer.read(2, final_at=3) == Chunk(2, "\u20ac", 5)


def test_a_character_cut_where_the_call_ended_is_final_there_though_more_of_it_came() -> None:
    """A timed-out command runs on and appends part, not all, of the rest of the character its
    call's end cut (`sim-run` of seeds 61075 and 62718 of the crashes scenario: 1 of the 4 bytes
    of U+1F642 at `output_bytes`, 3 when the follower read). The call's output still ends at
    `final_at`: the character is U+FFFD there, so stitched output reaches `output_bytes`;
    holding it back (more bytes could still complete it) left the follower one byte short."""
    buffer = OutputBuffer()
    buffer.append(b"@ 0 \xf0")  # the call timed out here: output_bytes = 5
    buffer.append(b"\x9f\x99")  # the command ran on; the character is still incomplete
    assert buffer.read(4, final_at=5) == Chunk(4, "\ufffd", 5)
    assert buffer.read(0, final_at=5) == Chunk(0, "@ 0 \ufffd", 5)
    assert buffer.read(0, 3, final_at=5) == Chunk(0, "@ 0", 3)  # a smaller read stops before
    # Past the end of the call nothing is final yet: the rest of the cut character is skipped
    # and the character held back, as for any open buffer.
    assert buffer.read(5, final_at=5) is None
    assert buffer.read(4) is None
    buffer.append(b"\x82!")  # completed later: a plain read sees it whole
    assert buffer.read(4) == Chunk(4, "\U0001f642!", 9)
    assert buffer.read(5, final_at=5) == Chunk(8, "!", 9)
