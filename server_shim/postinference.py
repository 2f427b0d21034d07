"""Post-inference work (usage, billing, audit) overlapped with the client's next request.

The turn hands each finished response to `submit` just before the client gets its terminal
event. `submit` returns at once: the usage ledger, when there is one, accepts the record
synchronously (a journal append, so a crash right after cannot lose it), and the sinks run on the
next loop iteration, in a background task from the first one that returns an awaitable (none when
every sink is synchronous, as the built-in ones are). `aclose` waits for what is pending, so
nothing is dropped at shutdown.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from .ledger import Ledger, UsageRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """What the response object does not say: who asked, over what, where it ran, and how long it took."""

    transport: str
    """'websocket' or 'http'."""
    tenant: str | None
    """The API key's tenant id (never the key); None when the server has no keys."""
    connection_id: str | None
    """The WebSocket connection's id; None over HTTP."""
    deployment: str | None
    """The deployment that served it; None when no backend was reached."""
    ttft_s: float | None
    """Seconds from the start of the turn to the backend's first delta; None when there was none."""
    duration_s: float
    tokens_estimated: bool = False
    """The response's token counts are estimates (see `ledger.UsageRecord.estimated`), not counted."""


Sink = Callable[[dict[str, Any], TurnInfo], Awaitable[None] | None]


