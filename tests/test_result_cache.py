"""The recent-results cache (actors/result_cache.py): a pure LRU bounded by entries and bytes,
driven by hypothesis against a plain list model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from toolwire.actors.result_cache import (
    RESULT_OVERHEAD_BYTES,
    VALUE_OVERHEAD_BYTES,
    ResultCache,
    result_size,
)
from toolwire.actors.results import Outcome, Result

KEYS = st.tuples(st.sampled_from(["", "chat"]), st.sampled_from(["a", "b", "c", "d", "e", "f"]))


def make_result(text: str = "", output: str = "", data: dict[str, object] | None = None) -> Result:
    return Result(
        tool="read_file",
        outcome=Outcome.COMPLETED,
        text=text,
        data=data,
        output=output,
        output_bytes=len(output),
        truncated_bytes=0,
        timed_out=False,
        canceled=False,
        started_at=1,
        finished_at=2,
        wall_ms=1,
    )


RESULTS = st.builds(
    make_result,
    text=st.text(max_size=40),
    output=st.text(max_size=300),
    data=st.none()
    | st.dictionaries(
        st.text(max_size=8),
        st.text(max_size=200) | st.integers() | st.lists(st.text(max_size=20), max_size=4),
        max_size=3,
    ),
)


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        max_entries=st.integers(min_value=0, max_value=4),
        max_bytes=st.integers(min_value=0, max_value=3000),
    )
    def setup(self, max_entries: int, max_bytes: int) -> None:
        self.cache = ResultCache(max_entries, max_bytes)
        self.max_entries, self.max_bytes = max_entries, max_bytes
        # Oldest first: (key, result, size).
        self.model: list[tuple[tuple[str, str], Result, int]] = []

    def _drop(self, key: tuple[str, str]) -> None:
        self.model = [entry for entry in self.model if entry[0] != key]

    @rule(key=KEYS, result=RESULTS)
    def put(self, key: tuple[str, str], result: Result) -> None:
        self.cache.put(key, result)
        self._drop(key)
        size = result_size(result)
        if size > self.max_bytes or self.max_entries == 0:
            return
        self.model.append((key, result, size))
        while len(self.model) > self.max_entries or sum(e[2] for e in self.model) > self.max_bytes:
            self.model.pop(0)  # the least recently used goes first

    @rule(key=KEYS)
    def get(self, key: tuple[str, str]) -> None:
        found = [entry for entry in self.model if entry[0] == key]
        got = self.cache.get(key)
        if not found:
            assert got is None
            return
        assert got is found[0][1]  # the very object put, never a copy or another key's
        self._drop(key)
        self.model.append(found[0])

    @rule(key=KEYS)
    def discard(self, key: tuple[str, str]) -> None:
        self.cache.discard(key)
        self._drop(key)

    @invariant()
    def matches_the_model(self) -> None:
        if not hasattr(self, "cache"):
            return
        assert len(self.cache) == len(self.model) <= self.max_entries
        assert self.cache.bytes == sum(e[2] for e in self.model) <= self.max_bytes
        for key, _, _ in self.model:
            assert key in self.cache


CacheMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestResultCache = CacheMachine.TestCase


@given(RESULTS)
def test_the_size_estimate_counts_every_string_a_result_holds(result: Result) -> None:
    size = result_size(result)
    assert size >= RESULT_OVERHEAD_BYTES + len(result.text) + len(result.output)
    if result.data is not None:
        strings = sum(len(k) for k in result.data) + sum(
            len(v) if isinstance(v, str) else sum(map(len, v)) if isinstance(v, list) else 0
            for v in result.data.values()
        )
        assert size >= RESULT_OVERHEAD_BYTES + len(result.output) + strings
        assert size >= RESULT_OVERHEAD_BYTES + VALUE_OVERHEAD_BYTES * (1 + 2 * len(result.data))


def test_a_result_larger_than_the_byte_bound_is_not_kept_and_evicts_nothing() -> None:
    cache = ResultCache(max_entries=8, max_bytes=2000)
    small = make_result(output="x" * 100)
    cache.put(("c", "small"), small)
    cache.put(("c", "huge"), make_result(output="y" * 5000))
    assert cache.get(("c", "huge")) is None
    assert cache.get(("c", "small")) is small
    # Replacing a key drops its old entry first: never two sizes for one key.
    cache.put(("c", "small"), make_result(output="z" * 5000))
    assert cache.get(("c", "small")) is None and cache.bytes == 0 and len(cache) == 0
