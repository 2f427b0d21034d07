"""Turns chained / total for each framework test, printed at the end of the run.

A framework test calls `chain_report(framework, version, stats)` with its session's stats after
it has asserted them; the summary shows what each framework actually chained in this run.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import pytest

_rows: list[tuple[str, str, str, int, int]] = []


@pytest.fixture
def chain_report(request: pytest.FixtureRequest) -> Callable[[str, str, Any], None]:
    def report(framework: str, distribution: str, stats: Any) -> None:
        _rows.append((request.node.name, framework, version(distribution), stats.turns_chained, stats.turns))

    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _rows:
        return
    terminalreporter.write_sep("-", "framework turns chained / total (ws_transport)")
    for test, framework, framework_version, chained, total in _rows:
        terminalreporter.write_line(f"{framework} {framework_version}: {chained}/{total} chained  ({test})")
