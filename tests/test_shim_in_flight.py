"""A connection's in-flight slots: taken at once while free, else handed over in arrival order; a lane cancelled
while it waits, or just as it was handed a slot, loses no slot."""

from __future__ import annotations

import asyncio

import pytest

from server_shim.in_flight import InFlight


async def test_slots_are_taken_at_once_then_handed_to_the_waiting_lanes_in_arrival_order():
    slots = InFlight(2, asyncio.get_running_loop())
    assert slots.take_now() and slots.take_now()
    assert not slots.take_now() and slots.free == 0
    order: list[str] = []

    async def lane(name: str) -> None:
        await slots.take()
        order.append(name)

    waiting = [asyncio.create_task(lane(name)) for name in "abc"]
    await asyncio.sleep(0)
    slots.give()
    slots.give()
    await asyncio.sleep(0)
    assert order == ["a", "b"] and slots.free == 0
    slots.give()  # a's response ends: c's turn
    await asyncio.gather(*waiting)
    assert order == ["a", "b", "c"] and slots.free == 0
    slots.give()
    slots.give()  # b's and c's end: both slots free, none waiting
    assert slots.free == 2 and not slots._waiters


async def test_a_lane_cancelled_while_it_waits_or_as_it_is_handed_a_slot_loses_none():
    slots = InFlight(1, asyncio.get_running_loop())
    assert slots.take_now()
    gone, handed, last = (asyncio.create_task(slots.take()) for _ in range(3))
    await asyncio.sleep(0)
    gone.cancel()  # while it waits: it leaves the queue
    with pytest.raises(asyncio.CancelledError):
        await gone
    slots.give()  # to `handed`, which is cancelled before it runs: the slot goes on to `last`
    handed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handed
    await asyncio.wait_for(last, 1)
    assert slots.free == 0 and not slots._waiters
    slots.give()
    assert slots.free == 1 and slots.take_now()
