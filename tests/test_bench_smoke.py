"""`toolwire bench --quick` end to end, so the suite does not rot. Benchmarks are not tests: the
numbers are checked for being there and being numbers, never for how fast anything was."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from toolwire.benchmarks import against, codex_peer, plots
from toolwire.benchmarks.core import (
    TREE,
    Build,
    Comparison,
    Goal,
    Measurement,
    RefUnavailable,
    percentile,
    running_for,
)
from toolwire.benchmarks.runner import SCENARIOS
from toolwire.benchmarks.scenarios.scale import max_overlap
from toolwire.cli.main import main


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def test_bench_quick_reports_every_scenario_with_numbers(tmp_path: Path) -> None:
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 0

    [json_file] = tmp_path.glob("bench-*.json")
    doc = json.loads(json_file.read_text())
    assert doc["quick"] is True
    machine = doc["machine"]
    assert machine["cores"] >= 1 and machine["python"]
    assert set(machine["packages"]) >= {"trio", "trio-websocket", "msgspec"}

    assert set(doc["scenarios"]) == set(SCENARIOS)
    skipped = set()
    for name, scenario in doc["scenarios"].items():
        assert "error" not in scenario, (name, scenario.get("error"))
        if scenario.get("skipped"):
            # Only the peer baseline may be missing (CI does not install Codex), and the line
            # says how to give it.
            assert name == "peers" and "--codex PATH" in scenario["skipped"], (name, scenario)
            skipped.add(name)
            continue
        assert scenario["measurements"], name
        for key, m in scenario["measurements"].items():
            assert m["repeats"] and all(_number(v) for v in m["repeats"]), (name, key)
            assert _number(m["median"]), (name, key)
            if "p50" in m:
                assert _number(m["p50"]) and _number(m["p99"]), (name, key)
        assert scenario["comparisons"], name
        for row in scenario["comparisons"]:
            assert _number(row["toolwire_value"]), (name, row["label"])
            if row["baseline"] is not None:
                assert _number(row["baseline_value"]) and _number(row["ratio"]), row["label"]
            if row["goal"] is not None:
                assert isinstance(row["met"], bool), row["label"]

    # The pty round trip is compared with a raw pty of the same terminal settings: a program
    # on toolwire's terminal sees exactly the termios of the baseline's (`stty -g` on both).
    termios = doc["scenarios"]["interactive"]["params"]["termios"]
    assert termios["toolwire"] and termios["toolwire"] == termios["raw pty"], termios

    # The abuse scenario: per attack, the other chat's worst call against the 100 ms goal, its
    # p99, the attack's answer time and the agent's peak RSS; every run bounded.
    abuse = doc["scenarios"]["abuse"]
    for attack in ("redos", "cancel", "flood", "big"):
        rows = [r for r in abuse["comparisons"] if r["toolwire"] == f"toolwire_during_{attack}"]
        assert [r["stat"] for r in rows] == ["worst", "p99"], (attack, rows)
        assert rows[0]["goal"] == "< 100 ms" and rows[0]["baseline"] == "trivial_alone"
        answered = abuse["measurements"][f"toolwire_answered_{attack}"]
        assert all(v <= abuse["params"]["bound_s"] * 1000 for v in answered["repeats"])
        assert abuse["measurements"][f"toolwire_rss_{attack}_mb"]["median"] > 0
        # And the agent's loop lag over the attack, read from the agent itself (it answered).
        lag = [r for r in abuse["comparisons"] if r["toolwire"] == f"loop_lag_worst_{attack}"]
        assert [(r["stat"], r["goal"]) for r in lag] == [("max", "< 100 ms")], (attack, lag)
        worst = abuse["measurements"][f"loop_lag_worst_{attack}"]
        assert all(0 <= v < abuse["params"]["bound_s"] * 1000 for v in worst["repeats"]), worst
        assert abuse["measurements"][f"loop_lag_p99_{attack}"]["repeats"], attack

    # The keeper's rows (PROTOCOL.md 10.1): a restarted agent's first re-adopted output with 1
    # and N commands running, and the keeper's memory per command held.
    keeper = doc["scenarios"]["keeper"]
    many = max(keeper["params"]["commands"])
    assert {"restart_output_n1", f"restart_output_n{many}", "keeper_bytes_per_process"} <= set(
        keeper["measurements"]
    )
    assert keeper["measurements"]["keeper_rss_idle"]["median"] > 0

    # The outside client's row: serve's defaults driven by a client that parses JSON with the
    # standard library, against the same echo.
    transport = doc["scenarios"]["transport"]
    rows = {row["toolwire"]: row for row in transport["comparisons"]}
    assert rows["toolwire_pipelined_stdlib_json"]["baseline"] == "echo_pipelined"

    [md_file] = tmp_path.glob("bench-*.md")
    text = md_file.read_text()
    assert "| scenario | comparison | toolwire | baseline | ratio | goal | met? |" in text
    for name in SCENARIOS:
        assert f"### {name}" in text
    if plots.matplotlib_missing() is None:
        # With the `bench` extra (CI installs it) every scenario's plot must be made.
        assert doc.get("plots_skipped") is None, doc.get("plots_skipped")
        assert len(list(tmp_path.glob("bench-*.png"))) == len(SCENARIOS) - len(skipped)


def test_bench_rejects_an_unknown_scenario(tmp_path: Path) -> None:
    assert main(["bench", "--quick", "--out", str(tmp_path), "--only", "nope"]) == 2
    assert not list(tmp_path.glob("bench-*.json"))


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([0.0, 10.0], 99) == 9.9
    assert math.isnan(percentile([], 50))


def test_comparison_ratio_goal_and_per_repeat_spread() -> None:
    tw = Measurement("tw", "toolwire", "calls/s", values=[10.0, 20.0, 30.0])
    base = Measurement("base", "baseline", "calls/s", values=[20.0, 20.0, 20.0])
    row = Comparison("x", "tw", "base", goal=Goal("ratio>=", 0.5, ">= 0.5x")).evaluate(
        {"tw": tw, "base": base}
    )
    assert row["ratio"] == 1.0 and row["met"] is True
    assert (row["ratio_min"], row["ratio_max"]) == (0.5, 1.5)


def test_a_latencys_worst_is_its_worst_sample_not_its_worst_median() -> None:
    """The abuse goal is on the worst call: a repeat's value is its median, so "max" (the worst
    repeat, right for a loop lag whose value per repeat is a worst) would hide a 590 ms call."""
    calls = Measurement("calls", "trivial calls", "ms")
    calls.add(2.0)
    calls.add_samples([1.0, 2.0, 590.0])
    calls.add(3.0)
    calls.add_samples([3.0, 3.0, 4.0])
    assert calls.stat("max") == 3.0
    assert calls.stat("worst") == 590.0
    row = Comparison("x", "calls", None, stat="worst", goal=Goal("value<", 100, "< 100 ms"))
    assert row.evaluate({"calls": calls})["met"] is False


def test_max_overlap_counts_intervals_open_at_once() -> None:
    assert max_overlap([]) == 0
    assert max_overlap([(0, 10), (5, 15), (9, 20)]) == 3
    assert max_overlap([(0, 5), (5, 10)]) == 1  # an end closes before a start at the same time


def test_bench_against_a_ref_runs_its_agent_beside_and_reports_ratio_rows(tmp_path: Path) -> None:
    """`--against HEAD`: HEAD built into a virtualenv of its own (cached by commit in the
    user's build cache, shared with real runs: the first build takes about 40 s, later runs
    reuse it), its agents run beside the working tree's, and every toolwire measurement gets a
    twin and `working tree vs REF` rows with numbers."""
    head = against.resolve("HEAD")
    assert main(["bench", "--quick", "--only", "transport", "--against", "HEAD",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    [json_file] = tmp_path.glob("bench-*.json")
    doc = json.loads(json_file.read_text())
    assert doc["against"]["commit"] == head
    assert Path(doc["against"]["python"]).is_relative_to(against.default_cache_dir() / head)
    scenario = doc["scenarios"]["transport"]
    assert "error" not in scenario, scenario.get("error")
    measurements = scenario["measurements"]
    assert {"toolwire_pipelined@ref", "toolwire_single@ref"} <= set(measurements)
    assert "echo_pipelined@ref" not in measurements  # baselines run once, the tree's
    rows = scenario["against"]
    assert {row["toolwire"] for row in rows} >= {"toolwire_pipelined", "toolwire_single"}
    for row in rows:
        assert row["baseline"] == row["toolwire"] + "@ref"
        assert _number(row["ratio"]), row
    assert "working tree vs REF" in next(tmp_path.glob("bench-*.md")).read_text()


def test_bench_against_an_unknown_ref_says_so_and_runs_nothing(tmp_path: Path) -> None:
    assert main(["bench", "--quick", "--only", "transport", "--against", "no-such-ref-x",
                 "--out", str(tmp_path)]) == 2  # fmt: skip
    assert not list(tmp_path.glob("bench-*.json"))
    with pytest.raises(against.BuildError, match=r"no-such-ref-x.*names no commit"):
        against.resolve("no-such-ref-x")


def test_a_flag_a_ref_server_lacks_is_shimmed_or_named() -> None:
    old = Build("ref", "old", "python", server_flags=frozenset({"--workspace", "--token"}))
    args = ["--workspace=/w", "--journal=memory", "--sync=full", "--token=t"]
    assert against.server_args(old, args, "toolwire-memory") == ["--workspace=/w", "--token=t"]
    with pytest.raises(RefUnavailable, match="has no --skip-commits"):
        against.server_args(old, ["--workspace=/w", "--skip-commits"], "toolwire-skipcommits")
    with pytest.raises(RefUnavailable, match="has no --sync"):
        against.server_args(old, ["--sync=normal"], "toolwire-normal")
    assert against.server_args(TREE, args, "toolwire") == args


def test_bench_help_names_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    """`--only` is only usable if its help names what it accepts."""
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for name in SCENARIOS:
        assert name in help_text, name


def test_the_peers_scenario_without_codex_says_skipped_and_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(codex_peer.CODEX_ENV, raising=False)
    assert main(["bench", "--quick", "--only", "peers", "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "peers: skipped: no Codex app-server: pass --codex PATH or set TOOLWIRE_BENCH_CODEX" in out
    )
    [md_file] = tmp_path.glob("bench-*.md")
    assert "skipped: no Codex app-server" in md_file.read_text()


def test_a_codex_path_that_is_no_executable_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "codex"
    assert codex_peer.find_codex(str(missing)) == (
        None, f"no Codex app-server: {str(missing)!r} is not an executable file"
    )  # fmt: skip
    missing.write_text("#!/bin/sh\n")
    assert codex_peer.find_codex(str(missing))[0] is None  # not executable
    missing.chmod(0o755)
    assert codex_peer.find_codex(str(missing)) == (str(missing), "")


def test_what_a_ref_run_records_goes_to_its_twin_side_numbers_included() -> None:
    """The abuse scenario once wrote its per-repeat worst straight into the working tree's
    measurement, so the tree's "worst" column mixed in REF's (907 ms shown for 243 ms)."""
    m = Measurement("x", "x", "ms")
    with running_for(Build("ref", "REF", "python")):
        m.add(5.0, worst_ms=50.0)
        m.add_extra("unanswered", 1.0)
    m.add(1.0, worst_ms=10.0)
    m.add_extra("unanswered", 0.0)
    assert m.values == [1.0] and m.extra == {"worst_ms": [10.0], "unanswered": [0.0]}
    assert m.ref_twin is not None and m.ref_twin.values == [5.0]
    assert m.ref_twin.extra == {"worst_ms": [50.0], "unanswered": [1.0]}
    scenarios = Path(__file__).parent.parent / "benchmarks" / "scenarios"
    for module in scenarios.glob("*.py"):  # a scenario records through add/add_extra only
        assert ".extra.setdefault" not in module.read_text(), module.name
