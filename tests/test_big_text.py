"""The windowed steps of edit_files (actors/tools/big_text.py) give exactly what the standard
library gives on the decoded text, whatever the window and wherever an occurrence or a
multi-byte character falls across a window's edge."""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from toolwire.actors.tools import big_text

# A small alphabet of one- to four-byte characters, so that `old` occurs often, overlaps itself
# and straddles windows, and a byte match could start inside a character if UTF-8 allowed it.
_alphabet = "ab\né€😀"
_texts = st.text(alphabet=_alphabet, max_size=80)
_olds = st.text(alphabet=_alphabet, min_size=1, max_size=4)
_windows = st.integers(1, 9)


@given(text=_texts, old=_olds, new=_texts, replace_all=st.booleans(), window=_windows)
@example(text="aaaa", old="aa", new="", replace_all=True, window=1)  # overlaps count once
@example(text="é", old="\u00a9", new="x", replace_all=True, window=1)  # "é" holds 0xa9
def test_a_byte_edit_is_the_text_edit(
    text: str, old: str, new: str, replace_all: bool, window: int
) -> None:
    data, old_b = text.encode(), old.encode()
    starts = big_text.find_all(data, old_b, window=window)
    assert len(starts) == text.count(old)
    limit = -1 if replace_all else 1
    if not replace_all:
        assert big_text.find_all(data, old_b, 1, window=window) == starts[:1]
    pieces = big_text.replaced(data, starts[: None if replace_all else 1], len(old_b), new.encode())
    expected = text.replace(old, new, limit).encode()
    assert big_text.joined(pieces) == expected
    assert big_text.size(pieces) == len(expected)
    assert big_text.sha256_hex(pieces) == big_text.sha256_hex([expected])


@given(text=_texts, window=_windows)
def test_valid_utf8_passes(text: str, window: int) -> None:
    big_text.check_utf8(text.encode(), window=window)


@given(
    head=st.text(alphabet=_alphabet, max_size=20).map(str.encode),
    bad=st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x80"]),
    tail=st.binary(max_size=20),
    window=_windows,
)
def test_an_invalid_byte_is_reported_where_the_codec_reports_it(
    head: bytes, bad: bytes, tail: bytes, window: int
) -> None:
    """edit_files names the byte offset of the first bad byte: the file's, not a window's."""
    raw = head + bad + tail
    try:
        raw.decode("utf-8")
        assume(False)  # a cut sequence the tail completes is not bad
    except UnicodeDecodeError as expected:
        with pytest.raises(UnicodeDecodeError) as got:
            big_text.check_utf8(raw, window=window)
        assert got.value.start == expected.start


def test_an_empty_old_is_refused() -> None:
    with pytest.raises(ValueError, match="old must not be empty"):
        big_text.find_all(b"abc", b"")


@given(
    text=_texts,
    old=_olds,
    new=_texts,
    junk=st.text(alphabet=_alphabet, max_size=20).map(str.encode),
    window=_windows,
)
def test_bytes_past_end_are_never_looked_at(
    text: str, old: str, new: str, junk: bytes, window: int
) -> None:
    """A file read into a bigger buffer is the buffer's start: with `end`, every step gives
    what it gives on the file's bytes alone, whatever follows them (there `old` may occur, or
    a character be cut)."""
    data, old_b = text.encode(), old.encode()
    buffer = data + junk + old_b
    end = len(data)
    starts = big_text.find_all(buffer, old_b, end=end, window=window)
    assert starts == big_text.find_all(data, old_b, window=window)
    assert big_text.contains(buffer, old_b, end=end) == (old_b in data)
    pieces = big_text.replaced(buffer, starts, len(old_b), new.encode(), end=end)
    assert big_text.joined(pieces) == text.replace(old, new).encode()
    big_text.check_utf8(buffer + b"\xff", end=end, window=window)


def test_an_end_outside_the_buffer_is_refused() -> None:
    with pytest.raises(ValueError, match=r"end: must be within 0..3, not 4"):
        big_text.find_all(b"abc", b"a", end=4)
