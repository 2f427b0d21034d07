"""A connection's in-flight responses: `max_in_flight` slots, one taken at once when free, else awaited in turn.

What `asyncio.Semaphore` does for the lanes, without a coroutine per request when a slot is free (the
usual case: a coroutine awaited costs ~1,000 instructions) and without `locked()`'s generator: a slot a
response gives back goes straight to the longest waiting lane, so slots are free only while none waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class InFlight:
    """`slots` responses at once; lanes beyond that wait, first come first served."""

    __slots__ = ("_loop", "_waiters", "free")

    def __init__(self, slots: int, loop: asyncio.AbstractEventLoop) -> None:
        self.free = slots
        """Slots no response holds (0 while any lane waits for one)."""
        self._loop = loop
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """A free slot taken, or False: `await take()` for one."""
        if self.free:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot, handed over by `give`. Cancelled as it was handed one, it hands it on."""
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def give(self) -> None:
        """A slot back: to the longest waiting lane still waiting, else free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1
