"""A private event loop on a daemon thread, where the sync client's session lives.

Why not `websockets.sync`: lanes, reconnects and resends are written once, for asyncio, and the
sync client runs that same code here. The cost is one thread per wrapped sync client and a
thread hop per streamed chunk; the thread is started on first use and joined by `stop()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

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
        return self.submit(coro).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the loop; cancelling the returned future cancels it there."""
        try:
            loop = self._ensure()
        except RuntimeError:
            coro.close()
            raise
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("waiting on the portal from its own thread would deadlock")
        return asyncio.run_coroutine_threadsafe(coro, loop)

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
