"""A deployment's health as a plain state machine: circuit breaker, rate-limit pause, latency estimates.

No method reads a clock: each takes `now` (seconds on any monotonic clock), which the router
passes from the clock it was given, so tests drive the breaker by advancing a number.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass
class Health:
    """Closed until `failure_threshold` consecutive failures; then open for `cooldown_s`; then half-open,
    where one success closes it and one failure opens it again. A 429 pauses it for its retry delay
    without counting as a failure. Latency estimates are EWMAs with weight `alpha`."""

    failure_threshold: int
    cooldown_s: float
    alpha: float
    consecutive_failures: int = 0
    open_until: float = 0.0
    limited_until: float = 0.0
    answered: bool = False
    """Whether it has ever answered (a probe or a turn): `/readyz` waits for one that has."""
    _estimates: array[float] = field(default_factory=lambda: array("d", (math.nan, math.nan)), repr=False)
    """The two EWMAs (NaN: none yet), updated in place: as float attributes, the floats the last turns
    of a burst made would outlive it, each keeping the allocator arena it sits in from being returned."""

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, seconds (EWMA); None before the first measured turn."""
        return None if math.isnan(self._estimates[0]) else self._estimates[0]

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens per second (EWMA); None before the first measured turn."""
        return None if math.isnan(self._estimates[1]) else self._estimates[1]

    def available(self, now: float) -> bool:
        return now >= self.open_until and now >= self.limited_until

    def state(self, now: float) -> str:
        if now < self.open_until:
            return OPEN
        return HALF_OPEN if self.consecutive_failures >= self.failure_threshold else CLOSED

    def success(self, ttft_s: float | None = None, tokens_per_s: float | None = None) -> None:
        self.answered = True
        self.consecutive_failures = 0
        self.open_until = 0.0
        if ttft_s is not None:
            self._update(0, ttft_s)
        if tokens_per_s is not None:
            self._update(1, tokens_per_s)

    def failure(self, now: float) -> None:
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.failure_threshold:
            self.open_until = now + self.cooldown_s

    def rate_limited(self, retry_after_s: float, now: float) -> None:
        self.limited_until = max(self.limited_until, now + retry_after_s)

    def why_resting(self, now: float) -> str:
        """Why `available` refuses it now: `breaker open after 3 faults, retry after 29.5 s`, or a 429's pause."""
        if now < self.open_until:
            return f"breaker open after {self.consecutive_failures} faults, retry after {self.open_until - now:.1f} s"
        return f"rate limited by the backend, retry after {self.limited_until - now:.1f} s"

    def _update(self, index: int, sample: float) -> None:
        """One EWMA moved by `sample` (the sample itself when it is the first), in place."""
        current = self._estimates[index]
        self._estimates[index] = sample if math.isnan(current) else self.alpha * sample + (1 - self.alpha) * current


@dataclass
class TokenWindow:
    """Tokens used in the last `window_s` seconds, for a deployment's `tokens_per_minute`.

    Counted in one-second buckets, so the window holds a fixed handful of numbers however many
    turns pass: an entry per turn grew without bound where nothing read the total, and entries
    made during a burst of clients outlived it, pinning allocator pages the burst freed. The
    buckets are C integers updated in place, for the same reason: a list would hold a new int
    object per update, allocated in the burst's memory and alive after it.
    """

    window_s: float = 60.0
    _seconds: array[int] = field(default_factory=lambda: array("q"))
    _counts: array[int] = field(default_factory=lambda: array("q"))

    def __post_init__(self) -> None:
        size = max(1, math.ceil(self.window_s))
        self._seconds = array("q", [-1]) * size
        self._counts = array("q", [0]) * size

    def record(self, tokens: int, now: float) -> None:
        second = math.floor(now)
        slot = second % len(self._seconds)
        if self._seconds[slot] != second:
            self._seconds[slot] = second
            self._counts[slot] = 0
        self._counts[slot] += tokens

    def total(self, now: float) -> int:
        """Tokens recorded in the `window_s` whole seconds ending with the current one."""
        oldest = math.floor(now) - len(self._seconds) + 1
        return sum(count for second, count in zip(self._seconds, self._counts, strict=True) if second >= oldest)
