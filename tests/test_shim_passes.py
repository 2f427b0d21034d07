"""Lanes started from reads, a few per pass of the loop, the rest in arrival order (`server_shim.passes`).

On a real loop, from plain callbacks as the protocol's reads run (no sockets, no sleeps): a pass starts
`per_pass` lanes at once and puts the rest in line; the line goes `per_pass` a pass, in order, and new
reads queue behind it; a lane cancelled in line never starts, takes no place and leaves no coroutine
unawaited. Then over a real server: many connections' frames arriving together, most of them in line,
all answered and chained; connections that close while their lanes wait leave the server sound.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Callable

import orjson
import pytest
from support.wire import MODEL, ws_url
from websockets.asyncio.client import connect

from server_shim import passes
from server_shim.passes import PassStarts


class Passes:
    """The loop's passes, counted by a callback that schedules itself again each pass."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = 0
        self._loop = loop
        loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.now += 1
        self._loop.call_soon(self._tick)


async def in_one_callback(call: Callable[[], None]) -> None:
    """`call()` run as a plain callback (as `data_received` runs), awaited to its end."""
    done = asyncio.get_running_loop().create_future()

    def callback() -> None:
        call()
        done.set_result(None)

    asyncio.get_running_loop().call_soon(callback)
    await done


def reads(starts: PassStarts, names: list[str], ran: list[tuple[str, int]], passes_: Passes, tasks: list) -> None:
    """One lane per name started as the protocol's read starts it: at once, or a task in line."""
    for name in names:

        async def lane(name: str = name) -> None:
            ran.append((name, passes_.now))

        if starts.at_once():
            _run_now(lane())
        else:
            tasks.append(asyncio.get_running_loop().create_task(starts.in_line(lane())))


def _run_now(coro) -> None:
    """A lane that does not wait, run whole in the read (as `eager.start` would)."""
    with pytest.raises(StopIteration):
        coro.send(None)


async def test_a_pass_starts_its_share_at_once_and_the_rest_in_arrival_order_a_share_per_pass():
    loop = asyncio.get_running_loop()
    starts, counted, ran, tasks = PassStarts(loop, per_pass=2), Passes(loop), [], []
    await in_one_callback(lambda: reads(starts, list("abcdefg"), ran, counted, tasks))
    await asyncio.gather(*tasks)
    order = [name for name, _ in ran]
    assert order == list("abcdefg")
    when = dict(ran)
    assert when["a"] == when["b"]  # at once, in the read's pass
    assert when["c"] == when["d"] > when["b"]  # the first two in line, together, in a later pass
    assert when["e"] == when["f"] > when["d"]
    assert when["g"] > when["f"]
    assert starts.waiting == 0


async def test_reads_while_lanes_wait_in_line_queue_behind_them_then_start_at_once_again():
    loop = asyncio.get_running_loop()
    starts, counted, ran, tasks = PassStarts(loop, per_pass=1), Passes(loop), [], []
    await in_one_callback(lambda: reads(starts, ["a", "b", "c"], ran, counted, tasks))
    await in_one_callback(lambda: reads(starts, ["d"], ran, counted, tasks))  # a later pass: b and c still in line
    await asyncio.gather(*tasks)
    assert [name for name, _ in ran] == ["a", "b", "c", "d"]
    assert len(tasks) == 3  # d went in line too
    await in_one_callback(lambda: reads(starts, ["e"], ran, counted, tasks))
    assert len(tasks) == 3 and ran[-1][0] == "e"  # the line empty: at once, no task


async def test_one_read_a_pass_always_starts_at_once():
    loop = asyncio.get_running_loop()
    starts, counted, ran, tasks = PassStarts(loop, per_pass=1), Passes(loop), [], []
    for name in "abcdef":
        await in_one_callback(lambda name=name: reads(starts, [name], ran, counted, tasks))
    assert tasks == [] and [name for name, _ in ran] == list("abcdef")


