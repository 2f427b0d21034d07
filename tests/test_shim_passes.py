"""Lanes started from reads, a few per pass of the loop, the rest in arrival order (`server_shim.passes`).

On a real loop, from plain callbacks as the protocol's reads run (no sockets, no sleeps): a pass starts
`per_pass` lanes at once and puts the rest in line; the line goes `per_pass` a pass, in order, and new
reads queue behind it; a lane cancelled in line is never started and takes no place; the line's future
stands for the task a started lane goes on in. Then over a real server: many connections' frames arriving
together, most of them in line, all answered and chained; connections that close while their lanes wait
leave the server sound.
"""

from __future__ import annotations

import asyncio
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


def reads(starts: PassStarts, names: list[str], ran: list[tuple[str, int]], passes_: Passes) -> list:
    """One lane per name started as the protocol's read starts it: at once, or put in line; the lines' futures."""
    standing = []
    for name in names:

        def start(name: str = name) -> None:
            ran.append((name, passes_.now))

        if starts.at_once():
            start()
        else:
            standing.append(starts.in_line(start))
    return standing


async def test_a_pass_starts_its_share_at_once_and_the_rest_in_arrival_order_a_share_per_pass():
    loop = asyncio.get_running_loop()
    starts, counted, ran, lines = PassStarts(loop, per_pass=2), Passes(loop), [], []
    await in_one_callback(lambda: lines.extend(reads(starts, list("abcdefg"), ran, counted)))
    await asyncio.gather(*lines)
    assert [name for name, _ in ran] == list("abcdefg")
    when = dict(ran)
    assert when["a"] == when["b"]  # at once, in the read's pass
    assert when["c"] == when["d"] == when["b"] + 1  # the first two in line, in the next pass
    assert when["e"] == when["f"] == when["d"] + 1
    assert when["g"] == when["f"] + 1
    assert starts.waiting == 0


async def test_reads_while_lanes_wait_in_line_queue_behind_them_then_start_at_once_again():
    loop = asyncio.get_running_loop()
    starts, counted, ran, lines = PassStarts(loop, per_pass=1), Passes(loop), [], []
    await in_one_callback(lambda: lines.extend(reads(starts, ["a", "b", "c"], ran, counted)))
    await in_one_callback(lambda: lines.extend(reads(starts, ["d"], ran, counted)))  # b or c still in line
    await asyncio.gather(*lines)
    assert [name for name, _ in ran] == ["a", "b", "c", "d"]
    assert len(lines) == 3  # d went in line too
    for _ in range(3):  # the count starts from zero again once nothing waits
        await in_one_callback(lambda: None)
    await in_one_callback(lambda: lines.extend(reads(starts, ["e"], ran, counted)))
    assert len(lines) == 3 and ran[-1][0] == "e"  # at once


async def test_one_read_a_pass_always_starts_at_once():
    loop = asyncio.get_running_loop()
    starts, counted, ran, lines = PassStarts(loop, per_pass=1), Passes(loop), [], []
    for name in "abcdef":
        await in_one_callback(lambda name=name: lines.extend(reads(starts, [name], ran, counted)))
    assert lines == [] and [name for name, _ in ran] == list("abcdef")


async def test_a_lone_read_starts_at_once_and_restarts_the_count_when_nothing_else_is_ready():
    """Without the pass counter beside it (a connection alone, no other callback): the count never reaches
    the point where it would schedule a callback of its own."""
    loop = asyncio.get_running_loop()
    starts, ran, lines = PassStarts(loop, per_pass=2), [], []
    fake = Passes.__new__(Passes)
    fake.now = 0
    for name in "abcdef":
        await in_one_callback(lambda name=name: lines.extend(reads(starts, [name], ran, fake)))
    assert lines == [] and len(ran) == 6
    assert not starts._marked


async def test_a_lane_cancelled_in_line_is_never_started_and_the_lanes_behind_it_start_in_its_place():
    loop = asyncio.get_running_loop()
    starts, counted, ran, lines = PassStarts(loop, per_pass=1), Passes(loop), [], []

    def reads_then_cancel() -> None:
        lines.extend(reads(starts, ["a", "b", "c", "d"], ran, counted))
        lines[0].cancel()  # b: its connection closed while it waited

    await in_one_callback(reads_then_cancel)
    results = await asyncio.gather(*lines, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert [name for name, _ in ran] == ["a", "c", "d"]
    when = dict(ran)
    assert when["c"] == when["a"] + 1  # b took no place
    assert starts.waiting == 0


async def test_the_lines_future_stands_for_the_task_a_started_lane_goes_on_in():
    loop = asyncio.get_running_loop()
    starts = PassStarts(loop, per_pass=1)
    gates: list[asyncio.Future[None]] = []
    tasks: list[asyncio.Task[None]] = []

    def start() -> asyncio.Task[None]:
        gates.append(loop.create_future())
        tasks.append(loop.create_task(asyncio.wait_for(gates[-1], None)))
        return tasks[-1]

    lines: list[asyncio.Future[None]] = []
    await in_one_callback(lambda: (starts.at_once(), lines.extend([starts.in_line(start), starts.in_line(start)])))
    while len(tasks) < 2:
        await asyncio.sleep(0)
    assert not lines[0].done()  # its task waits
    gates[0].set_result(None)
    await lines[0]  # done once its task is
    lines[1].cancel()  # cancelling the line's future cancels the task it stands for
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]


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

    def in_line(self: PassStarts, start):
        counted.append(1)
        return original(self, start)

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
