"""`toolwire bench`: run the scenarios, show progress, write JSON + Markdown + PNG plots.

Adding a scenario is one function and one registry entry: write `run(ctx) -> ScenarioResult`
(in `benchmarks/scenarios/`), measuring every variant once per repeat (see
`core.run_side_by_side`), and add a `Scenario` to `SCENARIOS` below.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from toolwire.benchmarks import report
from toolwire.benchmarks.core import BenchContext, Build, ScenarioResult
from toolwire.benchmarks.machine import load_average, machine_info
from toolwire.benchmarks.scenarios import (
    abuse,
    bigwrite,
    interactive,
    journal,
    keeper,
    peers,
    process,
    reqresp,
    request_cost,
    sandbox,
    scale,
    streaming,
    transport,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    run: Callable[[BenchContext], ScenarioResult]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("transport", "trivial calls vs raw trio-websocket echo", transport.run),
        Scenario("reqresp", "toolwire vs the HTTP/1.1 request/response design", reqresp.run),
        Scenario("process", "execute true vs trio.run_process and posix_spawn", process.run),
        Scenario("sandbox", "execute true sandboxed (Landlock) vs unsandboxed", sandbox.run),
        Scenario("streaming", "a 200 MB output vs a plain trio pipe read", streaming.run),
        Scenario("scale", "10,000 idle chats, 1,000 concurrent processes", scale.run),
        Scenario("journal", "calls with the sqlite journal vs the memory journal", journal.run),
        Scenario("bigwrite", "trivial calls while another chat writes 16 MiB files", bigwrite.run),
        Scenario(
            "interactive", "a one-line process_input to cat on a pty vs a raw pty", interactive.run
        ),
        Scenario("abuse", "another chat's trivial calls while one client attacks", abuse.run),
        Scenario(
            "request_cost", "time per id of cancel, interrupt, turn, close_chat", request_cost.run
        ),
        Scenario("peers", "execute true vs OpenAI's Codex app-server (--codex)", peers.run),
        Scenario(
            "keeper", "the keeper: its memory per command, a restart with 100 running", keeper.run
        ),
    )
}


class UnknownScenario(ValueError):
    pass


def select(only: list[str] | None) -> list[Scenario]:
    if not only:
        return list(SCENARIOS.values())
    unknown = [name for name in only if name not in SCENARIOS]
    if unknown:
        raise UnknownScenario(
            f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}"
        )
    return [SCENARIOS[name] for name in only]


def run_bench(
    out_dir: Path,
    *,
    quick: bool = False,
    only: list[str] | None = None,
    console: Console | None = None,
    against: str | None = None,
    cache_dir: Path | None = None,
    codex: str | None = None,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Run the selected scenarios; write `bench-<stamp>.json`, `.md` and PNGs into `out_dir`.
    With `against`, REF's agent (built or taken from `cache_dir`) runs beside the working
    tree's in every scenario. Returns the run document and the files written."""
    console = console or Console(stderr=True)
    chosen = select(only)
    ref: Build | None = None
    build_s = 0.0
    if against is not None:
        from toolwire.benchmarks.against import build

        t_build = time.perf_counter()
        ref = build(against, cache_dir, report=lambda text: console.print(text))
        build_s = time.perf_counter() - t_build
    out_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    stem = "bench-" + started.strftime("%Y%m%d-%H%M%S") + ("-quick" if quick else "")
    doc: dict[str, Any] = {
        "toolwire_bench": 1,
        "started_at": started.isoformat(timespec="seconds"),
        "quick": quick,
        "machine": machine_info(),
        "scenarios": {},
    }
    if ref is not None:
        doc["against"] = {
            "ref": against,
            "commit": ref.commit,
            "label": ref.label,
            "python": ref.python,
            "build_or_cache_s": round(build_s, 1),
        }
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="toolwire-bench-"))
    # Refreshed by hand between measurements: an auto-refresh thread would take CPU from the
    # client it shares this process with.
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[scenario]:<10}"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        auto_refresh=False,
    )
    try:
        with progress:
            overall = progress.add_task("", total=len(chosen), scenario="bench")
            for scenario in chosen:
                task = progress.add_task(scenario.title, total=None, scenario=scenario.name)

                def show(text: str, task: Any = task) -> None:
                    progress.update(task, description=text)
                    progress.refresh()

                show(scenario.title)
                ctx = BenchContext(
                    quick=quick, workdir=workdir, report=show, against=ref, codex=codex
                )
                try:
                    result = scenario.run(ctx)
                    result.notes += ctx.notes
                    doc["scenarios"][scenario.name] = {
                        "title": scenario.title,
                        **result.as_dict(),
                    }
                    show(f"skipped: {result.skipped}" if result.skipped else "done")
                except Exception:
                    doc["scenarios"][scenario.name] = {
                        "title": scenario.title,
                        "error": traceback.format_exc(),
                    }
                    show("[red]failed")
                progress.update(task, total=1, completed=1)
                progress.advance(overall)
                progress.refresh()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    doc["duration_s"] = time.perf_counter() - t0
    doc["load_average_at_end"] = load_average()
    files = write_outputs(doc, out_dir, stem)
    console.print(summary_table(doc))
    for name, scenario in doc["scenarios"].items():
        if scenario.get("skipped"):
            console.print(f"{name}: skipped: {scenario['skipped']}", markup=False)
    for kind, path in files.items():
        console.print(f"{kind}: {path}")
    if doc.get("plots_skipped"):
        console.print(f"[yellow]plots skipped: {doc['plots_skipped']}")
    return doc, files


