"""`python -m toolwire.benchmarks.call_cost`: a trivial call's cost counted in a real agent
server, by component. Counts, not times, so the test checks they are there and plausible,
never how fast anything was."""

from __future__ import annotations

import pstats
from pathlib import Path

from toolwire.benchmarks.call_cost import Bench, Cost, breakdown, component_of, table
from toolwire.benchmarks.core import TREE


def test_the_tracer_counts_each_component_of_a_trivial_call(tmp_path: Path) -> None:
    counts = Bench(tmp_path).opcodes(TREE, "memory", 20)
    per_component: dict[str, int] = {}
    for key, (_entries, ran) in counts.items():
        path, _, rest = key.rpartition(":")
        name = rest.partition("(")[2][:-1]
        component = component_of(path, name)
        per_component[component] = per_component.get(component, 0) + ran
    # Every call was read, decoded, admitted, run and answered: each stage ran bytecodes.
    for component in ("receive", "decode and bounds", "admission", "the tool (read_file)",
                      "followers and outbox", "encode", "send"):  # fmt: skip
        assert per_component.get(component, 0) >= 20, (component, per_component)


def test_the_profile_covers_only_the_calls_and_splits_c_functions_by_caller(
    tmp_path: Path,
) -> None:
    stats: pstats.Stats = Bench(tmp_path).profile(TREE, "memory", 50)
    total, shares, top = breakdown(stats)
    assert total > 0 and abs(sum(shares.values()) - 1.0) < 1e-9
    assert "admission" in shares and "the tool (read_file)" in shares
    assert "(by callers)" not in shares  # C functions went to their callers' components
    # The imports and start-up before `start` are not in it.
    assert not any("importlib" in name for name, _ in top)
    cost = Cost("tree", "memory", profile_calls=50, profile_s=total, shares=shares)
    assert "| admission (bytecodes / cProfile share) |" in table([cost])
