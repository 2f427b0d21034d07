"""The sync client's loop: who runs it (the calling thread, another caller, the keeper), and a stream
read on one thread while another closes it.

No server here: the stream is a plain async generator on the portal's loop, so the race between
a reader waiting for its next chunk and a `close()` from another thread is driven directly. The
keeper answering a server's pings while the client is idle is tested with the shim in
`test_transport_wrap.py`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import warnings
from collections.abc import AsyncGenerator

import httpx2
import pytest

from ws_transport import SessionClosed
from ws_transport import portal as portal_module
from ws_transport.ownership import KEEPER, Move, Ownership
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


class Queued:
    """A byte stream of what is queued, waiting for more while nothing is; `ready` says whether a step would wait."""

    def __init__(self, *chunks: bytes | Exception | None) -> None:
        self.queue: asyncio.Queue[bytes | Exception | None] = asyncio.Queue()
        for chunk in chunks:
            self.queue.put_nowait(chunk)
        self.ended = False
        self.closed = False

    def ready(self) -> bool:
        return self.ended or not self.queue.empty()

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        while (chunk := await self.queue.get()) is not None:
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk
        self.ended = True

    async def aclose(self) -> None:
        self.closed = True


class CountingPortal(Portal):
    calls = 0

    def call(self, coro, timeout=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().call(coro, timeout)


@pytest.fixture
def counting() -> CountingPortal:
    portal = CountingPortal("test-portal")
    yield portal
    portal.stop()


def test_chunks_already_there_are_read_in_one_portal_call_with_the_one_before(counting: CountingPortal) -> None:
    stream = counting.call(make(Queued, b"a", b"b", b"c"))
    read = iter(PortalStream(stream, counting, stream.ready))
    counting.calls = 0
    assert next(read) == b"abc", "the three queued chunks in one read"
    counting.call(put(stream, b"d", b"e", None))
    assert list(read) == [b"de"], "after a wait: the one that came and those queued behind it, then the end"
    assert counting.calls == 3, "a read for the first three, a put, a read to the end"


def test_chunks_read_as_the_stream_opens_to_their_end_need_no_call_to_read_or_close(counting: CountingPortal) -> None:
    """The call that opens a stream reads what is there (`read_ahead`); the step that reads the end closes the
    stream on the loop, so neither the reads nor the `close()` after them make a portal call."""
    stream = counting.call(make(Queued, b"a", b"b", None))
    body = PortalStream(stream, counting, stream.ready)
    counting.call(body.read_ahead())
    counting.calls = 0
    assert list(body) == [b"ab"]
    assert stream.closed, "closed by the step that read the end"
    body.close()
    assert counting.calls == 0


def test_a_stream_closed_before_its_end_is_closed_on_the_loop(counting: CountingPortal) -> None:
    stream = counting.call(make(Queued, b"a"))
    body = PortalStream(stream, counting, stream.ready)
    counting.call(body.read_ahead())
    assert next(iter(body)) == b"a" and not stream.closed
    counting.calls = 0
    body.close()
    assert stream.closed and counting.calls == 1


def test_an_error_after_chunks_already_there_comes_after_them(counting: CountingPortal) -> None:
    stream = counting.call(make(Queued, b"a", b"b", ValueError("lost"), b"never"))
    read = iter(PortalStream(stream, counting, stream.ready))
    assert next(read) == b"ab"
    with pytest.raises(ValueError, match="lost"):
        next(read)
    assert list(read) == []


def test_without_ready_every_chunk_is_a_portal_call_of_its_own(counting: CountingPortal) -> None:
    stream = counting.call(make(Queued, b"a", b"b", None))
    counting.calls = 0
    assert list(PortalStream(stream, counting)) == [b"a", b"b"]
    assert counting.calls == 3


async def make(kind: type[Queued], *chunks: bytes | Exception | None) -> Queued:
    return kind(*chunks)  # on the portal's loop (its queue is that loop's)


async def put(stream: Queued, *chunks: bytes | None) -> None:
    for chunk in chunks:
        stream.queue.put_nowait(chunk)


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


def test_waiting_on_the_portal_from_the_keeper_is_refused_at_once_and_a_cleanup_there_is_scheduled() -> None:
    """Garbage collection may run a finalizer on the keeper while it runs the loop (a dropped client is a
    reference cycle: its close waits on the portal). A wait there blocks the loop it waits for: before, the
    call was handed over and timed out (a dropped client's close stalled the loop 10 s), a cleanup never ended."""
    portal = Portal("test-portal", idle_s=0.01)
    try:
        portal.call(asyncio.sleep(0))
        outcome = concurrent.futures.Future[BaseException | None]()
        cleaned = threading.Event()

        async def clean() -> None:
            cleaned.set()

        def on_the_keeper() -> None:
            try:
                portal.call(asyncio.sleep(0), timeout=2)
                outcome.set_result(None)
            except BaseException as exc:
                outcome.set_result(exc)
                if isinstance(exc, RuntimeError):
                    portal.cleanup(clean())

        while portal._own.driver != KEEPER:
            time.sleep(0.01)
        loop = portal._loop
        assert loop is not None
        loop.call_soon_threadsafe(on_the_keeper)
        refused = outcome.result(10)
        assert isinstance(refused, RuntimeError) and "deadlock" in str(refused)
        assert cleaned.wait(5)
    finally:
        portal.stop()


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
    ended = threading.Event()

    async def slow_then_note() -> None:
        await slow()
        ended.set()

    with pytest.raises(TimeoutError):
        portal.call(slow_then_note(), timeout=0.05)
    release.set()
    assert ended.wait(5)  # the timed-out coroutine ran on (the keeper runs the loop for it), as before

    async def cancelled() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    with pytest.raises(concurrent.futures.CancelledError):
        portal.call(cancelled())
    assert portal.call(asyncio.sleep(0, result=2)) == 2


def where(portal: Portal) -> int:
    """The thread the portal's loop runs a call on."""

    async def ident() -> int:
        return threading.get_ident()

    return portal.call(ident())


def test_a_call_runs_the_loop_on_the_calling_thread_and_the_keeper_waits() -> None:
    portal = Portal("test-portal", idle_s=30)
    try:
        assert where(portal) == threading.get_ident()
        other: list[int] = []
        thread = threading.Thread(target=lambda: other.append(where(portal)))
        thread.start()
        thread.join(5)
        assert other == [thread.ident]
        assert portal._thread is not None and portal._thread.is_alive()  # started with the loop, idle
    finally:
        portal.stop()


def test_calls_from_several_threads_run_side_by_side_on_one_loop(portal: Portal) -> None:
    """Every call waits until all have started: calls run one after another would time out."""
    n = 6
    started = 0
    everyone: asyncio.Event | None = None

    async def meet() -> int:
        nonlocal started, everyone
        everyone = everyone or asyncio.Event()
        started += 1
        if started == n:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 5)
        return threading.get_ident()

    ran: list[int] = []
    threads = [threading.Thread(target=lambda: ran.append(portal.call(meet()))) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(ran) == n
    assert len(set(ran)) < n  # some calls were handed to the thread running the loop


def test_a_thread_running_another_loop_hands_its_call_to_the_keeper(portal: Portal) -> None:
    async def inside_another_loop() -> int:
        return where(portal)  # a sync client called from async code (a notebook's cell)

    assert asyncio.run(inside_another_loop()) == portal._thread.ident  # type: ignore[union-attr]


def test_the_keeper_runs_the_loop_once_it_is_left_idle_and_gives_it_back() -> None:
    portal = Portal("test-portal", idle_s=0.05)
    try:
        fired = concurrent.futures.Future[int]()

        async def later() -> None:
            asyncio.get_running_loop().call_later(0.2, lambda: fired.set_result(threading.get_ident()))

        portal.call(later())
        assert fired.result(5) == portal._thread.ident  # type: ignore[union-attr]
        assert portal._own.driver == KEEPER
        assert where(portal) == threading.get_ident()  # the keeper was asked to stop
    finally:
        portal.stop()
    assert not portal.running


def test_ownership_decides_who_runs_the_loop() -> None:
    own = Ownership(idle_s=1.0)
    assert own.take(1, can_drive=True) is Move.DRIVE
    assert own.take(2, can_drive=True) is Move.HAND  # thread 1 runs it: handed over
    assert own.release(10.0) is True  # the handed call goes on: the keeper must run the loop
    assert own.keeper_wait(10.0) is None and own.driver == KEEPER
    assert own.take(3, can_drive=True) is Move.HAND  # a handed call is unfinished: the keeper keeps it
    own.finished()
    own.finished()  # both handed calls ended
    assert own.take(3, can_drive=True) is Move.ASK
    assert own.take(4, can_drive=True) is Move.WAIT
    assert own.release(11.0) is False
    assert own.keeper_wait(11.5) == pytest.approx(0.5)  # idle only half a second
    assert own.take(3, can_drive=True) is Move.DRIVE
    assert own.keeper_wait(11.6) == 1.0  # a caller runs it: look again later
    assert own.release(12.0, unfinished=True) is True  # its own call went on (a timeout)
    own.finished()
    assert own.keeper_wait(12.5) == pytest.approx(0.5)
    assert own.keeper_wait(13.0) is None  # idle for idle_s: the keeper answers the pings now
    own.release(13.1)
    assert own.take(5, can_drive=False) is Move.HAND  # runs another loop: cannot run this one
    own.stopped = True
    with pytest.raises(SessionClosed):
        own.take(6, can_drive=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_from_a_worker_thread_takes_that_thread_for_the_main_one() -> None:
    """Ctrl-C is watched for calls on the main thread only (`Interrupt`); the portal keeps that thread's ident,
    which in a child forked from another thread is the forking thread's."""
    forked: list[int] = []

    def fork() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # forking a process with threads
            pid = os.fork()
        if pid == 0:
            os._exit(0 if portal_module._main_ident[0] == threading.get_ident() else 1)
        forked.append(pid)

    worker = threading.Thread(target=fork)
    worker.start()
    worker.join()
    _, status = os.waitpid(forked[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0
