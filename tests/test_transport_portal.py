"""The sync client's loop thread, and a stream read on one thread while another closes it.

No server here: the stream is a plain async generator on the portal's loop, so the race between
a reader waiting for its next chunk and a `close()` from another thread is driven directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncGenerator

import httpx2
import pytest

from ws_transport import SessionClosed
from ws_transport.portal import Portal, PortalStream


class Chunks:
    """An endless byte stream that notes when its generator was closed, and by whom."""

    def __init__(self, *, pause_s: float = 0.0) -> None:
        self.pause_s = pause_s
        self.finalized = threading.Event()
        self.closed = False

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        try:
            while True:
                await asyncio.sleep(self.pause_s)
                yield b"data: x\n\n"
        finally:
            await asyncio.sleep(0)  # unwinding awaits, as the SSE stream's does (it frees the lane)
            self.finalized.set()

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def portal() -> Portal:
    portal = Portal("test-portal")
    yield portal
    portal.stop()


def read_until_closed(stream: PortalStream, started: threading.Event, outcome: list[object]) -> None:
    seen = 0
    try:
        for _ in stream:
            seen += 1
            started.set()
        outcome.append(seen)
    except Exception as exc:
        outcome.append(exc)


@pytest.mark.parametrize("pause_s", [0.0, 0.001], ids=["busy", "waiting"])
def test_close_from_another_thread_always_stops_the_reader_with_a_read_error(portal: Portal, pause_s: float) -> None:
    """100 races between a reader and a closer: each ends with ReadError and a finalized generator."""
    for _ in range(100):
        chunks = Chunks(pause_s=pause_s)
        stream = PortalStream(chunks, portal)
        started, outcome = threading.Event(), []
        reader = threading.Thread(target=read_until_closed, args=(stream, started, outcome))
        reader.start()
        assert started.wait(5)
        stream.close()
        reader.join(5)
        assert not reader.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], httpx2.ReadError), outcome
        assert chunks.finalized.is_set() and chunks.closed


def test_close_before_reading_and_twice_is_harmless(portal: Portal) -> None:
    portal.call(asyncio.sleep(0))  # a stream exists only once a turn ran on the portal's loop
    chunks = Chunks()
    stream = PortalStream(chunks, portal)
    stream.close()
    stream.close()
    with pytest.raises(httpx2.ReadError):
        next(iter(stream))
    assert chunks.closed


def test_a_stopped_portal_refuses_work_with_session_closed() -> None:
    portal = Portal("test-portal")
    assert portal.call(asyncio.sleep(0, result=1)) == 1
    portal.stop()
    with pytest.raises(SessionClosed, match="closed"):
        portal.call(asyncio.sleep(0))
    assert not portal.running
    assert "test-portal" not in {t.name for t in threading.enumerate()}


def test_waiting_on_the_portal_from_its_own_thread_is_refused(portal: Portal) -> None:
    async def nested() -> None:
        portal.call(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="deadlock"):
        portal.call(nested())


def test_a_call_returns_raises_times_out_and_reports_cancellation_as_run_coroutine_threadsafe_did(
    portal: Portal,
) -> None:
    assert portal.call(asyncio.sleep(0, result="value")) == "value"

    async def fails() -> None:
        raise LookupError("from the loop")

    with pytest.raises(LookupError, match="from the loop"):
        portal.call(fails())

    release = threading.Event()

    async def slow() -> str:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return "late"

    with pytest.raises(TimeoutError):
        portal.call(slow(), timeout=0.05)
    release.set()  # the timed-out coroutine ran on, as before

    async def cancelled() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    with pytest.raises(concurrent.futures.CancelledError):
        portal.call(cancelled())
    assert portal.call(asyncio.sleep(0, result=2)) == 2
