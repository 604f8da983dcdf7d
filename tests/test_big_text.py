"""The windowed text steps of the file tools (actors/tools/big_text.py) give exactly what the
one standard-library call each replaces gives, whatever the window and wherever an occurrence
or a multi-byte character falls across a window's edge."""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from toolwire.actors.tools import big_text

# A small alphabet, so that `old` occurs often, overlaps itself and straddles windows.
_texts = st.text(alphabet="ab\né€😀", max_size=80)
_olds = st.text(alphabet="ab\né€😀", min_size=1, max_size=4)
_windows = st.integers(1, 9)


@given(text=_texts, old=_olds, window=_windows)
@example(text="aaaa", old="aa", window=1)  # overlapping occurrences count once each
def test_count_is_str_count(text: str, old: str, window: int) -> None:
    assert big_text.count(text, old, window=window) == text.count(old)


@given(text=_texts, old=_olds, new=_texts, limit=st.integers(-1, 5), window=_windows)
@example(text="abab", old="ab", new="", limit=-1, window=1)
def test_replace_is_str_replace(text: str, old: str, new: str, limit: int, window: int) -> None:
    assert big_text.replace(text, old, new, limit, window=window) == text.replace(old, new, limit)


@given(text=_texts, window=_windows)
def test_utf8_round_trip_is_the_codec(text: str, window: int) -> None:
    raw = text.encode("utf-8")
    assert big_text.encode_utf8(text, window=window) == raw
    assert big_text.decode_utf8(raw, window=window) == text


@given(
    head=st.binary(max_size=20).filter(lambda b: _is_utf8(b)),
    bad=st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80"]),
    tail=st.binary(max_size=20),
    window=_windows,
)
def test_an_invalid_byte_is_reported_where_the_codec_reports_it(
    head: bytes, bad: bytes, tail: bytes, window: int
) -> None:
    """edit_files names the byte offset of the first bad byte: the file's, not a window's."""
    raw = head + bad + tail
    assume(not _is_utf8(raw))  # a cut sequence the tail completes is not bad
    with pytest.raises(UnicodeDecodeError) as expected:
        raw.decode("utf-8")
    with pytest.raises(UnicodeDecodeError) as got:
        big_text.decode_utf8(raw, window=window)
    assert got.value.start == expected.value.start


def test_an_empty_old_is_refused() -> None:
    with pytest.raises(ValueError, match="old must not be empty"):
        big_text.count("abc", "")


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
