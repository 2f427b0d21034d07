"""Memory given back after clients leave: no per-connection reference cycles, bounded token window, the trimmer.

The load suite (`python -m benchmarks load`) measures RSS; these check the causes it found, each on its own:
a closed connection's objects waited for a full collection (a cycle through the scope), the router's
token window kept an entry per turn forever, and nothing ran that full collection after a burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import weakref
from collections.abc import Iterator

import pytest
from support.wire import MODEL, ws_url
from websockets.asyncio.client import connect as ws_connect

from server_shim.health import TokenWindow
from server_shim.trim import GC_SHARE, Trimmer, allocator_line, next_allowed, trim_at
from server_shim.ws_protocol import ShimWebSocketProtocol


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Only reference counting frees objects meanwhile (an explicit `gc.collect()` still runs)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def _until(condition, timeout_s: float = 5.0) -> bool:
    """Poll `condition` on the loop until it holds or `timeout_s` passes; returns the last value."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)
    return True


async def test_a_closed_connection_is_freed_by_reference_counting_without_waiting_for_the_collector(make_server):
    server = make_server()
    server.shim.trimmer.delay_s = 3600.0  # its collection would free the cycle too; this is about not needing it
    with collector_off():
        async with ws_connect(ws_url(server)) as ws:
            (protocol,) = [c for c in server.server.server_state.connections if isinstance(c, ShimWebSocketProtocol)]
            gone = weakref.ref(protocol)
            del protocol
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
            while json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] != "response.completed":
                pass
        assert await _until(lambda: gone() is None)


async def test_the_trimmer_collects_cycles_left_behind_after_a_burst_of_closes():
    class Node:
        other: object = None

    with collector_off():
        node = Node()
        node.other = node  # a cycle: only a collection frees it
        freed = weakref.ref(node)
        del node
        trimmer = Trimmer(delay_s=0.01)
        trimmer.maybe_trim()
        trimmer.maybe_trim()  # coalesced with the first
        assert await _until(lambda: freed() is None)


def test_a_trim_waits_for_the_end_of_the_burst_but_not_forever_and_keeps_collections_rare():
    assert trim_at(first_close=100.0, last_close=100.0, allowed=0.0, delay_s=1.0, max_wait_s=10.0) == 101.0
    assert trim_at(first_close=100.0, last_close=103.5, allowed=0.0, delay_s=1.0, max_wait_s=10.0) == 104.5
    assert trim_at(first_close=100.0, last_close=109.9, allowed=0.0, delay_s=1.0, max_wait_s=10.0) == 110.0
    took = 0.05
    allowed = next_allowed(now=100.0, took_s=took)
    assert allowed == pytest.approx(
        100.0 + took / GC_SHARE
    )  # a 50 ms collection: the next one 5 s later at the soonest
    assert trim_at(first_close=101.0, last_close=101.0, allowed=allowed, delay_s=1.0, max_wait_s=10.0) == allowed


def test_the_token_window_holds_a_fixed_number_of_buckets_however_many_turns_pass():
    window = TokenWindow()
    for n in range(100_000):
        window.record(3, now=n * 0.01)  # 1,000 s of turns, 100 a second
    assert len(window._counts) == 60
    assert window.total(now=999.99) == 60 * 100 * 3
    assert window.total(now=2_000.0) == 0


def test_the_start_up_line_on_memory_names_the_allocator_in_use():
    assert "PYTHONMALLOC=malloc gives it back" in allocator_line(None)
    assert "PYTHONMALLOC=malloc gives it back" in allocator_line("pymalloc")
    assert "goes back to the system" in allocator_line("malloc")
