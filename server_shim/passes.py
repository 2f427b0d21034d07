"""Lanes started from the protocol's reads: a few per pass of the event loop, the rest in the order they came.

A lane whose turn is ready runs inside the read that brought its frame (`eager`). When many connections'
frames arrive together, one pass of the loop would run every one of those turns before it polls the
sockets again: at 128 busy connections (`python -m benchmarks load --clients 128`) a pass took 45-80 ms
and took in all 128 frames. A frame that came just after the poll waited for the whole pass, and the
kernel does not hand ready sockets over in the order their data came, so it could then be served last
in the next pass as well: two passes, twice the median latency, for the slowest 1% of turns. With this,
a pass starts at most `per_pass` lanes from reads; later ones wait in arrival order and start `per_pass`
a pass, each pass after a poll of the sockets: a frame waits behind the frames that came before it,
about one pass's worth of turns at most behind any that came after.

What decides is a plain state machine (`PassStarts`); the loop only lends it `call_soon` and futures.
On one connection, or a few, nothing changes: each pass has fewer than `per_pass` reads.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

PER_PASS = 8
"""Lanes started at once in one pass: 8 ready turns are 1.5-4 ms of the loop on this 2-core machine."""


class PassStarts:
    """Counts the lanes started at once; beyond `per_pass` in one pass of the loop, hands out places in line.

    The count runs until a callback scheduled when it reaches `per_pass` runs (`call_soon`: the loop's next
    pass, after it has polled the sockets), and starts again from zero there; or, when it reaches `per_pass`
    with no other callback ready in this pass (asyncio's ready queue empty: no other read can follow in it),
    from zero at once. Not a callback at every pass's first start: a callback is a pass of its own when
    nothing else is ready (~16,000 instructions), and a connection alone starts one lane a pass. The
    callback lets the next `per_pass` waiting lanes go, in order; a lane let go runs in the pass after, and
    until every one let go has run, new reads queue behind them.
    """

    __slots__ = ("_marked", "_ready", "_released", "_started", "_waiting", "loop", "per_pass")

    def __init__(self, loop: asyncio.AbstractEventLoop, per_pass: int | None = None) -> None:
        self.loop = loop
        self.per_pass = PER_PASS if per_pass is None else per_pass
        self._started = 0
        """Lanes started (at once, or let go) since the count last started from zero."""
        self._released = 0
        """Lanes let go whose tasks have not run yet."""
        self._marked = False
        """`_next_pass` is scheduled."""
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._ready: deque[Any] | None = getattr(loop, "_ready", None)
        """asyncio's queue of callbacks for this pass and the next (None on another loop, uvloop's: the
        count then always waits for the callback)."""

    def at_once(self) -> bool:
        """Whether a lane may start now, in this read (counted if so); if not, run it `in_line`."""
        if self._waiting or self._released:
            return False
        started = self._started
        if started >= self.per_pass:
            return False
        if started + 1 < self.per_pass:
            self._started = started + 1
        elif self._ready is not None and not self._ready:
            self._started = 0  # nothing else in this pass, so no other read: the next one is in a pass of its own
        else:
            self._started = started + 1
            self._mark()
        return True

    def in_line(self, coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """`coro`, for a task to run once the lanes ahead of it have been let go (its place taken now)."""
        waiter = self.loop.create_future()
        self._waiting.append(waiter)
        self._mark()
        return InLine(coro, waiter, self)

    @property
    def waiting(self) -> int:
        """Lanes in line, not yet let go (cancelled ones included until their turn comes)."""
        return len(self._waiting)

    @property
    def let_go(self) -> int:
        """Lanes let go whose tasks have not run yet."""
        return self._released

    def _ran(self) -> None:
        self._released -= 1

    def _mark(self) -> None:
        if not self._marked:
            self._marked = True
            self.loop.call_soon(self._next_pass)

    def _next_pass(self) -> None:
        """A new pass: its count from zero, and the next `per_pass` lanes in line let go."""
        self._marked = False
        self._started = 0
        waiting = self._waiting
        while waiting and self._started < self.per_pass:
            waiter = waiting.popleft()
            if not waiter.done():  # a lane cancelled in line (its connection closed) takes no place
                waiter.set_result(None)
                self._started += 1
                self._released += 1
        if waiting or self._released:
            self._mark()


class InLine(Coroutine[Any, Any, T]):
    """`coro` behind its place in line, as a task runs it: the task's steps wait on the place until it is let
    go, then go to `coro`. Cancelled (thrown into) or closed before that, at any point, even before the task's
    first step, it gives the place up and closes `coro` unstarted: a lane whose connection closed in line takes
    no place and leaves no coroutine never awaited. Only a task runs it (as `eager.Continued`)."""

    __slots__ = ("_coro", "_passes", "_waiter")

    def __init__(self, coro: Coroutine[Any, Any, T], waiter: asyncio.Future[None], passes: PassStarts) -> None:
        self._coro = coro
        self._waiter: asyncio.Future[None] | None = waiter
        self._passes = passes

    def send(self, value: Any) -> Any:
        waiter = self._waiter
        if waiter is not None:
            if not waiter.done():
                waiter._asyncio_future_blocking = True  # what `await waiter` yields to the task
                return waiter
            self._waiter = None
            self._passes._ran()
            value = None
        return self._coro.send(value)

    def throw(self, *exc: Any) -> Any:
        if self._waiter is not None:  # `coro` never started: the exception ends it here
            self._give_up()
            raise _exception(*exc)
        return self._coro.throw(*exc)

    def close(self) -> None:
        if self._waiter is not None:
            self._give_up()
        self._coro.close()

    def _give_up(self) -> None:
        waiter, self._waiter = self._waiter, None
        assert waiter is not None
        if waiter.done() and not waiter.cancelled():
            self._passes._ran()  # let go, never to run
        else:
            waiter.cancel()  # `_next_pass` passes over it
        self._coro.close()  # unstarted: closed without a "never awaited" warning

    @property
    def __name__(self) -> str:
        """The coroutine's name, for the task's `repr`."""
        return str(getattr(self._coro, "__qualname__", type(self._coro).__name__))

    def __await__(self) -> Generator[Any, None, T]:
        step: Callable[..., Any] = self.send
        arg: Any = None
        while True:
            try:
                yielded = step(arg)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                arg, step = (yield yielded), self.send
            except BaseException as exc:
                arg, step = exc, self.throw


def _exception(kind: Any, value: Any = None, _traceback: Any = None) -> BaseException:
    """What `throw(*exc)` throws, in either of its forms (an exception, or its type and value)."""
    if isinstance(kind, BaseException):
        return kind
    return value if isinstance(value, BaseException) else kind() if value is None else kind(value)
