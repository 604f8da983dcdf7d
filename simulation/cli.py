"""`toolwire sim`: run seeds in parallel processes, show progress and a summary, and print the
one command that replays each failing seed with its trace."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from toolwire.simulation.modes import MODES, run_mode_seeds, run_seed
from toolwire.simulation.planted import PLANTED
from toolwire.simulation.runner import SeedResult, chunks
from toolwire.simulation.scenario import SCENARIOS

SCENARIO_CHOICES = ("mix", *SCENARIOS)
_CODE = re.compile(r"\[([a-z]\.[a-z_]+)\]")


@dataclass
class Summary:
    scenario: str
    mode: str = "mix"
    seeds: int = 0
    wire: int = 0
    calls: int = 0
    requests: int = 0
    events: int = 0
    effects: int = 0
    virtual_s: float = 0.0
    elapsed_s: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    scenarios: Counter[str] = field(default_factory=Counter)
    modes: Counter[str] = field(default_factory=Counter)  # agent / wire / pure
    codes: Counter[str] = field(default_factory=Counter)
    failing: list[SeedResult] = field(default_factory=list)

    def add(self, result: SeedResult) -> None:
        self.seeds += 1
        self.wire += result.wire
        self.calls += result.calls
        self.requests += result.requests
        self.events += result.events
        self.effects += result.effects
        self.virtual_s += result.virtual_s
        self.faults.update(result.faults)
        self.scenarios[result.scenario] += 1
        self.modes[result.mode] += 1
        if result.violations:
            self.failing.append(result)
            for text in result.violations:
                match = _CODE.match(text)
                self.codes[match.group(1) if match else "?"] += 1

    @property
    def violations(self) -> int:
        return sum(self.codes.values())

    def as_json(self, jobs: int, plant: str | None) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "mode": self.mode,
            "plant": plant,
            "jobs": jobs,
            "seeds": self.seeds,
            "wire_seeds": self.wire,
            "modes": dict(sorted(self.modes.items())),
            "calls": self.calls,
            "requests": self.requests,
            "events": self.events,
            "side_effects": self.effects,
            "virtual_seconds": round(self.virtual_s, 3),
            "elapsed_seconds": round(self.elapsed_s, 3),
            "seeds_per_second": round(self.seeds / self.elapsed_s, 2) if self.elapsed_s else None,
            "faults": dict(sorted(self.faults.items())),
            "scenarios": dict(sorted(self.scenarios.items())),
            "violations": self.violations,
            "violations_by_code": dict(sorted(self.codes.items())),
            "failing_seeds": [
                {
                    "seed": r.seed,
                    "scenario": r.scenario,
                    "mode": r.mode,
                    "violations": r.violations[:10],
                    "replay": replay_command(r, plant),
                }
                for r in sorted(self.failing, key=lambda r: r.seed)
            ],
        }


def replay_command(result: SeedResult, plant: str | None) -> str:
    extra = f" --plant {plant}" if plant else ""
    return (
        f"toolwire sim --seed {result.seed} --scenario {result.scenario} --mode {result.mode} "
        f"--trace{extra}"
    )


def _pool(jobs: int) -> concurrent.futures.ProcessPoolExecutor:
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context(method)
    )


def run_sim(
    *,
    seeds: int | None,
    seed: int | None,
    scenario: str,
    jobs: int | None,
    trace: bool,
    json_path: Path | None,
    plant: str | None = None,
    mode: str = "mix",
) -> int:
    out = Console()
    err = Console(stderr=True)
    if plant is not None and plant not in PLANTED:
        err.print(f"toolwire sim: unknown --plant {plant!r}; one of {', '.join(PLANTED)}")
        return 2
    if scenario not in SCENARIO_CHOICES:
        err.print(
            f"toolwire sim: unknown scenario {scenario!r}; one of {', '.join(SCENARIO_CHOICES)}"
        )
        return 2
    if mode not in MODES:
        err.print(f"toolwire sim: unknown --mode {mode!r}; one of {', '.join(MODES)}")
        return 2
    start = seed if seed is not None else 0
    count = seeds if seeds is not None else (1 if seed is not None else 100)
    seed_list = list(range(start, start + count))
    jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
    jobs = min(jobs, max(1, len(seed_list)))
    summary = Summary(scenario, mode)

    if trace and len(seed_list) == 1:
        result = run_seed(seed_list[0], scenario, mode=mode, plant=plant, keep_trace=True)
        summary.add(result)
        summary.elapsed_s = result.wall_s
        assert result.trace is not None
        for line in result.trace:
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        out.print(f"trace digest {result.digest}", highlight=False)
        for violation in result.violations:
            out.print(violation, style="red", markup=False, highlight=False, soft_wrap=True)
        _report(out, summary, jobs, plant)
        _write_json(json_path, summary, jobs, plant)
        return 1 if summary.violations else 0

    started = time.perf_counter()
    progress = Progress(
        TextColumn("[bold]sim[/] {task.fields[scenario]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("seeds  [red]{task.fields[bad]} failing[/]  {task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )
    with progress:
        task = progress.add_task("sim", total=len(seed_list), scenario=scenario, bad=0, rate="")

        def done(results: list[SeedResult]) -> None:
            for result in results:
                summary.add(result)
            rate = summary.seeds / max(time.perf_counter() - started, 1e-9)
            progress.update(
                task, advance=len(results), bad=len(summary.failing), rate=f"{rate:.0f}/s"
            )

        if jobs == 1:
            for part in chunks(seed_list, 10):
                done(run_mode_seeds(part, scenario, plant, mode))
        else:
            size = max(4, min(50, len(seed_list) // (jobs * 8) or 1))
            with _pool(jobs) as pool:
                futures = [
                    pool.submit(run_mode_seeds, part, scenario, plant, mode)
                    for part in chunks(seed_list, size)
                ]
                try:
                    for future in concurrent.futures.as_completed(futures):
                        done(future.result())
                except KeyboardInterrupt:
                    for future in futures:
                        future.cancel()
                    raise
    summary.elapsed_s = time.perf_counter() - started
    if trace:
        for result in sorted(summary.failing, key=lambda r: r.seed)[:3]:
            replayed = run_seed(
                result.seed, result.scenario, mode=result.mode, plant=plant, keep_trace=True
            )
            out.rule(f"seed {result.seed} ({result.scenario}, {result.mode})")
            for line in replayed.trace or []:
                out.print(line, markup=False, highlight=False, soft_wrap=True)
    _report(out, summary, jobs, plant)
    _write_json(json_path, summary, jobs, plant)
    return 1 if summary.violations else 0


def _write_json(path: Path | None, summary: Summary, jobs: int, plant: str | None) -> None:
    if path is not None:
        path.write_text(json.dumps(summary.as_json(jobs, plant), indent=2) + "\n")


def _report(out: Console, summary: Summary, jobs: int, plant: str | None) -> None:
    rate = summary.seeds / summary.elapsed_s if summary.elapsed_s else 0.0
    table = Table(title="toolwire sim" + (f" (planted bug: {plant})" if plant else ""))
    table.add_column("", style="bold")
    table.add_column("value", justify="right")
    table.add_row("scenario", summary.scenario)
    table.add_row("mode", summary.mode)
    table.add_row("seeds", f"{summary.seeds:,}")
    for name, n in sorted(summary.scenarios.items()):
        table.add_row(f"  {name}", f"{n:,}")
    table.add_row("  through the server", f"{summary.wire:,}")
    table.add_row("  through the real agent", f"{summary.modes.get('agent', 0):,}")
    table.add_row("  pure ChatState", f"{summary.modes.get('pure', 0):,}")
    table.add_row("tool calls", f"{summary.calls:,}")
    table.add_row("requests", f"{summary.requests:,}")
    table.add_row("events", f"{summary.events:,}")
    table.add_row("side effects", f"{summary.effects:,}")
    table.add_row("faults injected", f"{sum(summary.faults.values()):,}")
    for name, n in sorted(summary.faults.items()):
        table.add_row(f"  {name}", f"{n:,}")
    table.add_row("virtual time", f"{summary.virtual_s:,.0f} s")
    table.add_row("wall time", f"{summary.elapsed_s:,.1f} s ({jobs} jobs)")
    table.add_row("seeds/s", f"{rate:,.1f} ({rate / jobs:,.1f} per job)")
    style = "red" if summary.violations else "green"
    table.add_row("violations", f"[{style}]{summary.violations:,}[/]")
    table.add_row("failing seeds", f"[{style}]{len(summary.failing):,}[/]")
    for code, n in sorted(summary.codes.items()):
        table.add_row(f"  {code}", f"[red]{n:,}[/]")
    out.print(table)
    if not summary.failing:
        return
    out.print("[bold red]failing seeds[/] (first violation; replay command):")
    for result in sorted(summary.failing, key=lambda r: r.seed)[:10]:
        first = result.violations[0].splitlines()[0]
        out.print(
            f"  seed {result.seed} [{result.scenario}, {result.mode}]: {first}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        out.print(f"    {replay_command(result, plant)}", markup=False, highlight=False)
    if len(summary.failing) > 10:
        out.print(f"  ... and {len(summary.failing) - 10} more (see --json)")


def run_from_args(args: Any) -> int:
    """`toolwire sim ...` (cli/main.py parses the arguments)."""
    return run_sim(
        seeds=args.seeds,
        seed=args.seed,
        scenario=args.scenario,
        jobs=args.jobs,
        trace=args.trace,
        json_path=args.json,
        plant=args.plant,
        mode=getattr(args, "mode", "mix"),
    )
