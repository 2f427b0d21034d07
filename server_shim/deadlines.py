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


async def within(
    stream: AsyncIterator[Delta], deadlines: Deadlines, clock: Callable[[], float]
) -> AsyncGenerator[Delta, None]:
    """The deltas of `stream`, or `DeadlineExceeded` as soon as a deadline passes (the read is cancelled)."""
    started = clock()
    first_token_at: float | None = None
    while True:
        left, which = deadlines.next(started, first_token_at, clock())
        try:
            async with asyncio.timeout(max(left, 0.0)):
                delta = await anext(stream)
        except StopAsyncIteration:
            return
        except TimeoutError:
            seconds = deadlines.first_token_s if which == FIRST_TOKEN else deadlines.total_s
            raise DeadlineExceeded(which, seconds, started=first_token_at is not None) from None
        if first_token_at is None and isinstance(delta, (TextDelta, ToolCallDelta)):
            first_token_at = clock()
        yield delta
