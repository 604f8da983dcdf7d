"""The benchmark suite's vocabulary: measurements, comparisons with goals, scenario results, and
the context every scenario gets.

A scenario measures several variants (toolwire and its baselines) side by side: every repeat
runs every variant once, in a rotated order, so the noise of this shared machine lands on all of
them alike. A variant's number is the median over repeats (throughputs) or the p50 of the pooled
samples (latencies); min-max over repeats and p99 travel with it, and a comparison divides the
toolwire number by the baseline number (also per repeat, for the ratio's own min-max).

With `toolwire bench --against REF` (`benchmarks/against.py`) a second build takes part: REF's
agent, from a virtualenv of its own. A variant marked `agent(...)` then runs once per build in
the same rotation; while it runs for REF, `current_build()` is REF, the scenario's `Servers`
hand out REF's agent servers, and everything it records goes to each measurement's REF twin
(`<name>@ref`). Each measurement that has a twin gets rows of its own: the working tree / REF.
"""

from __future__ import annotations

import contextvars
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

GoalKind = Literal["ratio>=", "ratio<=", "value<", "value>=", "true"]
# "max" is the worst repeat's value (for a measurement whose value per repeat is that repeat's
# worst, as a loop lag); "worst" is the worst pooled sample (a latency's worst case: its value per
# repeat is a median, so "max" would be the worst median).
Stat = Literal["median", "p50", "p99", "max", "worst"]


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


@dataclass(frozen=True)
class Build:
    """Whose agent a variant runs: the working tree's (`key` "tree") or REF's ("ref").

    `python` is an interpreter whose `toolwire` package is that build; `env` the environment
    its processes get (REF's must not see this checkout on its import path); `server_flags` the
    flags REF's benchmark server takes (None for the working tree: all of them);
    `benchmarks_package` where REF keeps its benchmark modules."""

    key: str
    label: str
    python: str
    env: dict[str, str] | None = field(default=None, repr=False)
    commit: str | None = None
    server_flags: frozenset[str] | None = None
    benchmarks_package: str = "toolwire.benchmarks"

    @property
    def is_ref(self) -> bool:
        return self.key == "ref"

    def module(self, name: str) -> str:
        """The importable name of benchmark module `name` (e.g. "toolwire_server") in this
        build."""
        return f"{self.benchmarks_package}.{name}"


TREE = Build("tree", "working tree", sys.executable)
REF_SUFFIX = "@ref"
_current_build: contextvars.ContextVar[Build] = contextvars.ContextVar("build", default=TREE)


def current_build() -> Build:
    """The build whose agent the variant running now measures (the working tree's outside
    `run_side_by_side`)."""
    return _current_build.get()


@contextmanager
def running_for(build: Build) -> Iterator[None]:
    token = _current_build.set(build)
    try:
        yield
    finally:
        _current_build.reset(token)


