"""Plain-text tables for stdout and the run's summary file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_table(rows: Sequence[Sequence[Any]]) -> str:
    """First row is the header; first column left-aligned, the rest right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(cells[0]))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def targets_table(results: dict[str, dict[str, Any]]) -> str:
    rows = [["suite", "target", "measured", "threshold", "met"]]
    for suite, result in results.items():
        for t in result.get("targets", []):
            met = {True: "yes", False: "NO", None: "n/a"}[t["met"]]
            rows.append([suite, t["target"], fmt(t["measured"], 3), f"{t['op']} {t['threshold']:g}", met])
    return format_table(rows) if len(rows) > 1 else "(no targets evaluated)"
