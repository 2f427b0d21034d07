"""Per-turn deadlines on a backend stream: time to first token, and total time.

A stalled backend, or one that trickles keep-alive comments, never trips an HTTP read timeout
that counts idle time per read; these deadlines count from the request's start. The decision
(`Deadlines.next`) is a plain function of the start, the first token's time and `now`; the
async wrapper only applies it around each read, with the clock it is given.
"""

from __future__ import annotations

import asyncio
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


class _Alarm:
    """One timer per stream, armed at its nearest deadline: it cancels the read in progress when it
    fires (as `asyncio.timeout` around each read would, without a timer made per delta)."""

    __slots__ = ("base", "cancelled", "fired", "handle", "reading", "which")

    def __init__(self) -> None:
        self.handle: asyncio.Handle | None = None
        self.which = TOTAL
        self.reading: asyncio.Task[object] | None = None
        """The task waiting on a read, while one is in progress."""
        self.fired = False
        self.cancelled = False
        self.base = 0
        """The task's pending cancellations before this alarm added one (what `uncancel` returns to)."""

    def arm(self, loop: asyncio.AbstractEventLoop, left: float, which: str) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.which = which
        self.handle = loop.call_later(max(left, 0.0), self.fire)

    def fire(self) -> None:
        self.handle = None
        self.fired = True
        if self.reading is not None and not self.cancelled:
            self.base = self.reading.cancelling()
            self.cancelled = True
            self.reading.cancel()

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def expired(self, task: asyncio.Task[object]) -> bool:
        """After a read ended (a cancellation included): whether the alarm cut it, its cancellation withdrawn."""
        if not self.cancelled:
            return False
        self.cancelled = False
        return task.uncancel() <= self.base


class Watch:
    """The deadlines of one backend stream, applied by its reader around each read (no generator layer between).

    One timer for the nearest deadline, moved once (first token -> total). A deadline that passes
    while the caller holds a delta cuts the next read that has to wait, as it would have cut it
    had the read begun with no time left; a delta ready at once still goes through. The reader:
    `delta = await anext(watch.reading(stream))`, then `watch.got(delta)`; on `CancelledError`,
    `watch.cut()` before re-raising; `close()` when done. It must read from the task that made it.
    """

    __slots__ = ("alarm", "clock", "deadlines", "first_token_at", "loop", "started", "task")

    def __init__(self, deadlines: Deadlines, clock: Callable[[], float]) -> None:
        self.loop = asyncio.get_running_loop()
        self.deadlines = deadlines
        self.clock = clock
        self.started = clock()
        self.first_token_at: float | None = None
        self.alarm = _Alarm()
        self.alarm.arm(self.loop, *deadlines.next(self.started, None, self.started))
        task = asyncio.current_task()  # the reading task, once: each lookup is a `getpid` system call
        assert task is not None
        self.task = task

    def reading(self, stream: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        """A read of `stream` starts: the alarm may cut it from now on (at once if it is past due)."""
        alarm = self.alarm
        if alarm.fired:
            alarm.handle = self.loop.call_soon(alarm.fire)
        alarm.reading = self.task
        return stream

    def cut(self) -> None:
        """The read was cancelled: `DeadlineExceeded` if the alarm did it (else the caller re-raises)."""
        alarm = self.alarm
        alarm.reading = None
        if alarm.expired(self.task):
            seconds = self.deadlines.first_token_s if alarm.which == FIRST_TOKEN else self.deadlines.total_s
            raise DeadlineExceeded(alarm.which, seconds, started=self.first_token_at is not None) from None

    def got(self, delta: Delta) -> None:
        """A read ended with `delta`; the first token moves the timer to the total deadline."""
        alarm = self.alarm
        alarm.reading = None
        alarm.expired(self.task)  # a cancellation the stream swallowed is withdrawn; the next read is cut
        if alarm.fired:
            alarm.disarm()
        if self.first_token_at is None and isinstance(delta, (TextDelta, ToolCallDelta)):
            self.first_token_at = self.clock()
            if alarm.which == FIRST_TOKEN:  # from now on only the total deadline counts
                alarm.fired = False
                alarm.arm(self.loop, *self.deadlines.next(self.started, self.first_token_at, self.first_token_at))

    def close(self) -> None:
        self.alarm.reading = None
        self.alarm.disarm()


async def within(
    stream: AsyncIterator[Delta], deadlines: Deadlines, clock: Callable[[], float]
) -> AsyncGenerator[Delta, None]:
    """The deltas of `stream`, or `DeadlineExceeded` as soon as a deadline passes (the read is cancelled):
    a `Watch` around each read, for a reader that is not the router (which applies one itself)."""
    watch = Watch(deadlines, clock)
    try:
        while True:
            try:
                delta = await anext(watch.reading(stream))
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                watch.cut()
                raise
            watch.got(delta)
            yield delta
    finally:
        watch.close()
