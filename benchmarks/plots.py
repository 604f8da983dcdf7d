"""PNG plots of a run, one per scenario (matplotlib, the optional extra `bench`).

Each scenario gets one figure with a panel per unit: a bar per variant at its median (or the
p50 of its latency samples), whiskers from the min to the max over repeats (latencies: p50 to
p99). toolwire's variants are blue, baselines grey. Small on purpose (80 dpi): they are
committed under docs/bench/.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

TOOLWIRE_COLOR = "#1f77b4"
BASELINE_COLOR = "#9e9e9e"
DPI = 80


def matplotlib_missing() -> str | None:
    """Why plots cannot be drawn, or None when they can."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'toolwire[bench]')"
    return None


def _is_toolwire(name: str) -> bool:
    return name.startswith("toolwire") or name in (
        "rss_mb",
        "bytes_per_chat",
        "bytes_per_record",
        "rss_mb_memory",
        "bytes_per_chat_memory",
        "bytes_per_record_memory",
        "rss_mb_burst",
        "rss_mb_recovered",
        "procs_completed",
        "procs_peak",
        "procs_wall_s",
    )


def plot_scenario(name: str, scenario: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for key, m in scenario["measurements"].items():
        groups.setdefault(m["unit"], []).append((key, m))
    heights = [0.7 + 0.5 * len(items) for items in groups.values()]
    fig, axes = plt.subplots(
        len(groups),
        1,
        figsize=(8.5, sum(heights) + 0.6),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, (unit, items) in zip(axes[:, 0], groups.items(), strict=True):
        labels, values, low, high, colors = [], [], [], [], []
        for key, m in items:
            latency = "p50" in m
            value = m["p50"] if latency else m["median"]
            lo = m["p50"] if latency else m["min"]
            hi = m["p99"] if latency else m["max"]
            if value is None:
                continue
            label = m["label"] + (" (p50; whisker: p99)" if latency else "")
            labels.append(textwrap.fill(label, 38))
            values.append(value)
            low.append(max(value - (lo if lo is not None else value), 0.0))
            high.append(max((hi if hi is not None else value) - value, 0.0))
            colors.append(TOOLWIRE_COLOR if _is_toolwire(key) else BASELINE_COLOR)
        ypos = list(range(len(values)))
        ax.barh(ypos, values, xerr=[low, high], color=colors, capsize=3)
        ax.set_yticks(ypos, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(unit, fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        for y, v, up in zip(ypos, values, high, strict=True):
            ax.text(v + up, y, "  " + _short(v), va="center", fontsize=7)
        ax.margins(x=0.18)
    fig.suptitle(name, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _short(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def plot_run(doc: dict[str, Any], out_dir: Path, stem: str) -> dict[str, str]:
    """One PNG per scenario that has numbers; returns scenario -> file name."""
    written: dict[str, str] = {}
    for name, scenario in doc["scenarios"].items():
        if "error" in scenario or not scenario.get("measurements"):
            continue
        path = out_dir / f"{stem}-{name}.png"
        plot_scenario(name, scenario, path)
        written[name] = path.name
    return written
