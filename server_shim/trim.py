"""The heap: start-up objects frozen, raised GC thresholds, and freed memory given back after connections close.

Once per burst of closes (`delay_s` after its last, see `trim_at`; in a moment with no response in flight,
see `check_at`): the Prometheus observations still
held applied (`metrics.flush_turns`: the values a batch holds are per-turn floats allocated all over
the burst's memory, and Python's allocator returns a 1 MiB arena only once nothing in it is alive),
the connections' cancelled timers purged from asyncio's heap (`purge_cancelled_timers`), the
interpreter's attribute cache emptied (`clear_type_cache`), a full garbage collection (which also empties the interpreter's free lists), asyncio's reused future
iterators renewed (`renew_future_iterators`), then `malloc_trim(0)` in a worker thread. The collection is needed because `serve` raises the GC
thresholds (`GC_THRESHOLDS`), so a full collection otherwise comes only after millions of
allocations: whatever a closed connection left in reference cycles (asyncio's transports are
one) would wait for it. It walks only objects made since start-up (the start-up heap is frozen),
a few milliseconds after a burst. The trim returns free pages of the C heap (glibc keeps them
otherwise); a no-op where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import asyncio
import gc
import math
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, overload, runtime_checkable

from . import metrics
from .allocator import libc_trim

T = TypeVar("T", int, float)


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
20 ms of CPU waits at least 2 s before the next, so a server with many cached objects and steady
connection churn is not collecting all the time."""


def trim_at(first_close: float, last_close: float, allowed: float, delay_s: float, max_wait_s: float) -> float:
    """When the pending trim runs: `delay_s` after the burst's last close (a burst of a thousand closes
    can take seconds), but no later than `max_wait_s` after its first, so a steady trickle of closes
    still gets trims; and never before `allowed` (see `next_allowed`)."""
    return max(allowed, min(last_close + delay_s, first_close + max_wait_s))


def check_at(now: float, due: float, first_close: float, busy: bool, poll_s: float, max_busy_s: float) -> float:
    """When the pending trim next looks again: `due` while it is not due; while the server is `busy` (responses
    in flight or finishing), `poll_s` later, until `max_busy_s` past the burst's first close; else `now` (it runs).

    A full collection stops the event loop for as long as it walks every object made since start-up
    (39 ms at 128 busy connections, `python -m benchmarks load --clients 128`): run while turns are in
    flight, every one of them waits that long. Waiting for a moment with none costs only memory given
    back later; a server never quiet still trims once every `max_busy_s`, and the collector's own
    thresholds free cycles in between.
    """
    if now < due:
        return due
    if busy and now < first_close + max_busy_s:
        return min(now + poll_s, first_close + max_busy_s)
    return now


def next_allowed(now: float, took_s: float, share: float = GC_SHARE) -> float:
    """When the next trim may run, after one that ended at `now` and took `took_s`."""
    return now + took_s / share


class Cell(Generic[T]):
    """A field of a `Counts` class, kept in the instance's array."""

    def __init__(self) -> None:
        self.index = -1

    def __set_name__(self, owner: type[Counts], name: str) -> None:
        self.index = owner.size
        owner.size += 1
        owner.names = (*owner.names, name)

    @overload
    def __get__(self, obj: None, owner: type[Counts]) -> Cell[T]: ...
    @overload
    def __get__(self, obj: Counts, owner: type[Counts]) -> T: ...
    def __get__(self, obj: Counts | None, owner: type[Counts]) -> T | Cell[T]:
        return self if obj is None else obj.cells[self.index]

    def __set__(self, obj: Counts, value: T) -> None:
        obj.cells[self.index] = value


class Count(Cell[int]):
    """An integer field of a `Counts` class."""


class Seconds(Cell[float]):
    """A float field of a `Counts` class whose `typecode` is "d"."""


class Counts:
    """Integer counters (each a `Count` field) kept in one int64 array and updated in place.

    An int attribute holds the int object its last update made (beyond 256 each value is a new
    object): a counter bumped once per turn keeps one object allocated during the last burst of
    clients, wherever the allocator had room, and that one object is enough to keep the 1 MiB
    arena it sits in from going back to the system.
    """

    size: ClassVar[int] = 0
    names: ClassVar[tuple[str, ...]] = ()
    typecode: ClassVar[str] = "q"
    """The array's type: "d" keeps floats (C doubles) instead."""
    __slots__ = ("cells",)

    def __init__(self) -> None:
        self.cells: array[Any] = array(self.typecode, bytes(8 * self.size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)}' for name in self.names)})"


class TrimTimes(Counts):
    """The trimmer's times, kept in place (see `Counts`): a float attribute set at each close would keep
    the float object made during the burst, and with it the arena it sits in."""

    typecode = "d"
    first = Seconds()
    """The first close of the pending burst; NaN when none is pending."""
    last = Seconds()
    allowed = Seconds()
    turns_seen = Seconds()
    """Turns finished at the trimmer's last look (a count, kept as a float like the times)."""


@runtime_checkable
class Settles(Protocol):
    """A part that holds something only a burst of clients needed (a timer): `settle` lets go of it."""

    def settle(self) -> None: ...


def settle_hooks(*parts: object) -> tuple[Callable[[], None], ...]:
    """What the trim runs before collecting: the held metric observations applied, then each part's `settle`."""
    return (metrics.flush_turns, *(part.settle for part in parts if isinstance(part, Settles)))


