"""The pure counters behind /metrics (actors/metrics.py) and the Origin rule (9.8)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolwire.actors.metrics import COMMIT_BUCKETS_S, ERROR_CODES, CallCounters, Durations
from toolwire.actors.results import Outcome
from toolwire.actors.tools.registry import TOOL_NAMES
from toolwire.transport.access_control import refused_origin

durations = st.lists(st.floats(min_value=0, max_value=60, allow_nan=False), max_size=200)


@given(durations)
def test_histogram_buckets_count_each_observation_at_or_below_their_bound(xs: list[float]) -> None:
    histogram = Durations()
    for x in xs:
        histogram.observe(x)
    cumulative = histogram.cumulative()
    assert [bound for bound, _ in cumulative] == [*COMMIT_BUCKETS_S, math.inf]
    for bound, n in cumulative:
        assert n == sum(1 for x in xs if x <= bound)
    assert histogram.count == len(xs)
    assert histogram.sum == pytest.approx(sum(xs))


def test_histogram_bounds_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascending"):
        Durations((0.1, 0.01))
    with pytest.raises(ValueError, match="ascending"):
        Durations(())


@given(st.lists(st.tuples(st.sampled_from([*TOOL_NAMES, "x"]), st.sampled_from(list(Outcome)))))
def test_every_ended_call_is_counted_once_under_its_tool_and_outcome(
    ended: list[tuple[str, Outcome]],
) -> None:
    counters = CallCounters(TOOL_NAMES)
    for tool, outcome in ended:
        counters.call_ended(tool, outcome)
    for tool in {*TOOL_NAMES, *(t for t, _ in ended)}:
        for outcome in Outcome:
            assert counters.calls[tool][outcome] == ended.count((tool, outcome))


def test_every_known_tool_outcome_and_error_code_is_a_series_from_the_start() -> None:
    counters = CallCounters(TOOL_NAMES)
    assert set(counters.calls) == set(TOOL_NAMES)
    assert all(set(row) == set(Outcome) for row in counters.calls.values())
    assert set(counters.errors) == set(ERROR_CODES)
    counters.error_sent("conflict")
    assert counters.errors["conflict"] == 1


def test_an_origin_is_refused_unless_named_exactly() -> None:
    allowed = frozenset({"https://ide.example.com"})
    assert refused_origin([], allowed) is None
    assert refused_origin([(b"Origin", b"https://ide.example.com")], allowed) is None
    for other in (b"https://IDE.example.com", b"https://ide.example.com:443", b"null", b""):
        assert refused_origin([(b"origin", other)], allowed) == other.decode()
    # Two Origin headers: each must be allowed.
    both = [(b"origin", b"https://ide.example.com"), (b"origin", b"https://evil.example")]
    assert refused_origin(both, allowed) == "https://evil.example"
