"""Counting how often other tasks ran while one piece of work was awaited: work done, not wall-clock time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def ticks_beside(work: Awaitable[Any]) -> tuple[int, Any]:
    """How many times another task ran while `work` was awaited, and what it gave."""
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(0)
            ticks += 1

    beside = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker is waiting for its turn
    ticks = 0
    result = await work
    done.set()
    await beside
    return ticks, result
