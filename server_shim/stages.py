"""Where a turn's time goes: seconds per pipeline stage, measured at the stage boundaries.

Plain code with the clock passed in: the turn marks the end of each stage it runs, the router
marks the end of routing; metrics, the per-response log line and spans read the result once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class StageClock:
    """Seconds per stage, from the end of the previous mark (or `restart`) to each `mark`."""

    clock: Callable[[], float] = time.perf_counter
    seconds: dict[str, float] = field(default_factory=dict)
    intervals: list[tuple[str, float, float]] = field(default_factory=list)
    """(stage, start, end) in clock time, in order: what a trace draws as one span per stage."""
    started: float = field(init=False)
    first_token: float | None = None
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self._last = self.clock()

    def restart(self) -> None:
        """Time from here on belongs to the next mark (what came before was the client's, not a stage's)."""
        self._last = self.clock()

    def mark(self, stage: str) -> None:
        now = self.clock()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + (now - self._last)
        self.intervals.append((stage, self._last, now))
        self._last = now

    def mark_first_token(self) -> None:
        """The backend's first output delta: ends `backend_ttft` and starts `stream`."""
        if self.first_token is None:
            self.mark("backend_ttft")
            self.first_token = self._last

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    def elapsed(self) -> float:
        return self.clock() - self.started