async def test_a_lane_cancelled_in_line_never_starts_leaves_nothing_unawaited_and_the_lanes_behind_it_run():
    loop = asyncio.get_running_loop()
    starts, counted, ran, tasks = PassStarts(loop, per_pass=1), Passes(loop), [], []

    def reads_then_cancel() -> None:
        reads(starts, ["a", "b", "c", "d"], ran, counted, tasks)
        tasks[0].cancel()  # b: its connection closed while it waited

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await in_one_callback(reads_then_cancel)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        gc.collect()
    assert isinstance(results[0], asyncio.CancelledError)
    assert [name for name, _ in ran] == ["a", "c", "d"]
    assert starts.waiting == 0 and starts.let_go == 0
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_a_lane_cancelled_after_it_was_let_go_but_before_it_ran_gives_its_place_back():
    loop = asyncio.get_running_loop()
    starts, counted, ran, tasks = PassStarts(loop, per_pass=1), Passes(loop), [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def cancel_c_once_let_go() -> None:  # each pass, after the pass's start has let lanes go
            if starts.let_go and ran[-1][0] == "b":  # c let go (b has run), c's task not yet run
                tasks[1].cancel()
            elif len(ran) < 3:
                loop.call_soon(cancel_c_once_let_go)

        def reads_then_watch() -> None:
            reads(starts, ["a", "b", "c", "d"], ran, counted, tasks)
            loop.call_soon(cancel_c_once_let_go)

        await in_one_callback(reads_then_watch)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        gc.collect()
    assert isinstance(results[1], asyncio.CancelledError)
    assert [name for name, _ in ran] == ["a", "b", "d"]
    assert starts.waiting == 0 and starts.let_go == 0
    assert not [w for w in caught if "never awaited" in str(w.message)]
    await in_one_callback(lambda: reads(starts, ["e"], ran, counted, tasks))
    assert ran[-1][0] == "e" and len(tasks) == 3  # the line empty again: at once


# --- over a real server ------------------------------------------------------------------------------


def create(text: str, previous: str | None = None) -> bytes:
    body = {"type": "response.create", "model": MODEL, "input": text, "store": False}
    if previous:
        body["previous_response_id"] = previous
    return orjson.dumps(body)


async def answered(ws) -> dict:
    while True:
        event = orjson.loads(await asyncio.wait_for(ws.recv(decode=False), 10))
        if event["type"] in ("response.completed", "error", "response.failed"):
            return event


def count_in_line(monkeypatch) -> list[int]:
    """How many lanes went in line (one entry each), across the server's thread."""
    counted: list[int] = []
    original = PassStarts.in_line

    def in_line(self: PassStarts, coro):
        counted.append(1)
        return original(self, coro)

    monkeypatch.setattr(PassStarts, "in_line", in_line)
    return counted


async def test_frames_arriving_together_on_many_connections_are_all_answered_and_chain_when_most_wait_in_line(
    make_server, monkeypatch
):
    monkeypatch.setattr(passes, "PER_PASS", 2)
    in_line = count_in_line(monkeypatch)
    server = make_server()
    url = ws_url(server)
    sockets = [await connect(url) for _ in range(12)]
    try:
        previous: list[str | None] = [None] * len(sockets)
        for round_ in range(3):
            await asyncio.gather(
                *(ws.send(create(f"round {round_}", p), text=True) for ws, p in zip(sockets, previous, strict=True))
            )
            events = await asyncio.gather(*(answered(ws) for ws in sockets))
            assert [e["type"] for e in events] == ["response.completed"] * len(sockets), events
            previous = [e["response"]["id"] for e in events]
        assert server.shim.stats.turns == 3 * len(sockets)
        assert in_line  # the frames came together: some lanes waited in line
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))


async def test_connections_that_close_while_their_lanes_wait_in_line_leave_the_server_sound(make_server, monkeypatch):
    monkeypatch.setattr(passes, "PER_PASS", 1)
    server = make_server()
    url = ws_url(server)
    sockets = [await connect(url) for _ in range(10)]
    staying, leaving = sockets[:5], sockets[5:]
    await asyncio.gather(*(ws.send(create("hello"), text=True) for ws in sockets))
    for ws in leaving:
        ws.transport.abort()  # gone at once, most likely with its lane still in line
    events = await asyncio.gather(*(answered(ws) for ws in staying))
    assert [e["type"] for e in events] == ["response.completed"] * 5
    await asyncio.gather(*(ws.close() for ws in staying))
    for _ in range(200):
        if not server.shim.connections:
            break
        await asyncio.sleep(0.05)
    assert not server.shim.connections
    async with connect(url) as ws:  # the server goes on as before
        await ws.send(create("after"), text=True)
        first = await answered(ws)
        await ws.send(create("again", first["response"]["id"]), text=True)
        assert (await answered(ws))["type"] == "response.completed"