class RefUnavailable(RuntimeError):
    """REF's agent cannot run this variant (its server lacks a flag the variant needs): the
    variant's REF side is skipped and the reason becomes a note of the scenario."""


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
    # The statistics of its `--against` rows, where not the default (p50 and p99 of samples,
    # else the median): "max" for a measurement whose value per repeat is that repeat's worst.
    against_stats: tuple[Stat, ...] = ()
    # The same variant run on REF's agent (`--against`), made on its first use.
    ref_twin: Measurement | None = field(default=None, repr=False)

    def _sink(self) -> Measurement:
        """Where a value recorded now goes: this measurement, or its REF twin while a variant
        runs for REF."""
        if not current_build().is_ref:
            return self
        if self.ref_twin is None:
            self.ref_twin = Measurement(
                self.name + REF_SUFFIX,
                f"{self.label} [REF]",
                self.unit,
                higher_is_better=self.higher_is_better,
                against_stats=self.against_stats,
            )
        return self.ref_twin

    def add(self, value: float, **extra: float) -> None:
        sink = self._sink()
        sink.values.append(value)
        for key, number in extra.items():
            sink.extra.setdefault(key, []).append(number)

    def add_samples(self, samples: Sequence[float]) -> None:
        """Pool latency samples of one repeat (see `add` for its value)."""
        self._sink().samples.extend(samples)

    def add_note(self, text: str) -> None:
        """A note of the current repeat (on the REF twin while a variant runs for REF)."""
        self._sink().notes.append(text)

    def add_extra(self, key: str, number: float) -> None:
        """One more side number of the current repeat, recorded apart from `add`."""
        self._sink().extra.setdefault(key, []).append(number)

    def stat(self, which: Stat = "median") -> float:
        if which == "median":
            return statistics.median(self.values) if self.values else math.nan
        if which == "max":
            return max(self.values) if self.values else math.nan
        pooled = self.samples or self.values
        if which == "worst":
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
    # Why the scenario measured nothing (a baseline it needs is not installed): its one line.
    skipped: str | None = None

    def measurement(
        self, name: str, label: str, unit: str, *, higher_is_better: bool = True
    ) -> Measurement:
        m = Measurement(name, label, unit, higher_is_better=higher_is_better)
        self.measurements[name] = m
        return m

    def as_dict(self) -> dict[str, Any]:
        measurements = dict(self.measurements)
        against: list[Comparison] = []
        for m in self.measurements.values():
            twin = m.ref_twin
            if twin is None or not twin.values:
                continue
            measurements[twin.name] = twin
            against += against_rows(m, twin)
        skipped = {"skipped": self.skipped} if self.skipped is not None else {}
        return {
            **skipped,
            "params": self.params,
            "measurements": {name: m.summary() for name, m in measurements.items()},
            "comparisons": [c.evaluate(measurements) for c in self.comparisons],
            "against": [c.evaluate(measurements) for c in against],
            "notes": self.notes,
        }


def against_rows(m: Measurement, twin: Measurement) -> list[Comparison]:
    """The rows of `--against`: a measurement on the working tree / the same on REF, for the
    statistic its scenario shows (p50 and p99 of a latency, the median of a rate)."""
    stats: tuple[Stat, ...] = ("p50", "p99") if m.samples and twin.samples else ("median",)
    if m.against_stats:
        stats = m.against_stats
    return [
        Comparison(f"{m.label} ({stat}): working tree vs REF", m.name, twin.name, stat=stat)
        for stat in stats
    ]


@dataclass
class BenchContext:
    """What a scenario gets: the size mode, a scratch directory, and a way to report progress."""

    quick: bool
    workdir: Path
    report: Callable[[str], None] = lambda _text: None
    python: str = sys.executable
    against: Build | None = None  # REF's agent, run beside the working tree's (`--against`)
    codex: str | None = None  # the Codex binary of the `peers` scenario (`--codex`)
    notes: list[str] = field(default_factory=list)  # why REF's side of a variant was skipped

    @property
    def builds(self) -> list[Build]:
        """The builds whose agents an `agent` variant runs on."""
        return [TREE] if self.against is None else [TREE, self.against]

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


Variant = Callable[[int], None]


@dataclass(frozen=True)
class AgentVariant:
    """A variant that measures a toolwire agent: with `--against` it runs once per build."""

    run: Variant


def agent(variant: Variant) -> AgentVariant:
    """Mark `variant` as measuring toolwire's agent (servers of `servers(...)` it looks up
    inside itself, by name): with `--against` it runs on REF's agent too, in the same
    rotation, recording into the measurements' REF twins."""
    return AgentVariant(variant)


def run_side_by_side(
    ctx: BenchContext,
    scenario: str,
    variants: Sequence[Variant | AgentVariant],
    repeats: int,
) -> None:
    """Run every variant once per repeat, `variant(repeat)`, in an order rotated each repeat:
    toolwire and its baselines meet the same machine load, and none always goes first. An
    `agent` variant is run once per build (`ctx.builds`), the REF run right after the working
    tree's in the rotation, so each pair meets the same load."""
    runs: list[tuple[Variant, Build]] = []
    for variant in variants:
        if isinstance(variant, AgentVariant):
            runs += [(variant.run, build) for build in ctx.builds]
        else:
            runs.append((variant, TREE))
    for r in range(repeats):
        for variant, build in rotated(runs, r):
            ctx.report(f"{scenario}: repeat {r + 1}/{repeats}" + (" (REF)" if build.is_ref else ""))
            with running_for(build):
                try:
                    variant(r)
                except RefUnavailable as exc:
                    if not build.is_ref:
                        raise
                    if str(exc) not in ctx.notes:
                        ctx.notes.append(str(exc))
