"""Per-turn deadlines on a backend stream: time to first token, and total time.

A stalled backend, or one that trickles keep-alive comments, never trips an HTTP read timeout
that counts idle time per read; these deadlines count from the request's start. The decisions
are plain: `Deadlines.next` says which deadline is nearest, a `Watch` keeps its stream's due
time (a number, moved at the first token), and `Timer.due` picks the watches past due at `now`;
every time comes from the clock they are given. The asyncio part is one loop timer per `Timer`
(a router has one per event loop), armed at the earliest due time it knows of, which cancels the
read in progress of a stream past due. A turn only adds its watch to a set and removes it: a
loop timer per turn, moved at the first token, cost two timer handles made, pushed on the loop's
heap and cancelled per turn. A watch whose due time moves later leaves the timer where it is;
it fires early, finds nothing due, and re-arms at the earliest due time then.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from .backends.base import Delta, TextDelta, ToolCallDelta
from .errors import BackendError

FIRST_TOKEN = "first-token"
TOTAL = "total"


@dataclass(frozen=True, slots=True)
class Deadlines:
    first_token_s: float
    total_s: float

    def next(self, started: float, first_token_at: float | None, now: float) -> tuple[float, str]:
        """Seconds left until the nearest deadline still pending, and which one it is."""
        total_left = started + self.total_s - now
        if first_token_at is None:
            first_left = started + self.first_token_s - now
            if first_left < total_left:
                return first_left, FIRST_TOKEN
        return total_left, TOTAL


class DeadlineExceeded(BackendError):
    """The backend missed a deadline: a backend fault (it counts toward the breaker), status 504."""

    def __init__(self, which: str, seconds: float, *, started: bool) -> None:
        super().__init__(
            f"the backend missed its {which} deadline of {seconds:g} s", status=504, retryable=not started, public=True
        )
        self.which = which


class Timer:
    """The watches of one clock on one event loop, and one loop timer armed at the earliest due time."""

    __slots__ = ("armed_at", "clock", "handle", "loop", "watches")

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float]) -> None:
        self.loop = loop
        self.clock = clock
        self.watches: set[Watch] = set()
        self.handle: asyncio.TimerHandle | None = None
        self.armed_at = math.inf
        """The due time (on `clock`) the loop timer fires at; infinity when it is not armed."""

    def add(self, watch: Watch) -> None:
        """Watch `watch` (again, when its due time moved): the loop timer moves only when it is due sooner."""
        self.watches.add(watch)
        if watch.due < self.armed_at:
            self._arm(watch.due)

    def discard(self, watch: Watch) -> None:
        self.watches.discard(watch)

    def settle(self) -> None:
        """With nothing watched, disarm the loop timer now rather than when it comes due (a minute or more
        after the last stream ended): its handle, callback and due time, made during a burst of clients,
        would keep the memory they sit in from going back to the system (see `trim.py`)."""
        if not self.watches and self.handle is not None:
            self.handle.cancel()
            self.handle = None
            self.armed_at = math.inf

    def due(self, now: float) -> tuple[list[Watch], float]:
        """The watches past due at `now` (no longer watched), and the earliest due time of the others."""
        past = [watch for watch in self.watches if watch.due <= now]
        self.watches.difference_update(past)
        return past, min((watch.due for watch in self.watches), default=math.inf)

    def _arm(self, at: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_at = at
        self.handle = self.loop.call_later(max(at - self.clock(), 0.0), self._fire)

    def _fire(self) -> None:
        self.handle = None
        self.armed_at = math.inf
        past, earliest = self.due(self.clock())
        for watch in past:
            watch.expire()
        if earliest < self.armed_at:  # an expired watch may have been added again
            self._arm(earliest)


class Watch:
    """The deadlines of one backend stream, applied by its reader around each read (no generator layer between).

    A deadline that passes while the caller holds a delta cuts the next read that has to wait, as
    it would have cut it had the read begun with no time left; a delta ready at once still goes
    through. The reader, from the task that made the watch (attribute checks rather than calls on
    the common path: a method call around each read cost more than the rest of the watch)::

        if watch.expired:
            watch.past_due()  # the read about to start is cut if it has to wait
        watch.waiting = True
        delta = await anext(stream)  # on CancelledError: watch.cut(), then re-raise
        watch.waiting = False
        if watch.cancelled or watch.kick is not None:
            watch.settle()
        # and at the stream's first token (text or a tool call): watch.token(now)

    and `close()` when done.
    """

    __slots__ = (
        "base",
        "cancelled",
        "deadlines",
        "due",
        "expired",
        "first_token_at",
        "kick",
        "started",
        "task",
        "timer",
        "waiting",
    )

    def __init__(self, deadlines: Deadlines, timer: Timer, started: float) -> None:
        """`started`: when the request started, on the timer's clock."""
        self.deadlines = deadlines
        self.timer = timer
        self.started = started
        self.first_token_at: float | None = None
        self.due = started + min(deadlines.first_token_s, deadlines.total_s)
        self.waiting = False
        """Whether a read is in progress (the task is waiting on the stream)."""
        self.expired = False
        """The due time passed (a read that has to wait is cut)."""
        self.cancelled = False
        """This watch cancelled the task (the cancellation is withdrawn once the read ends)."""
        self.kick: asyncio.Handle | None = None
        """The cut scheduled for a read started past due (withdrawn if the read did not have to wait)."""
        task = asyncio.current_task()  # the reading task, once: each lookup is a `getpid` system call
        assert task is not None
        self.task = task
        self.base = task.cancelling()
        """The task's pending cancellations when the watch began (what `uncancel` returns to), as
        `asyncio.timeout` records it on entry: a read the deadline cut while a cancellation from outside is
        also pending (in the same loop step, or one a backend swallowed) ends in that `CancelledError`, not
        a retryable `DeadlineExceeded`; the read is cut at the deadline either way."""
        timer.add(self)

    def expire(self) -> None:
        """The due time passed: the read in progress is cancelled; one started later will be."""
        self.kick = None
        self.expired = True
        if self.waiting and not self.cancelled:
            self.cancelled = True
            self.task.cancel()

    def past_due(self) -> None:
        """A read starts past due: it is cut on the loop's next step unless it is done by then."""
        self.kick = self.timer.loop.call_soon(self.expire)

    def cut(self) -> None:
        """The read was cancelled: `DeadlineExceeded` if the deadline did it (else the caller re-raises)."""
        self.waiting = False
        if self.cancelled and self._withdrawn():
            deadlines = self.deadlines
            first = self.first_token_at is None and deadlines.first_token_s < deadlines.total_s
            which, seconds = (FIRST_TOKEN, deadlines.first_token_s) if first else (TOTAL, deadlines.total_s)
            raise DeadlineExceeded(which, seconds, started=self.first_token_at is not None) from None

    def settle(self) -> None:
        """After a read that ended with a delta: a cancellation the stream swallowed is withdrawn (the next
        read that waits is cut instead), and a cut scheduled for this read is dropped (it did not wait)."""
        if self.cancelled:
            self._withdrawn()
        if self.kick is not None:
            self.kick.cancel()
            self.kick = None

    def token(self, now: float) -> None:
        """The first token came at `now`: from now on only the total deadline counts. A watch still
        watched stays where it is in the timer (its due time only moves later); one the timer let go
        of when its first-token deadline passed is watched again."""
        self.first_token_at = now
        deadlines = self.deadlines
        if deadlines.first_token_s < deadlines.total_s:
            self.due = self.started + deadlines.total_s
            if self.expired:
                self.expired = False
                self.timer.add(self)

    def close(self) -> None:
        self.waiting = False
        if self.kick is not None:
            self.kick.cancel()
            self.kick = None
        self.timer.discard(self)

    def _withdrawn(self) -> bool:
        """After a read this watch cancelled ended: its cancellation withdrawn; whether it was the only one."""
        self.cancelled = False
        return self.task.uncancel() <= self.base


async def within(
    stream: AsyncIterator[Delta], deadlines: Deadlines, clock: Callable[[], float]
) -> AsyncGenerator[Delta, None]:
    """The deltas of `stream`, or `DeadlineExceeded` as soon as a deadline passes (the read is cancelled):
    a `Watch` around each read, for a reader that is not the router (which applies one itself)."""
    watch = Watch(deadlines, Timer(asyncio.get_running_loop(), clock), clock())
    try:
        while True:
            if watch.expired:
                watch.past_due()
            watch.waiting = True
            try:
                delta = await anext(stream)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                watch.cut()
                raise
            watch.waiting = False
            if watch.cancelled or watch.kick is not None:
                watch.settle()
            if watch.first_token_at is None and isinstance(delta, (TextDelta, ToolCallDelta)):
                watch.token(clock())
            yield delta
    finally:
        watch.close()
