"""Reading a file whole into a pooled buffer (actors/tools/whole_files.py), with real files and
real maps: the bytes given are the file's, exactly, whatever an earlier and longer file left in
the buffer, and also when the file grew after its stat; a buffer goes back to the pool after
use, on failure too, and is not lent again while a view of it lives."""

from __future__ import annotations

import io
import mmap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolwire.actors.buffer_pool import BufferPool
from toolwire.actors.tools import whole_files
from toolwire.actors.tools.whole_files import (
    POOLED_MIN_BYTES,
    WholeFile,
    has_live_views,
    new_map,
    read_whole,
)


def small_pool() -> BufferPool[mmap.mmap]:
    return BufferPool(new_map, len, has_live_views, granule=4096, max_idle=2,
                      max_idle_bytes=1 << 24)  # fmt: skip


def read(path: Path, pool: BufferPool[mmap.mmap], size: int | None = None) -> bytes:
    """What `read_whole` gives for `path` (stat'd as `size` bytes), as a `bytes`."""
    with open(path, "rb", buffering=0) as f:
        stat_size = path.stat().st_size if size is None else size
        with read_whole(f, stat_size, pool) as whole:
            return bytes(whole.content())


def test_has_live_views_tells_a_viewed_map_from_a_free_one() -> None:
    """The one adapter to CPython's mmap export count (`mmap.resize` refusing): if a Python
    release stops refusing, this fails and the pool must find another sign."""
    m = new_map(4096)
    assert not has_live_views(m)
    view = memoryview(m)[10:20]
    assert has_live_views(m)
    view.release()
    assert not has_live_views(m)
    m[:3] = b"abc"  # and the map still works as before
    assert m[:3] == b"abc" and len(m) == 4096


class UnresizableMap(mmap.mmap):
    """A map as on a platform without mremap, where CPython cannot resize one."""

    def resize(self, newsize: int) -> None:
        raise SystemError("mmap: resizing not available--no mremap()")


def test_a_map_that_cannot_tell_counts_as_viewed() -> None:
    """Where resizing says nothing, the pool must not lend the buffer again: it might be."""
    m = UnresizableMap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    assert has_live_views(m)


def test_a_small_file_is_read_as_bytes_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "small.txt"
    path.write_bytes(b"x" * 100)
    pool = small_pool()
    with open(path, "rb", buffering=0) as f, read_whole(f, 100, pool) as whole:
        assert whole == WholeFile(b"x" * 100, 100)
    assert pool.lent() == 0 and pool.idle() == 0


def test_a_big_file_reads_into_a_buffer_that_goes_back_and_is_used_again(tmp_path: Path) -> None:
    long, short = tmp_path / "long.txt", tmp_path / "short.txt"
    long.write_bytes(b"L" * (POOLED_MIN_BYTES + 5000))
    short.write_bytes(b"s" * POOLED_MIN_BYTES)
    pool = small_pool()
    with open(long, "rb", buffering=0) as f, read_whole(f, long.stat().st_size, pool) as whole:
        assert isinstance(whole.data, mmap.mmap)
        buffer = whole.data
        assert bytes(whole.content()) == long.read_bytes()
        assert pool.lent() == 1
    assert pool.lent() == 0 and pool.idle_buffers() == [buffer]
    with open(short, "rb", buffering=0) as f, read_whole(f, short.stat().st_size, pool) as whole:
        assert whole.data is buffer  # the same memory again
        # The longer file's bytes are still past the end: none of them is given.
        assert whole.length == POOLED_MIN_BYTES and buffer[whole.length] == ord("L")
        assert bytes(whole.content()) == short.read_bytes()


def test_a_file_that_grew_after_its_stat_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "grown.txt"
    data = bytes(range(256)) * (POOLED_MIN_BYTES // 256 + 40)
    path.write_bytes(data)
    pool = small_pool()
    assert read(path, pool, size=POOLED_MIN_BYTES) == data  # the stat said less
    assert pool.lent() == 0


def test_a_failed_read_gives_the_buffer_back(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_bytes(b"b" * POOLED_MIN_BYTES)
    pool = small_pool()
    with (
        io.FileIO(path, "a") as f,  # open, but not for reading: the read into the buffer fails
        pytest.raises(io.UnsupportedOperation),
        read_whole(f, POOLED_MIN_BYTES, pool),
    ):
        pytest.fail("a file open only for writing was read")
    assert pool.lent() == 0 and pool.idle() == 1


def test_a_failure_while_held_gives_the_buffer_back(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_bytes(b"b" * POOLED_MIN_BYTES)
    pool = small_pool()
    with (
        pytest.raises(RuntimeError, match="in the edit"),
        open(path, "rb", buffering=0) as f,
        read_whole(f, POOLED_MIN_BYTES, pool),
    ):
        raise RuntimeError("in the edit")
    assert pool.lent() == 0 and pool.idle() == 1


def test_a_buffer_whose_view_outlived_its_read_is_not_lent_again(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_bytes(b"1" * POOLED_MIN_BYTES)
    pool = small_pool()
    with open(path, "rb", buffering=0) as f, read_whole(f, POOLED_MIN_BYTES, pool) as whole:
        kept = whole.content()  # a view that outlives the context (as a traceback's could)
        first = whole.data
    path.write_bytes(b"2" * POOLED_MIN_BYTES)
    with open(path, "rb", buffering=0) as f, read_whole(f, POOLED_MIN_BYTES, pool) as whole:
        assert whole.data is not first
    assert bytes(kept) == b"1" * POOLED_MIN_BYTES  # untouched by the second read


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=st.lists(st.integers(0, 3 * 4096), min_size=1, max_size=6), seed=st.integers(0, 255))
def test_each_read_gives_exactly_the_files_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: list[int], seed: int
) -> None:
    """Files of any size one after the other through one pool of small buffers (every size
    pooled): each read gives its own file's bytes, never a byte more or another file's."""
    monkeypatch.setattr(whole_files, "POOLED_MIN_BYTES", 0)
    pool = small_pool()
    for i, size in enumerate(sizes):
        data = bytes((seed + i + k) % 251 for k in range(size))
        path = tmp_path / f"f{i}.txt"
        path.write_bytes(data)
        assert read(path, pool) == data
    assert pool.lent() == 0
