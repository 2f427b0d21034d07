"""How a turn's batches of events leave it: pushed to a sender (the WebSocket), or pulled by a reader (HTTP).

The turn runs as one coroutine that pushes each batch (`Turn.run`): `emit(batch)` sends it at once
when it can, else the turn awaits `send(batch)`. A reader that pulls (the HTTP and chat paths iterate
`Turn.events()`) gets the same coroutine through `pulled`, so the turn's order is written once, and the
WebSocket, which pushes, drives it with no generator in between (an async generator costs asyncio's
first-iteration hook and finalizer, and an awaitable per batch, on every turn).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Generator
from typing import Any

from .events import Sent

Emit = Callable[[list[Sent]], bool]
"""Sends a batch of events at once if it can (True: nothing to await); False: the turn awaits `Send` for it."""
Send = Callable[[list[Sent]], Awaitable[None]]


class _Handed:
    """A batch handed to the reader (`pulled`): awaiting it suspends the turn until the reader asks for more."""

    __slots__ = ("batch",)

    def __init__(self, batch: list[Sent]) -> None:
        self.batch = batch

    def __await__(self) -> Generator[Any, None, None]:
        yield self


class _Passed:
    """What a pulled turn awaits on the event loop (a future, or None: a bare yield), passed on to the reader's
    task as if the reader awaited it; the task resumes the turn through the reader when it is done."""

    __slots__ = ("awaited",)

    def __init__(self, awaited: object) -> None:
        self.awaited = awaited

    def __await__(self) -> Generator[Any, None, None]:
        yield self.awaited


def unsent(batch: list[Sent]) -> bool:
    """The `emit` of a pulled turn: it sends nothing itself, each batch goes to its reader (`send`, awaited)."""
    return False


async def pulled(run: Callable[[Emit, Send], Coroutine[Any, Any, None]]) -> AsyncGenerator[list[Sent], None]:
    """`run(unsent, send)`, its batches pulled one by one: each batch it hands over suspends it until the reader
    asks for the next; what it awaits on the event loop the reader's task awaits for it; what is thrown in at
    either point (the reader's `aclose`, a cancellation) is thrown into `run` where it waits, to handle."""
    driven = run(unsent, _Handed)
    thrown: BaseException | None = None
    while True:
        try:
            step = driven.send(None) if thrown is None else driven.throw(thrown)
        except StopIteration:
            return
        thrown = None
        try:
            if step.__class__ is _Handed:
                yield step.batch
            else:
                await _Passed(step)
        except BaseException as exc:  # every one is the turn's to handle (it re-raises it)
            thrown = exc
