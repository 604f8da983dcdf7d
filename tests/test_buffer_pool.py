"""The pool of read buffers (actors/buffer_pool.py): a buffer is never lent to two holders, nor
while a view of it is left; what stays idle keeps to its bounds; a buffer given back is used
again. A hypothesis state machine against a model of what is lent, idle and viewed."""

from __future__ import annotations

import threading

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from toolwire.actors.buffer_pool import BufferPool


class Buf:
    """A buffer as the pool sees one: a capacity, and the views of it still alive."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.views = 0


GRANULE = 4
MAX_IDLE = 3
MAX_IDLE_BYTES = 40


def pool_of(made: list[Buf]) -> BufferPool[Buf]:
    def make(capacity: int) -> Buf:
        made.append(Buf(capacity))
        return made[-1]

    return BufferPool(
        make,
        lambda b: b.capacity,
        lambda b: b.views > 0,
        granule=GRANULE,
        max_idle=MAX_IDLE,
        max_idle_bytes=MAX_IDLE_BYTES,
    )


class PoolMachine(RuleBasedStateMachine):
    lent = Bundle("lent")

    def __init__(self) -> None:
        super().__init__()
        self.made: list[Buf] = []
        self.pool = pool_of(self.made)
        self.holders: dict[int, tuple[Buf, int]] = {}  # id -> (buffer, size asked for)
        self.viewed: list[Buf] = []  # buffers with a view left over, lent or not

    @rule(target=lent, size=st.integers(0, 50))
    def take(self, size: int) -> Buf:
        idle_before = self.pool.idle()
        fits_idle = idle_before > 0 and self._some_idle_fits(size)
        made_before = len(self.made)
        buffer = self.pool.take(size)
        assert buffer.capacity >= size
        assert id(buffer) not in self.holders, "lent twice"
        assert buffer.views == 0, "lent with a view of it still alive"
        if len(self.made) > made_before:
            assert buffer.capacity == max(GRANULE, -(-size // GRANULE) * GRANULE)
            assert not fits_idle, "made a buffer while an idle one fitted"
        self.holders[id(buffer)] = (buffer, size)
        return buffer

    def _some_idle_fits(self, size: int) -> bool:
        lent = {id(b) for b, _ in self.holders.values()}
        idle = [b for b in self._idle_model() if id(b) not in lent]
        return any(b.capacity >= size and b.views == 0 for b in idle)

    def _idle_model(self) -> list[Buf]:
        return self.pool.idle_buffers()

    @rule(buffer=consumes(lent), leave_a_view=st.booleans())
    def give_back(self, buffer: Buf, leave_a_view: bool) -> None:
        if leave_a_view:
            buffer.views += 1
            self.viewed.append(buffer)
        del self.holders[id(buffer)]
        self.pool.give_back(buffer)

    @precondition(lambda self: self.viewed)
    @rule(data=st.data())
    def drop_a_view(self, data: st.DataObject) -> None:
        buffer = self.viewed.pop(data.draw(st.integers(0, len(self.viewed) - 1)))
        buffer.views -= 1

    @rule(buffer=lent)
    def give_back_twice_is_refused(self, buffer: Buf) -> None:
        if id(buffer) in self.holders:
            return
        before = (self.pool.idle(), self.pool.lent())
        with pytest.raises(ValueError, match="not lent by this pool"):
            self.pool.give_back(buffer)
        assert (self.pool.idle(), self.pool.lent()) == before

    @invariant()
    def bounds_hold(self) -> None:
        assert self.pool.idle() <= MAX_IDLE
        assert self.pool.idle_bytes() <= MAX_IDLE_BYTES
        assert self.pool.lent() == len(self.holders)
        idle_ids = [id(b) for b in self._idle_model()]
        assert len(set(idle_ids)) == len(idle_ids)
        assert not set(idle_ids) & set(self.holders)


TestPool = PoolMachine.TestCase


def test_a_buffer_given_back_is_lent_again_instead_of_a_new_one() -> None:
    made: list[Buf] = []
    pool = pool_of(made)
    first = pool.take(10)
    pool.give_back(first)
    assert pool.take(7) is first
    assert len(made) == 1


def test_the_smallest_idle_buffer_that_fits_is_lent() -> None:
    made: list[Buf] = []
    pool = pool_of(made)
    big, small = pool.take(20), pool.take(8)
    pool.give_back(big)
    pool.give_back(small)
    assert pool.take(6) is small
    assert pool.take(6) is big


def test_a_viewed_buffer_waits_until_its_last_view_is_gone() -> None:
    made: list[Buf] = []
    pool = pool_of(made)
    first = pool.take(8)
    first.views = 1
    pool.give_back(first)
    second = pool.take(8)
    assert second is not first
    first.views = 0
    pool.give_back(second)
    assert pool.take(8) in (first, second)
    assert len(made) == 2


def test_what_stays_idle_is_the_newest_within_the_bounds() -> None:
    made: list[Buf] = []
    pool = pool_of(made)
    taken = [pool.take(8) for _ in range(MAX_IDLE + 1)]
    for b in taken:
        pool.give_back(b)
    assert pool.idle() == MAX_IDLE
    assert pool.idle_buffers() == taken[1:]  # the one given back first was dropped
    huge = pool.take(MAX_IDLE_BYTES + 1)
    pool.give_back(huge)
    # Too big to keep: dropped alone.
    assert huge not in pool.idle_buffers() and pool.idle() == MAX_IDLE


def test_bad_bounds_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="granule: must be >= 1"):
        BufferPool(Buf, lambda b: b.capacity, lambda b: False, granule=0, max_idle=1,
                   max_idle_bytes=1)  # fmt: skip
    pool = pool_of([])
    with pytest.raises(ValueError, match="size: must be >= 0"):
        pool.take(-1)
    with pytest.raises(ValueError, match="not lent by this pool"):
        pool.give_back(Buf(8))


def test_threads_taking_at_once_never_share_a_buffer() -> None:
    made: list[Buf] = []
    pool = pool_of(made)
    holding: set[int] = set()
    guard = threading.Lock()
    shared: list[str] = []
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        for _ in range(2000):
            b = pool.take(8)
            with guard:
                if id(b) in holding:
                    shared.append("lent twice")
                holding.add(id(b))
            with guard:
                holding.discard(id(b))
            pool.give_back(b)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert shared == []
    assert pool.lent() == 0 and pool.idle() <= MAX_IDLE
