"""What the agent counts for its operators (PROTOCOL.md 9.7). Pure: no trio, no I/O.

The runtime bumps plain ints here on its hot paths: one dict lookup and one integer add per
ended call, no lock (trio runs one task at a time, and nothing here is touched from a worker
thread) and no object built per call. The transport turns these numbers into the Prometheus
exposition only when `/metrics` is scraped (`transport/metrics.py`); gauges such as running
calls or parked gates are not counted at all but read from the agent's tables at scrape time.

Label values come from fixed sets (the tool registry, the seven outcomes, the error codes of
PROTOCOL.md 6), never from a chat or call id, so the number of series stays small and fixed.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from toolwire.actors.results import Outcome

# The error codes of PROTOCOL.md 6 (and 9.6's chat_closed): each is a series from the start, so
# a rate over them works before the first error.
ERROR_CODES = (
    "bad_message",
    "unknown_tool",
    "bad_args",
    "conflict",
    "unknown_call",
    "not_parked",
    "over_limit",
    "internal",
    "chat_closed",
)

# Upper bounds (seconds) of the journal commit histogram: a group commit is one transaction and
# one fsync, from a fraction of a millisecond on a local SSD to seconds on a stalled disk.
COMMIT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Durations:
    """A histogram of durations: a count per bucket (not cumulative), their sum and count.

    Observed once per journal commit (a group of many calls), from the trio thread."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = COMMIT_BUCKETS_S) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bucket bounds must be distinct and ascending, not {bounds!r}")
        self.bounds = tuple(bounds)
        # One more than the bounds: the last slot counts what exceeds every bound (+Inf).
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        # bisect_left: a duration equal to a bound belongs to that bucket (le, "less or equal").
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= bound) per bucket, ending with (inf, count)."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class CallCounters:
    """The agent's counters. One per agent (`AgentContext.metrics`); None turns counting off."""

    __slots__ = ("calls", "errors", "output_bytes")

    def __init__(self, tools: Iterable[str] = ()) -> None:
        # tool -> outcome -> calls ended so; every known tool and outcome is a series at once.
        self.calls: dict[str, dict[str, int]] = {tool: dict.fromkeys(Outcome, 0) for tool in tools}
        self.errors: dict[str, int] = dict.fromkeys(ERROR_CODES, 0)
        # Bytes the commands of `execute` calls wrote, counted once a process's output closed
        # (the transport adds what still-open processes wrote so far at scrape time).
        self.output_bytes = 0

    def call_ended(self, tool: str, outcome: str) -> None:
        """A call's one result was saved and published (once per call)."""
        row = self.calls.get(tool)
        if row is None:  # a tool outside the registry: still counted, in a series of its own
            row = self.calls[tool] = dict.fromkeys(Outcome, 0)
        row[outcome] = row.get(outcome, 0) + 1

    def error_sent(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
