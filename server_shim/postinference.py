"""Post-inference work (usage, billing, audit) overlapped with the client's next request.

The turn hands each finished response to `submit` just before the client gets its terminal
event. `submit` returns at once: the usage ledger, when there is one, accepts the record
synchronously (a journal append, so a crash right after cannot lose it), and the sinks run in
a background task. `aclose` waits for what is pending, so nothing is dropped at shutdown.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
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


Sink = Callable[[dict[str, Any], TurnInfo], Awaitable[None] | None]


class PostInference:
    def __init__(self, sinks: Sequence[Sink] = (), ledger: Ledger | None = None) -> None:
        self.sinks = tuple(sinks)
        self.ledger = ledger
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, response: dict[str, Any], info: TurnInfo) -> None:
        if self.ledger is not None:
            self.ledger.accept(usage_record(response, info))
        if not self.sinks:
            return
        task = asyncio.get_running_loop().create_task(self._run(response, info))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, response: dict[str, Any], info: TurnInfo) -> None:
        for sink in self.sinks:
            try:
                result = sink(response, info)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("post-inference sink %r failed for %s", sink, response.get("id"))

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def start(self) -> None:
        if self.ledger is not None:
            await self.ledger.start()

    async def aclose(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self.ledger is not None:
            await self.ledger.aclose()


def usage_record(response: dict[str, Any], info: TurnInfo) -> UsageRecord:
    usage = response.get("usage") or {}
    return UsageRecord(
        id=response["id"],
        created_at=response.get("created_at") or 0.0,
        tenant=info.tenant,
        model=response.get("model") or "",
        deployment=info.deployment,
        status=response.get("status") or "",
        transport=info.transport,
        connection_id=info.connection_id,
        input_tokens=usage.get("input_tokens") or 0,
        cached_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens") or 0,
        output_tokens=usage.get("output_tokens") or 0,
        ttft_ms=None if info.ttft_s is None else round(info.ttft_s * 1000, 3),
        duration_ms=round(info.duration_s * 1000, 3),
    )
