"""Lanes started from the protocol's reads: a few per pass of the event loop, the rest in the order they came.

A lane whose turn is ready runs inside the read that brought its frame (`eager`). When many connections'
frames arrive together, one pass of the loop would run every one of those turns before it polls the
sockets again: at 128 busy connections (`python -m benchmarks load --clients 128`) a pass took 45-80 ms
and took in all 128 frames. A frame that came just after the poll waited for the whole pass, and the
kernel does not hand ready sockets over in the order their data came, so it could then be served last
in the next pass as well: two passes, twice the median latency, for the slowest 1% of turns. With this,
a pass starts at most `per_pass` lanes from reads; later ones wait in arrival order and start `per_pass`
a pass, each pass after a poll of the sockets, started as a read starts them (`eager`, a task only for
what waits): a frame waits behind the frames that came before it, about one pass's worth of turns at
most behind any that came after.

What decides is a plain state machine (`PassStarts`); the loop only lends it `call_soon` and futures.
On one connection nothing changes (the count starts again whenever nothing else is ready); with a few,
the count runs on across passes, so now and then a read waits one pass in line.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

PER_PASS = 32
"""Lanes started at once in one pass: 32 ready turns are 6-15 ms of the loop on this 2-core machine. At 128
agents (`benchmarks load --clients 128 --repeats 4`, one run): 8 gave p99 99 ms but 5% fewer turns/s (more
passes, each with its poll); 32 gave p99 92 ms at the same turns/s as starting every read at once (116 ms)."""

Start = Callable[[], "asyncio.Task[None] | None"]
"""Starts a lane as the protocol's read would (`eager.start`): the task that goes on with it, or None when done."""


class PassStarts:
    """Counts the lanes started at once; beyond `per_pass` in one pass of the loop, keeps the rest in line.

    The count runs until a callback scheduled when it reaches `per_pass` runs (`call_soon`: the loop's next
    pass, after it has polled the sockets); or, when it reaches `per_pass` with no other callback ready in
    this pass (asyncio's ready queue empty: no other read can follow in it), it starts again from zero at
    once. Not a callback at every pass's first start: a callback is a pass of its own when nothing else is
    ready (~16,000 instructions), and a connection alone starts one lane a pass. The callback starts the
    next `per_pass` lanes in line, in order, and is scheduled again while any wait; new reads queue behind them.
    """

    __slots__ = ("_marked", "_ready", "_started", "_waiting", "loop", "per_pass")

    def __init__(self, loop: asyncio.AbstractEventLoop, per_pass: int | None = None) -> None:
        self.loop = loop
        self.per_pass = PER_PASS if per_pass is None else per_pass
        self._started = 0
        """Lanes started since the count last started from zero."""
        self._marked = False
        """`_next_pass` is scheduled."""
        self._waiting: deque[tuple[asyncio.Future[None], Start]] = deque()
        self._ready: deque[Any] | None = getattr(loop, "_ready", None)
        """asyncio's queue of callbacks for this pass and the next (None on another loop, uvloop's: the
        count then always waits for the callback)."""

    def at_once(self) -> bool:
        """Whether a lane may start now, in this read (counted if so); if not, put it `in_line`."""
        if self._waiting:
            return False
        started = self._started
        if started + 1 < self.per_pass:
            self._started = started + 1
            return True
        ready = self._ready
        if ready is not None and not ready:
            self._started = 0  # nothing else in this pass, so no other read: the next one is in a pass of its own
            return True
        if started >= self.per_pass:
            return False
        self._started = started + 1
        self._mark()
        return True

    def in_line(self, start: Start) -> asyncio.Future[None]:
        """`start` called once the lanes ahead of it have started; until then (and while what it started runs)
        the future stands for the lane's worker: done when it is, and cancelling it cancels the lane (before
        it started: `start` is never called)."""
        standing = self.loop.create_future()
        self._waiting.append((standing, start))
        self._mark()
        return standing

    @property
    def waiting(self) -> int:
        """Lanes in line (cancelled ones included until their turn comes)."""
        return len(self._waiting)

    def _mark(self) -> None:
        if not self._marked:
            self._marked = True
            self.loop.call_soon(self._next_pass)

    def _next_pass(self) -> None:
        """A new pass: the next `per_pass` lanes in line started, and the count from there."""
        self._marked = False
        started = 0
        waiting = self._waiting
        while waiting and started < self.per_pass:
            standing, start = waiting.popleft()
            if standing.done():  # cancelled in line: its connection closed
                continue
            started += 1
            _stand_for(standing, start())
        self._started = started
        if waiting or started >= self.per_pass:
            self._mark()


def _stand_for(standing: asyncio.Future[None], task: asyncio.Task[None] | None) -> None:
    """`standing` done when `task` is (at once when there is none: the lane finished as it started); cancelling
    `standing` cancels `task`."""
    if task is None:
        standing.set_result(None)
        return

    def task_done(_: object) -> None:
        if not standing.done():
            standing.set_result(None)

    def standing_done(_: object) -> None:
        if standing.cancelled():
            task.cancel()

    task.add_done_callback(task_done)
    standing.add_done_callback(standing_done)
