"""A private event loop on a daemon thread, where the sync client's session lives.

Why not `websockets.sync`: lanes, reconnects and resends are written once, for asyncio, and the
sync client runs that same code here. The cost is one thread per wrapped sync client and a
thread hop per streamed chunk; the thread is started on first use and joined by `stop()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterator
from typing import Any, Generic, Protocol, TypeVar

from . import _http
from .errors import SessionClosed

T = TypeVar("T")


class Portal:
    """Runs coroutines on its own loop thread and blocks the calling thread for their result."""

    def __init__(self, name: str = "ws_transport") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._detached: set[asyncio.Task[Any]] = set()
        self._stopped = False

    @property
    def running(self) -> bool:
        return self._loop is not None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """`coro`'s result, waited for on this thread (`TimeoutError` after `timeout`; the coroutine runs on)."""
        return self.submit(coro).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Handoff[T]:
        """Start `coro` on the loop; its task is cancelled there by whoever holds it (a closing stream)."""
        return Handoff(self._loop_for(coro), coro)

    def _loop_for(self, coro: Coroutine[Any, Any, Any]) -> asyncio.AbstractEventLoop:
        """The running loop `coro` may be handed to from this thread (else `coro` is closed and this raises)."""
        try:
            loop = self._ensure()
        except RuntimeError:
            coro.close()
            raise
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("waiting on the portal from its own thread would deadlock")
        return loop

    def cleanup(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a cleanup coroutine: waited for, except on the loop thread itself, where it is scheduled.

        Garbage collection can finalize an abandoned stream on any thread, the loop's included.
        """
        loop = self._loop
        if loop is None:
            coro.close()
        elif threading.current_thread() is self._thread:
            task = loop.create_task(coro)
            self._detached.add(task)
            task.add_done_callback(self._detached.discard)
        else:
            asyncio.run_coroutine_threadsafe(coro, loop).result()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._stopped:
                raise SessionClosed("the client was closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop


class Handoff(Generic[T]):
    """A coroutine run as a task on the portal's loop, its outcome waited for from another thread.

    One lock is the whole hand-over, released by the task itself as its coroutine ends:
    `run_coroutine_threadsafe`'s future, condition and chained callbacks cost a direct turn as much
    as the wire did, and a streamed turn as much once per event; a done callback would cost one more
    turn of the loop before the waiting thread is let go.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> None:
        self._finished = threading.Lock()
        self._finished.acquire()
        self._outcome: tuple[bool, Any] | None = None
        """(True, the result) or (False, the exception), set before the lock is released."""
        self._task: asyncio.Task[None] | None = None
        loop.call_soon_threadsafe(self._start, loop, coro)

    def _start(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> None:
        self._task = loop.create_task(self._run(coro))

    async def _run(self, coro: Coroutine[Any, Any, T]) -> None:
        """`coro`'s outcome kept here; a cancellation (and `KeyboardInterrupt`, `SystemExit`) also ends the task
        as it would have ended it, an exception is the caller's only (the task does not log it as never retrieved)."""
        try:
            self._outcome = (True, await coro)
        except Exception as exc:
            self._outcome = (False, exc)
        except BaseException as exc:
            self._outcome = (False, exc)
            raise
        finally:
            self._finished.release()

    def result(self, timeout: float | None = None) -> T:
        """The coroutine's result or exception; `concurrent.futures.CancelledError` when its task was
        cancelled (as `run_coroutine_threadsafe`'s future reports it); `TimeoutError` after `timeout`."""
        if not self._finished.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"the portal's call did not finish in {timeout} s")
        self._finished.release()  # finished for good: a later call answers at once
        assert self._outcome is not None
        done, value = self._outcome
        if done:
            return value  # type: ignore[no-any-return]
        if isinstance(value, asyncio.CancelledError):
            raise concurrent.futures.CancelledError
        raise value


class AsyncChunks(Protocol):
    """An async byte stream whose iterator is a generator (so it can be closed mid-way)."""

    def __aiter__(self) -> AsyncGenerator[bytes, None]: ...

    async def aclose(self) -> None: ...


class PortalStream(*_http.bases("SyncByteStream")):  # type: ignore[misc]
    """An async byte stream on the portal's loop, read from the caller's thread.

    `close()` may come from any thread while the reader waits for a chunk (a "stop" button). The
    chunk generator must never be closed while a step of it runs, so every step and the close
    run as tasks on the loop: the close cancels the running step, waits until it has unwound,
    then closes the generator. A step that starts after the close sees `closed` and does nothing.
    """

    def __init__(self, stream: AsyncChunks, portal: Portal) -> None:
        self.stream = stream
        self.portal = portal
        self.chunks = stream.__aiter__()
        self.closed = False
        self._step: asyncio.Task[bytes | None] | None = None
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        """One chunk per hop to the loop; `close()` from another thread interrupts the wait."""
        while True:
            with self._lock:
                if self.closed:
                    raise self._closed_error()
                pending = self.portal.submit(self._next())
            try:
                chunk = pending.result()
            except (concurrent.futures.CancelledError, _StreamClosed):
                raise self._closed_error() from None
            if chunk is None:
                return
            yield chunk

    def _closed_error(self) -> Exception:
        http = _http.module_of(getattr(self.stream, "request", None))
        return http.ReadError("the response stream was closed")  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self.portal.cleanup(self._aclose())

    async def _next(self) -> bytes | None:
        """One step of the generator, on the loop; runs only while the stream is open."""
        if self.closed:
            raise _StreamClosed
        self._step = asyncio.current_task()
        try:
            return await anext(self.chunks)
        except StopAsyncIteration:
            return None

    async def _aclose(self) -> None:
        step = self._step
        if step is not None and not step.done():
            step.cancel()
            await asyncio.wait([step])
        await self.chunks.aclose()
        await self.stream.aclose()


class _StreamClosed(Exception):
    """A chunk was asked for after the stream was closed."""