class PostInference:
    def __init__(self, sinks: Sequence[Sink] = (), ledger: Ledger | None = None) -> None:
        self.sinks = tuple(sinks)
        self.ledger = ledger
        self._listening = tuple(getattr(sink, "listening", None) for sink in self.sinks)
        """Each sink's `listening` (None: it always listens), looked up once rather than on every turn."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduled = 0
        """Sink runs scheduled for the next loop iteration and not started yet."""

    def submit(self, response: dict[str, Any], info: TurnInfo) -> None:
        """The sinks run on the next loop iteration, after the frames ready now are written; a task
        is made only for a sink that returns an awaitable (most turns have none to wait for)."""
        if self.ledger is not None:
            self.ledger.accept(usage_record(response, info))
        if self._listened():
            self._schedule(response, info)

    def record(
        self,
        response: dict[str, Any],
        transport: str,
        tenant: str | None,
        connection_id: str | None,
        deployment: str | None,
        ttft_s: float | None,
        duration_s: float,
        tokens_estimated: bool,
    ) -> None:
        """`submit(response, TurnInfo(...these...))`, the `TurnInfo` made only when a sink listens: what a turn
        calls (a frozen dataclass's `__init__` alone costs ~11,000 instructions, each field set through
        `object.__setattr__`; the ledger's record needs only the values)."""
        if self.ledger is not None:
            self.ledger.accept(
                record_of(response, transport, tenant, connection_id, deployment, ttft_s, duration_s, tokens_estimated)
            )
        if self._listened():
            info = TurnInfo(transport, tenant, connection_id, deployment, ttft_s, duration_s, tokens_estimated)
            self._schedule(response, info)

    def _listened(self) -> bool:
        """Whether some sink listens now (one without a `listening` attribute always does)."""
        for listening in self._listening:  # noqa: SIM110 - not any() over a generator: asked every turn
            if listening is None or listening():
                return True
        return False

    def _schedule(self, response: dict[str, Any], info: TurnInfo) -> None:
        self._scheduled += 1
        asyncio.get_running_loop().call_soon(self._start, response, info)

    def _start(self, response: dict[str, Any], info: TurnInfo) -> None:
        self._scheduled -= 1
        calls = [(sink, functools.partial(sink, response, info)) for sink in self.sinks]
        waiting = call_each(calls, response.get("id"))
        if waiting is not None:
            task = asyncio.get_running_loop().create_task(waiting)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @property
    def pending(self) -> int:
        return self._scheduled + len(self._tasks)

    async def start(self) -> None:
        if self.ledger is not None:
            await self.ledger.start()

    async def aclose(self) -> None:
        while self.pending:
            await asyncio.sleep(0)  # scheduled runs start; the tasks they make are awaited below
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self.ledger is not None:
            await self.ledger.aclose()


Call = tuple[object, Callable[[], object]]
"""A sink to run (what names it in the log line when it fails) and how to call it."""


def call_each(calls: Sequence[Call], response_id: str | None) -> Coroutine[Any, Any, None] | None:
    """Run each call in order, each on its own (a failure is logged and stops no other).

    Synchronous ones run at once; from the first that returns an awaitable on, the rest run in
    the coroutine returned, in order. None when everything has run: no task is needed.
    """
    for index, (name, call) in enumerate(calls):
        waiting = _call(name, call, response_id)
        if waiting is not None:
            return _finish(name, waiting, calls[index + 1 :], response_id)
    return None


async def _finish(name: object, waiting: Awaitable[Any], rest: Sequence[Call], response_id: str | None) -> None:
    await _wait(name, waiting, response_id)
    for later, call in rest:
        result = _call(later, call, response_id)
        if result is not None:
            await _wait(later, result, response_id)


def _call(name: object, call: Callable[[], object], response_id: str | None) -> Awaitable[Any] | None:
    try:
        result = call()
    except Exception:
        log.exception("post-inference sink %s failed for %s", name, response_id)
        return None
    if result is None:  # what a synchronous sink returns: no `isawaitable` walk through the awaitable types
        return None
    return result if inspect.isawaitable(result) else None


async def _wait(name: object, waiting: Awaitable[Any], response_id: str | None) -> None:
    try:
        await waiting
    except Exception:
        log.exception("post-inference sink %s failed for %s", name, response_id)


def usage_record(response: dict[str, Any], info: TurnInfo) -> UsageRecord:
    """The response's record."""
    return record_of(
        response,
        info.transport,
        info.tenant,
        info.connection_id,
        info.deployment,
        info.ttft_s,
        info.duration_s,
        info.tokens_estimated,
    )


def record_of(
    response: dict[str, Any],
    transport: str,
    tenant: str | None,
    connection_id: str | None,
    deployment: str | None,
    ttft_s: float | None,
    duration_s: float,
    tokens_estimated: bool,
) -> UsageRecord:
    """The response's record from `TurnInfo`'s values, given in field order (keywords cost a dict per call)."""
    usage = response.get("usage") or {}
    return _usage_record(
        (
            response["id"],
            response.get("created_at") or 0.0,
            tenant,
            response.get("model") or "",
            deployment,
            response.get("status") or "",
            transport,
            connection_id,
            usage.get("input_tokens") or 0,
            (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0,
            usage.get("output_tokens") or 0,
            None if ttft_s is None else to_microseconds(ttft_s * 1000),
            to_microseconds(duration_s * 1000),
            tokens_estimated,
        )
    )


def to_microseconds(value: float) -> float:
    """`round(value, 3)`, the same float, at about a third of its cost where no tie is near.

    `round` with digits writes the decimal digits out and parses them back (~2,500 instructions). Scaled
    by 1,000 (the product is off by at most half an ulp, under 2**-14 below `_SCALED_UNDER`), a value
    whose fraction is outside `_NEAR_TIE` (2**-12 either side of one half) rounds to the integer the exact product
    rounds to, and that integer / 1,000, divided in integers, is the float nearest the rounded decimal:
    what `round` returns. Values near a tie, zero or negative, huge, inf or NaN go to `round` itself.
    """
    scaled = value * 1000
    if 0.0 < scaled < _SCALED_UNDER and not _NEAR_TIE[0] < scaled % 1.0 < _NEAR_TIE[1]:
        return (scaled + 0.5) // 1.0 / 1000  # float operations only: no call, no int made
    return round(value, 3)


_SCALED_UNDER = 2.0**40
_NEAR_TIE = (0.5 - 2.0**-12, 0.5 + 2.0**-12)
_usage_record = functools.partial(tuple.__new__, UsageRecord)
"""`UsageRecord(*values)` in C: a named tuple's `__new__` is a Python function, called from C (~2,500 instructions)."""
