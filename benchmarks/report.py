"""Turning a run into JSON (every number) and Markdown (the summary table and the details)."""

from __future__ import annotations

import json
import math
from typing import Any

RATIO_HELP = (
    "ratio = toolwire / baseline for the statistic shown (median over repeats, or p50/p99 of the "
    "pooled latency samples); in brackets the min-max of the per-repeat ratios."
)

# The per-operation side numbers shown in each scenario's table, in this order. The server's
# main thread is a toolwire server's event loop; "waited for a CPU" is time it was runnable
# but not running (more runnable threads than free cores: on a 2-core machine the client, the
# loop and the journal's writer thread take turns).
PER_OP_LABELS = {
    "server_cpu_us_per_op": "server CPU {} us",
    "server_main_cpu_us_per_op": "main thread {} us",
    "server_others_cpu_us_per_op": "other threads {} us",
    "server_main_wait_us_per_op": "main thread waited for a CPU {} us",
    "client_cpu_us_per_op": "client CPU {} us",
    "wire_bytes_per_op": "{} B on the wire",
}


def clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(clean(doc), indent=2, sort_keys=False) + "\n"


def fmt_number(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    magnitude = abs(value)
    if unit in ("ms", "s"):
        text = f"{value:.2f}" if magnitude < 100 else f"{value:,.0f}"
    elif magnitude >= 100:
        text = f"{value:,.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def fmt_cell(value: float | None, unit: str, stat: str) -> str:
    text = fmt_number(value, unit)
    return text if stat == "median" or text == "n/a" else f"{text} ({stat})"


def fmt_ratio(row: dict[str, Any]) -> str:
    ratio = row.get("ratio")
    if ratio is None:
        return "-"
    text = f"{ratio:.2f}x" if ratio < 100 else f"{ratio:,.0f}x"
    low, high = row.get("ratio_min"), row.get("ratio_max")
    if low is not None and high is not None and low != high:
        text += f" ({low:.2f}-{high:.2f})"
    return text


def fmt_met(row: dict[str, Any]) -> str:
    met = row.get("met")
    if met is None:
        return "-"
    return "yes" if met else "**no**"


def summary_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every comparison of every scenario, with the scenario's name and the cells to show."""
    rows: list[dict[str, Any]] = []
    for name, scenario in doc["scenarios"].items():
        if "error" in scenario:
            rows.append(
                {
                    "scenario": name,
                    "label": "FAILED: " + scenario["error"].splitlines()[-1],
                    "toolwire": "-",
                    "baseline": "-",
                    "ratio": "-",
                    "goal": "-",
                    "met": "-",
                }
            )
            continue
        if scenario.get("skipped"):
            rows.append(
                {
                    "scenario": name,
                    "label": "skipped: " + scenario["skipped"],
                    "toolwire": "-",
                    "baseline": "-",
                    "ratio": "-",
                    "goal": "-",
                    "met": "-",
                }
            )
            continue
        measurements = scenario["measurements"]
        for row in [*scenario["comparisons"], *scenario.get("against", [])]:
            base = row.get("baseline")
            base_unit = measurements[base]["unit"] if base else ""
            rows.append(
                {
                    "scenario": name,
                    "label": row["label"],
                    "toolwire": fmt_cell(row["toolwire_value"], row["unit"], row["stat"]),
                    "baseline": (
                        fmt_cell(row["baseline_value"], base_unit, row["stat"]) if base else "-"
                    ),
                    "ratio": fmt_ratio(row),
                    "goal": row.get("goal") or "-",
                    "met": fmt_met(row),
                }
            )
    return rows


def markdown_summary(doc: dict[str, Any]) -> str:
    lines = [
        "| scenario | comparison | toolwire | baseline | ratio | goal | met? |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in summary_rows(doc):
        lines.append(
            f"| {row['scenario']} | {row['label']} | {row['toolwire']} | {row['baseline']} "
            f"| {row['ratio']} | {row['goal']} | {row['met']} |"
        )
    return "\n".join(lines) + "\n"


def markdown_machine(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    commit = (m.get("git_commit") or "unknown")[:12] + (" (dirty)" if m.get("git_dirty") else "")
    against = doc.get("against")
    ref = (
        f"- against REF {against['label']}: its agent from a virtualenv of its own, beside the"
        " working tree's; rows `working tree vs REF` give new / REF\n"
        if against
        else ""
    )
    return (
        f"- machine: {m['cores']} cores ({m['cpu_model']}), {m.get('memory_mib')} MiB, "
        f"{m['platform']}\n"
        f"- Python {m['python']}; {packages}\n"
        f"- commit {commit}; load average at start {m.get('load_average_at_start')}, "
        f"at end {doc.get('load_average_at_end')}\n"
        f"- mode: {'quick (tiny sizes)' if doc['quick'] else 'full'}; "
        f"{doc['duration_s']:.0f} s in total\n" + ref
    )


def _details(name: str, scenario: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if "error" in scenario:
        return [*lines, "```", scenario["error"].rstrip(), "```", ""]
    if scenario.get("skipped"):
        return [*lines, f"skipped: {scenario['skipped']}", ""]
    params = ", ".join(f"{k}={v}" for k, v in scenario["params"].items())
    lines += [f"Parameters: {params}", ""]
    lines += [
        "| variant | median | min-max over repeats | p50 / p99 (samples) | per op |",
        "|---|---|---|---|---|",
    ]
    for m in scenario["measurements"].values():
        unit = m["unit"]
        spread = f"{fmt_number(m['min'], unit)} - {fmt_number(m['max'], unit)}"
        lat = (
            f"{fmt_number(m['p50'], unit)} / {fmt_number(m['p99'], unit)} ({m['samples']})"
            if "p50" in m
            else "-"
        )
        extra = m.get("extra", {})
        per_op = []
        for key, label in PER_OP_LABELS.items():
            if key in extra:
                per_op.append(label.format(f"{extra[key]['median']:,.0f}"))
        for key, value in extra.items():
            if key in PER_OP_LABELS:
                continue
            if key in (
                "received_bytes",
                "total_bytes",
                "retention_jumps",
                "total_mb_per_s",
                "server_rss_peak_mib",
                "rss_start_mib",
                "sampled_children_peak",
                "pieces_per_line",
            ):
                per_op.append(f"{key} {value['median']:,.1f}")
            elif key.endswith("_ms"):
                per_op.append(f"{key.removesuffix('_ms')} {fmt_number(value['median'], 'ms')}")
        lines.append(
            f"| {m['label']} | {fmt_number(m['median'], unit)} | {spread} | {lat} "
            f"| {'; '.join(per_op) or '-'} |"
        )
    lines.append("")
    for note in scenario.get("notes", []):
        lines.append(f"- {note}")
    if scenario.get("notes"):
        lines.append("")
    return lines


def markdown_report(doc: dict[str, Any], plots: dict[str, str]) -> str:
    lines = [
        "# toolwire benchmark run",
        "",
        markdown_machine(doc),
        "## Summary",
        "",
        RATIO_HELP,
        "",
        markdown_summary(doc),
        "## Details",
        "",
    ]
    for name, scenario in doc["scenarios"].items():
        lines += _details(name, scenario)
        if name in plots:
            lines += [f"![{name}]({plots[name]})", ""]
    if doc.get("plots_skipped"):
        lines += [f"Plots skipped: {doc['plots_skipped']}", ""]
    return "\n".join(lines)