def write_outputs(doc: dict[str, Any], out_dir: Path, stem: str) -> dict[str, Path]:
    from toolwire.benchmarks import plots

    files: dict[str, Path] = {}
    written: dict[str, str] = {}
    missing = plots.matplotlib_missing()
    if missing is None:
        try:
            written = plots.plot_run(doc, out_dir, stem)
        except Exception as exc:  # a plot must never cost the numbers
            doc["plots_skipped"] = f"plotting failed: {exc!r}"
    else:
        doc["plots_skipped"] = missing
    doc["plots"] = written
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(report.to_json(doc))
    files["json"] = json_path
    md_path = out_dir / f"{stem}.md"
    md_path.write_text(report.markdown_report(doc, written))
    files["markdown"] = md_path
    for name, file_name in written.items():
        files[f"plot {name}"] = out_dir / file_name
    return files


def summary_table(doc: dict[str, Any]) -> Table:
    table = Table(title="toolwire bench" + (" (quick)" if doc["quick"] else ""))
    for column in ("scenario", "comparison", "toolwire", "baseline", "ratio", "goal", "met?"):
        table.add_column(column, overflow="fold")
    for row in report.summary_rows(doc):
        met = row["met"]
        style = "green" if met == "yes" else "red" if met == "**no**" else ""
        table.add_row(
            row["scenario"],
            row["label"],
            row["toolwire"],
            row["baseline"],
            row["ratio"],
            row["goal"],
            met.strip("*"),
            style=style,
        )
    return table


def main(
    *,
    quick: bool,
    out: Path,
    only: list[str],
    against: str | None = None,
    cache_dir: Path | None = None,
    codex: str | None = None,
) -> int:
    """The `toolwire bench` command: 0 when every scenario ran (goals may be missed), 1 when
    one failed, 2 for an unknown scenario or a REF that cannot be built."""
    from toolwire.benchmarks.against import BuildError

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a log file: no need to fold the table into 80 columns
    try:
        doc, _ = run_bench(
            out,
            quick=quick,
            only=only or None,
            console=console,
            against=against,
            cache_dir=cache_dir,
            codex=codex,
        )
    except (UnknownScenario, BuildError) as exc:
        console.print(f"toolwire bench: {exc}", markup=False)
        return 2
    failed = [name for name, s in doc["scenarios"].items() if "error" in s]
    if failed:
        console.print(f"[red]scenarios failed: {', '.join(failed)}")
        for name in failed:
            console.print(doc["scenarios"][name]["error"])
        return 1
    return 0
