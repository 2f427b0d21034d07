"""The heap: start-up objects frozen, raised GC thresholds, and freed memory given back after connections close.

Once per burst of closes (`delay_s` after the first): a full garbage collection, then
`malloc_trim(0)` in a worker thread. The collection is needed because `serve` raises the GC
thresholds (`GC_THRESHOLDS`), so a full collection otherwise comes only after millions of
allocations: whatever a closed connection left in reference cycles (asyncio's transports are
one) would wait for it. It walks only objects made since start-up (the start-up heap is frozen),
a few milliseconds after a burst. The trim returns free pages of the C heap (glibc keeps them
otherwise); a no-op where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass


def _libc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


GC_THRESHOLDS = (10_000, 20, 20)
"""Young-generation collections every 10,000 allocations instead of 700: a turn allocates thousands of
short-lived containers, and the connection caches hold long-lived ones that each collection would walk."""


def freeze_startup_heap() -> None:
    """Move everything built at start-up (modules, models, the app) out of the collector's sight.

    Called once the app exists, before serving: the cyclic GC then walks only what requests created.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


GC_SHARE = 0.01
"""At most this share of the process's time goes to the after-burst collections: one that took
20 ms waits at least 2 s before the next, so a server with many cached objects and steady
connection churn is not collecting all the time."""


def trim_wait(delay_s: float, now: float, next_allowed: float) -> float:
    """Seconds from a close (with no trim pending) to the trim it schedules."""
    return max(delay_s, next_allowed - now)


def next_allowed(now: float, took_s: float, share: float = GC_SHARE) -> float:
    """When the next trim may run, after one that ended at `now` and took `took_s`."""
    return now + took_s / share


@dataclass
class Trimmer:
    """Coalesces the closes of a burst: one trim `delay_s` after the first close of the burst, or later
    where an earlier one would put the collections over `GC_SHARE` of the time."""

    delay_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _pending: asyncio.TimerHandle | None = None
    _next_allowed: float = 0.0

    def maybe_trim(self) -> None:
        if self._pending is not None:
            return
        wait = trim_wait(self.delay_s, self.clock(), self._next_allowed)
        self._pending = asyncio.get_running_loop().call_later(wait, self._start)

    def _start(self) -> None:
        self._pending = None
        began = self.clock()
        gc.collect()
        ended = self.clock()
        self._next_allowed = next_allowed(ended, ended - began)
        if _TRIM is not None:
            asyncio.get_running_loop().create_task(asyncio.to_thread(_TRIM, 0))


_TRIM = _libc_trim()
