"""PNG plots (matplotlib, from the `bench` extra); a missing matplotlib skips the plot, not the run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .common import BREAKDOWN_PARTS, progress

COLOURS = {
    "websocket": "tab:green",
    "http_chained": "tab:orange",
    "http_stateless": "tab:red",
    "backend_http": "tab:blue",
    "backend_inprocess": "tab:gray",
    "http": "tab:red",
}


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("plot skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return None
    return plt


def _per_turn_lines(ax: Any, series: dict[str, list[dict[str, Any]]], field: str, floor: float) -> None:
    for name, per_turn in series.items():
        turns = [p["turn"] for p in per_turn]
        median = [max(_num(p[field]["median"]), floor) for p in per_turn]
        low = [max(_num(p[field]["min"]), floor) for p in per_turn]
        high = [max(_num(p[field]["p90"]), floor) for p in per_turn]
        (line,) = ax.plot(turns, median, marker=".", label=name, color=COLOURS.get(name))
        ax.fill_between(turns, low, high, alpha=0.12, color=line.get_color())


def _num(value: float | None) -> float:
    return math.nan if value is None else value


def overhead_plot(result: dict[str, Any], path: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    alternatives = result["alternatives"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    _per_turn_lines(left, {n: a["per_turn"] for n, a in alternatives.items()}, "overhead_ms", 1e-3)
    left.set_yscale("log")
    left.set_xlabel("turn")
    left.set_ylabel("overhead per turn, ms (log; line = median, band = min..p90)")
    cfg = result["config"]
    left.set_title(f"Per-turn overhead vs turn ({cfg['user_bytes_per_turn']} B new input/turn, zero-latency backend)")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)

    names = [n for n in alternatives if n != "backend_inprocess"]
    bottoms = [0.0] * len(names)
    for part in BREAKDOWN_PARTS:
        heights = [max(alternatives[n]["last_window"][part]["median"] or 0.0, 0.0) for n in names]
        right.bar(names, heights, bottom=bottoms, label=part.removesuffix("_ms"))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    right.set_ylabel("ms (medians of each part)")
    right.set_title(f"Where a turn goes, last turns (~turn {cfg['turns']})")
    right.tick_params(axis="x", labelrotation=20, labelsize=8)
    right.legend(fontsize=8)
    right.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def per_turn_plot(
    series: dict[str, list[dict[str, Any]]], field: str, path: Path, title: str, ylabel: str, *, log: bool = True
) -> Path | None:
    """One line per alternative of `field` against turn number (median, band min..p90)."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(10, 5.5))
    _per_turn_lines(ax, series, field, 1e-3 if log else -math.inf)
    if log:
        ax.set_yscale("log")
    else:
        ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("turn")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
