"""Post-inference work (usage, billing, audit) overlapped with the client's next request.

The turn hands each finished response to `submit`, which returns at once; the sinks run in
a background task. `aclose` waits for what is pending, so nothing is dropped at shutdown.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

Sink = Callable[[dict[str, Any], str], Awaitable[None] | None]


class PostInference:
    def __init__(self, sinks: Sequence[Sink] = ()) -> None:
        self.sinks = tuple(sinks)
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, response: dict[str, Any], transport: str) -> None:
        if not self.sinks:
            return
        task = asyncio.get_running_loop().create_task(self._run(response, transport))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, response: dict[str, Any], transport: str) -> None:
        for sink in self.sinks:
            try:
                result = sink(response, transport)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("post-inference sink %r failed for %s", sink, response.get("id"))

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def aclose(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