@dataclass
class Trimmer:
    """One collection and trim per burst of closes (`maybe_trim` is called at each), timed by `trim_at`."""

    delay_s: float = 1.0
    max_wait_s: float = 10.0
    in_flight: Callable[[], bool] = field(default=lambda: False)
    """Whether any response is in flight (`TenantLimiter.busy`)."""
    turns: Callable[[], int] = field(default=lambda: 0)
    """Turns finished so far (`ShimStats.turns`). A ready turn is in flight only within one callback, so busy
    connections can have none in flight whenever a timer runs: the server counts as busy while turns finish.
    A due trim waits for a moment with none in flight and none finished for `poll_s` (`check_at`)."""
    poll_s: float = 0.25
    max_busy_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    cpu_clock: Callable[[], float] = time.thread_time
    """What a trim's cost is measured in (`GC_SHARE`): the loop thread's CPU time, not the wall clock, which
    on a loaded machine counts the time other processes ran too and could hold the next trim for many seconds."""
    settle: tuple[Callable[[], None], ...] = field(default=(metrics.flush_turns,))
    """Run before the collection: each lets go of what it held from the burst."""
    times: TrimTimes = field(default_factory=TrimTimes)
    _timer: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self.times.first = math.nan

    def maybe_trim(self) -> None:
        times = self.times
        times.last = self.clock()
        if math.isnan(times.first):
            times.first = times.last
        if self._timer is None:
            times.turns_seen = self.turns()
            self._arm(times.last)

    def _busy(self) -> bool:
        """Responses in flight, or turns finished since the last look."""
        times, turns = self.times, self.turns()
        finished = turns != times.turns_seen
        times.turns_seen = turns
        return finished or self.in_flight()

    def _first(self) -> float:
        times = self.times
        return times.last if math.isnan(times.first) else times.first

    def _due(self) -> float:
        times = self.times
        return trim_at(self._first(), times.last, times.allowed, self.delay_s, self.max_wait_s)

    def _arm(self, now: float, at: float | None = None) -> None:
        delay = max(0.0, (self._due() if at is None else at) - now)
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        began, cpu = self.clock(), self.cpu_clock()
        due = self._due()
        busy = began >= due and self._busy()  # looked at only once due: a look resets what it counts from
        at = check_at(began, due, self._first(), busy, self.poll_s, self.max_busy_s)
        if at > began:  # more closes came meanwhile, or responses are in flight
            self._arm(began, at)
            return
        self.times.first = math.nan
        for settle in self.settle:
            settle()
        loop = asyncio.get_running_loop()
        purge_cancelled_timers(loop)
        loop.call_soon(self._collect, self.cpu_clock() - cpu)  # after the loop's next purge

    def _collect(self, settled_s: float) -> None:
        cpu = self.cpu_clock()
        clear_type_cache()
        gc.collect()
        renew_future_iterators(asyncio.get_running_loop())
        self.times.allowed = next_allowed(self.clock(), settled_s + self.cpu_clock() - cpu)
        if _TRIM is not None:  # handed to the executor at once: no coroutine left unawaited if the loop closes first
            asyncio.get_running_loop().run_in_executor(None, _TRIM, 0)


def clear_type_cache() -> None:
    """Empty CPython's attribute lookup cache, which keeps a reference to each name it caches.

    It caches by the name's address, so a name made afresh for each lookup from C (`"dst"`, which
    `datetime.timetuple()` looks up on its tzinfo, once per WebSocket handshake for the `Date`
    header) takes a new entry each time: after a burst of connections hundreds of such strings,
    allocated during it, stay referenced only by the cache, each keeping its allocator arena. The
    cache refills as lookups happen (a few microseconds, once per burst).
    """
    clear = getattr(sys, "_clear_type_cache", None)
    if clear is not None:
        clear()


PURGE_TIMERS = 1024
"""Cancelled timers scheduled by `purge_cancelled_timers`: enough for asyncio to purge while fewer than
this many timers are live (two per open connection and a few)."""


def purge_cancelled_timers(loop: asyncio.AbstractEventLoop) -> None:
    """Have asyncio drop from its heap the timers cancelled during the burst.

    asyncio removes a cancelled timer only when it comes due, or when over 100 timers are scheduled and
    over half of them are cancelled. Each connection has an idle and an age timer (minutes to an hour
    away), cancelled when it closes: after a burst up to a hundred of them (a handle and a context each,
    allocated during the burst) would stay, each keeping the allocator arena it sits in. Scheduling and
    cancelling `PURGE_TIMERS` more crosses asyncio's threshold; its next loop iteration purges them all.
    """
    for handle in [loop.call_later(3600.0, _nothing) for _ in range(PURGE_TIMERS)]:
        handle.cancel()


def _nothing() -> None:
    """Never called: the callback of a timer cancelled at once."""


FUTURE_ITERATORS = 256
"""More than asyncio's C module keeps for reuse (255 in CPython 3.11 to 3.13)."""


def renew_future_iterators(loop: asyncio.AbstractEventLoop) -> None:
    """Replace the iterators `await future` reuses with ones made now, and give the old ones back.

    asyncio's C module keeps up to 255 freed future iterators for reuse, and no collection empties that
    list: after a burst it holds blocks freed at the burst's end, scattered over the arenas the burst
    opened, each keeping its arena from going back to the system. Taking them all out plus as many new
    ones, then freeing the new ones first, refills the list with blocks made side by side now; the old
    ones, freed last, find the list full and go back to the allocator.
    """
    future = loop.create_future()
    taken = [future.__await__() for _ in range(2 * FUTURE_ITERATORS)]
    del taken[FUTURE_ITERATORS:]
    del taken


_TRIM = libc_trim()
