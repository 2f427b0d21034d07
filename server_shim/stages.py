"""Where a turn's time goes: seconds per pipeline stage, measured at the stage boundaries.

Plain code with the clock passed in: the turn marks the end of each stage it runs, the router
marks the end of routing; metrics, the per-response log line and spans read the result once.
A mark is one interval appended to a list (a turn makes seven); the seconds per stage are worked out
when they are read (`metrics.observe_turn` reads the intervals themselves: no dict per turn).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StageClock:
    """Seconds per stage, from the end of the previous mark (or `restart`) to each `mark`."""

    __slots__ = ("_last", "clock", "first_token", "intervals", "started", "ttft_s")

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.started = self._last = clock()
        self.first_token: float | None = None
        self.ttft_s: float | None = None
        """Seconds from the start to the backend's first output delta (set with `first_token`): an attribute, not a
        property, as every finished turn reads it (a property is a C-to-Python call, ~1,000 instructions)."""
        self.intervals: list[tuple[str, float, float]] = []
        """(stage, start, end) in clock time, in order: what a trace draws as one span per stage."""

    def restart(self) -> None:
        """Time from here on belongs to the next mark (what came before was the client's, not a stage's)."""
        self._last = self.clock()

    def mark(self, stage: str) -> None:
        now = self.clock()
        self.intervals.append((stage, self._last, now))
        self._last = now

    def mark_first_token(self) -> None:
        """The backend's first output delta: ends `backend_ttft` and starts `stream`."""
        if self.first_token is None:
            self.mark("backend_ttft")
            self.first_token = self._last
            self.ttft_s = self._last - self.started

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per stage (a stage marked twice: the sum)."""
        intervals = self.intervals
        seconds = {stage: end - start for stage, start, end in intervals}
        if len(seconds) < len(intervals):  # a stage marked again
            seconds = {}
            for stage, start, end in intervals:
                seconds[stage] = seconds.get(stage, 0.0) + (end - start)
        return seconds

    def elapsed(self) -> float:
        return self.clock() - self.started
