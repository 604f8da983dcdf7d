"""The benchmark suite's vocabulary: measurements, comparisons with goals, scenario results, and
the context every scenario gets.

A scenario measures several variants (toolwire and its baselines) side by side: every repeat
runs every variant once, in a rotated order, so the noise of this shared machine lands on all of
them alike. A variant's number is the median over repeats (throughputs) or the p50 of the pooled
samples (latencies); min-max over repeats and p99 travel with it, and a comparison divides the
toolwire number by the baseline number (also per repeat, for the ratio's own min-max).
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

GoalKind = Literal["ratio>=", "ratio<=", "value<", "value>=", "true"]
Stat = Literal["median", "p50", "p99", "max"]


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Measurement:
    """One variant of a scenario: a value per repeat, and for latencies the pooled samples."""

    name: str
    label: str
    unit: str
    higher_is_better: bool = True
    values: list[float] = field(default_factory=list)  # one per repeat
    samples: list[float] = field(default_factory=list)  # latency samples of every repeat
    extra: dict[str, list[float]] = field(default_factory=dict)  # side numbers, per repeat
    notes: list[str] = field(default_factory=list)

    def add(self, value: float, **extra: float) -> None:
        self.values.append(value)
        for key, number in extra.items():
            self.extra.setdefault(key, []).append(number)

    def stat(self, which: Stat = "median") -> float:
        if which == "median":
            return statistics.median(self.values) if self.values else math.nan
        pooled = self.samples or self.values
        if which == "max":  # the worst sample of every repeat (a latency's worst case)
            return max(pooled) if pooled else math.nan
        return percentile(pooled, 50 if which == "p50" else 99)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "repeats": self.values,
            "median": self.stat("median"),
            "min": min(self.values) if self.values else math.nan,
            "max": max(self.values) if self.values else math.nan,
        }
        if self.samples:
            out["samples"] = len(self.samples)
            out["p50"] = self.stat("p50")
            out["p99"] = self.stat("p99")
            out["sample_min"] = min(self.samples)
            out["sample_max"] = max(self.samples)
            out["sample_values"] = [round(x, 3) for x in self.samples]
        if self.extra:
            out["extra"] = {
                key: {"repeats": vals, "median": statistics.median(vals)}
                for key, vals in self.extra.items()
                if vals
            }
        if self.notes:
            out["notes"] = self.notes
        return out


@dataclass(frozen=True)
class Goal:
    """What the issue asks for. `ratio>=`: toolwire / baseline >= threshold; `value<`: the
    toolwire number (its `stat`) below threshold; `true`: the toolwire number is 1 (a check)."""

    kind: GoalKind
    threshold: float
    text: str


@dataclass
class Comparison:
    """One row of the summary table: a toolwire variant against a baseline variant."""

    label: str
    toolwire: str  # measurement name
    baseline: str | None  # measurement name (None: an absolute goal, nothing to divide by)
    stat: Stat = "median"
    goal: Goal | None = None

    def evaluate(self, measurements: dict[str, Measurement]) -> dict[str, Any]:
        tw = measurements[self.toolwire]
        tw_value = tw.stat(self.stat)
        row: dict[str, Any] = {
            "label": self.label,
            "toolwire": self.toolwire,
            "toolwire_value": tw_value,
            "unit": tw.unit,
            "stat": self.stat,
            "baseline": self.baseline,
            "baseline_value": None,
            "ratio": None,
            "ratio_min": None,
            "ratio_max": None,
            "goal": self.goal.text if self.goal else None,
            "met": None,
        }
        if self.baseline is not None:
            base = measurements[self.baseline]
            base_value = base.stat(self.stat)
            row["baseline_value"] = base_value
            row["ratio"] = _div(tw_value, base_value)
            if self.stat == "median" and len(tw.values) == len(base.values) and tw.values:
                paired = [_div(a, b) for a, b in zip(tw.values, base.values, strict=True)]
                row["ratio_min"] = min(paired)
                row["ratio_max"] = max(paired)
        if self.goal is not None:
            row["met"] = _met(self.goal, tw_value, row["ratio"])
        return row


def _div(a: float, b: float) -> float:
    return a / b if b else math.nan


def _met(goal: Goal, value: float, ratio: float | None) -> bool:
    if goal.kind == "ratio>=":
        return ratio is not None and ratio >= goal.threshold
    if goal.kind == "ratio<=":
        return ratio is not None and ratio <= goal.threshold
    if goal.kind == "value<":
        return value < goal.threshold
    if goal.kind == "value>=":
        return value >= goal.threshold
    return value == 1


@dataclass
class ScenarioResult:
    measurements: dict[str, Measurement] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def measurement(
        self, name: str, label: str, unit: str, *, higher_is_better: bool = True
    ) -> Measurement:
        m = Measurement(name, label, unit, higher_is_better=higher_is_better)
        self.measurements[name] = m
        return m

    def as_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "measurements": {name: m.summary() for name, m in self.measurements.items()},
            "comparisons": [c.evaluate(self.measurements) for c in self.comparisons],
            "notes": self.notes,
        }


@dataclass
class BenchContext:
    """What a scenario gets: the size mode, a scratch directory, and a way to report progress."""

    quick: bool
    workdir: Path
    report: Callable[[str], None] = lambda _text: None
    python: str = sys.executable

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def seconds(self, full: float, quick: float) -> float:
        return quick if self.quick else full

    def repeats(self, full: int = 5) -> int:
        return 2 if self.quick else full

    def scratch(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))


def rotated(items: Sequence[Any], by: int) -> list[Any]:
    """`items` starting at index `by` (mod len): each repeat runs the variants in a new order."""
    if not items:
        return []
    k = by % len(items)
    return [*items[k:], *items[:k]]


def run_side_by_side(
    ctx: BenchContext, scenario: str, variants: Sequence[Callable[[int], None]], repeats: int
) -> None:
    """Run every variant once per repeat, `variant(repeat)`, in an order rotated each repeat:
    toolwire and its baselines meet the same machine load, and none always goes first."""
    for r in range(repeats):
        for variant in rotated(variants, r):
            ctx.report(f"{scenario}: repeat {r + 1}/{repeats}")
            variant(r)
