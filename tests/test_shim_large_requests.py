"""A large request gives way to other connections between its stages instead of holding the loop throughout.

`python -m benchmarks load` (`big_frame`) measures what large frames cost another connection; here the
rule (`limits.is_large`) as a plain function, and the turn's yields counted by a task beside it.
"""

from __future__ import annotations

import asyncio

from support.wire import MODEL, user

from server_shim.backends import SimulatedBackend
from server_shim.limits import LARGE_FRAME_BYTES, LARGE_ITEMS, is_large
from server_shim.requests import CreateRequest
from server_shim.state import MemoryResponseStore
from server_shim.turn import Turn, TurnEnv


def test_requests_past_the_item_count_or_the_frame_size_are_large():
    assert not is_large(items=LARGE_ITEMS - 1, nbytes=LARGE_FRAME_BYTES - 1)
    assert is_large(items=LARGE_ITEMS)
    assert is_large(nbytes=LARGE_FRAME_BYTES)


async def _yields_while_preparing(items: int) -> int:
    """How many times another task ran while one turn of `items` new items was prepared."""
    env = TurnEnv(backend=SimulatedBackend(), store=MemoryResponseStore())
    turn = Turn(CreateRequest(model=MODEL, input=[user(f"item {n}") for n in range(items)], store=False), env, None)
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
    await turn.prepare()
    done.set()
    await beside
    return ticks


async def test_a_large_turn_lets_other_tasks_run_between_its_passes_over_the_items():
    small = await _yields_while_preparing(3)
    large = await _yields_while_preparing(LARGE_ITEMS)
    assert large >= small + 3, (small, large)
