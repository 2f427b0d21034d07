"""The sync client's private event loop: run by the thread that calls, or by a keeper thread while none does.

Why not `websockets.sync`: lanes, reconnects and resends are written once, for asyncio, and the
sync client runs that same code on a loop of its own. Who runs that loop (`Ownership`'s rules):
- a thread that calls while nobody runs the loop runs it itself until its call is done: no
  hand-over to another thread. The hand-over (the loop thread woken through its self-pipe, a task
  started from a callback, a lock released for the caller, the extra loop turns) cost a wrapped
  turn more than its own work on the loop (`python -m benchmarks.client_instructions`);
- a thread that calls while another runs the loop hands its call over (`Handoff`): turns of
  several threads run side by side, on one loop;
- the keeper, a daemon thread started with the loop, runs it once nobody has for `idle_s` (it answers
  the server's pings, reads its close), and when a driver's call ended before calls handed to it
  (they go on). A call that finds the keeper running the loop asks it to stop and then runs it.
Between calls, for less than `idle_s`, nobody reads the sockets: what arrives waits in the kernel.
A forked child starts with a loop of its own, so its session opens sockets of its own (`_after_fork_in_child`).
"""

from __future__ import annotations

import _signal
import asyncio
import concurrent.futures
import contextlib
import os
import signal
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from types import FrameType
from typing import Any, Generic, Protocol, TypeVar

from . import _http
from .errors import SessionClosed
from .ownership import ASK, DRIVE, HAND, IDLE_S, KEEPER, WAIT, Move, Ownership

T = TypeVar("T")

get_ident = threading.get_ident
main_thread = threading.main_thread
set_handler: Callable[[int, Any], Any] = _signal.signal
get_handler: Callable[[int], Any] = _signal.getsignal
"""The C functions: `signal.signal` and `signal.getsignal` convert to and from enums, ~10 us a call on 3.11."""
SIGINT, default_int_handler = int(signal.SIGINT), signal.default_int_handler
running_loop = asyncio.events._get_running_loop
_main_ident = [main_thread().ident]
"""The main thread's ident (`threading.main_thread().ident` is two Python calls), made afresh in a forked child."""
_portals: weakref.WeakSet[Portal] = weakref.WeakSet()
_inherited: list[asyncio.AbstractEventLoop] = []
"""The loops a forked child inherited, kept open and alive there for good: closing one, or collecting it (which
closes it), would take the parent's sockets out of the epoll instance both processes share."""


def _after_fork_in_child() -> None:
    """A forked child starts its portals afresh: a loop of its own (so the session opens sockets of its own:
    the inherited ones are the parent's), a lock nobody holds, no keeper (no thread survives a fork). Runs after
    `threading`'s own hook (registered first), which made the forking thread the child's main thread."""
    _main_ident[0] = main_thread().ident
    for portal in list(_portals):
        portal._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Portal:
    """Runs coroutines on its own loop, run by the calling thread or the keeper (see the module's docstring)."""

    def __init__(
        self, name: str = "ws_transport", *, idle_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        """The keeper."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        """Notified when the loop's driver changed, or must change."""
        self._own = Ownership(IDLE_S if idle_s is None else idle_s)
        self._detached: set[asyncio.Task[Any]] = set()
        _portals.add(self)

    @property
    def running(self) -> bool:
        return self._loop is not None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """`coro`'s result, waited for on this thread (`TimeoutError` after `timeout`; the coroutine runs on).

        On the main thread, with Python's own Ctrl-C handler in place, Ctrl-C cancels this call and raises
        `KeyboardInterrupt` once it has ended (`Interrupt`); a second Ctrl-C raises at once."""
        me, running = get_ident(), running_loop()
        if self._runs_the_loop(me, running):
            coro.close()
            raise RuntimeError("waiting on the portal from the thread running its loop would deadlock")
        if me != _main_ident[0] or get_handler(SIGINT) is not default_int_handler:
            return self._call(me, running is None, coro, timeout, None)
        interrupt = Interrupt()
        set_handler(SIGINT, interrupt)
        try:
            return self._call(me, running is None, coro, timeout, interrupt)
        finally:
            set_handler(SIGINT, default_int_handler)
            if interrupt.count:
                raise KeyboardInterrupt from None  # the call was cancelled for it: this is its outcome

    def _call(
        self, me: int, can_drive: bool, coro: Coroutine[Any, Any, T], timeout: float | None, interrupt: Interrupt | None
    ) -> T:
        try:
            loop, move = self._take(me, can_drive=can_drive)
        except BaseException:
            coro.close()
            raise
        if move is not DRIVE:
            handoff = Handoff(self, loop, coro)
            if interrupt is not None:
                interrupt.watch(handoff)
            return handoff.result(timeout)  # type: ignore[no-any-return]
        call = Call(self, loop, coro, driven=True)
        if interrupt is not None:
            interrupt.watch(call)
        return self._drive(loop, call, timeout)  # type: ignore[no-any-return]

    def submit(self, coro: Coroutine[Any, Any, T]) -> Pending[T]:
        """`coro` to be run by `result()` (as `call` runs it), on the thread that asks for the result."""
        return Pending(self, coro)

    def _runs_the_loop(self, me: int, running: asyncio.AbstractEventLoop | None) -> bool:
        """Whether thread `me` (whose running loop is `running`) runs the portal's loop: its driver, or the keeper
        (`driver` says `KEEPER`, not which thread), where garbage collection may call a finalizer (a dropped
        client's close): a wait there would block the loop it waits for."""
        return self._own.driver == me or (running is not None and running is self._loop)

    def _take(self, me: int, *, can_drive: bool) -> tuple[asyncio.AbstractEventLoop, Move]:
        """The loop (made, with its keeper, on first use) and what this thread does with its call (`can_drive`: it
        runs no other loop)."""
        with self._lock:
            move = self._own.take(me, can_drive=can_drive)
            loop = self._loop or self._start()
            while move is ASK or move is WAIT:
                if move is ASK:
                    loop.call_soon_threadsafe(loop.stop)
                self._changed.wait()
                move = self._own.take(me, can_drive=can_drive)
            if move is HAND and self._own.driver is None:
                self._changed.notify_all()  # nobody runs the loop and this thread cannot: the keeper must
            return loop, move

    def _drive(self, loop: asyncio.AbstractEventLoop, call: Call, timeout: float | None) -> Any:
        """Run the loop on this thread until `call` is done (or `timeout` passed: the coroutine runs on)."""
        late = None if timeout is None else loop.call_later(timeout, call.expire)
        try:
            call.task = loop.create_task(call.run())
            while call.outcome is None and not call.expired:
                loop.run_forever()  # stopped by the call's end (a stale stop asked of the keeper: run again)
        finally:
            if late is not None:
                late.cancel()
            unfinished = call.outcome is None
            call.driven = not unfinished
            with self._lock:
                if self._own.release(self.clock(), unfinished=unfinished) or self._own.stopped:
                    self._changed.notify_all()
        return call.result()

    def _finished(self) -> None:
        with self._lock:
            self._own.finished()

    def _start(self) -> asyncio.AbstractEventLoop:
        """The loop and its keeper (under the lock)."""
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._keep, args=(loop,), name=self.name, daemon=True)
        self._thread.start()
        return loop

    def _keep(self, loop: asyncio.AbstractEventLoop) -> None:
        """The keeper: runs the loop when `Ownership.keeper_wait` says so, until the portal stops."""
        while True:
            with self._lock:
                while not self._own.stopped and (wait := self._own.keeper_wait(self.clock())) is not None:
                    self._changed.wait(wait)
                if self._own.stopped:
                    self._changed.notify_all()
                    if self._own.driver is None:  # stopped from the loop (a finalizer's close): nobody joins the keeper
                        loop.close()
                    return
            try:
                loop.run_forever()
            finally:
                with self._lock:
                    self._own.release(self.clock())
                    self._changed.notify_all()

    def _forked(self) -> None:
        if self._loop is not None:
            _inherited.append(self._loop)
        self._loop = self._thread = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._own = Ownership(self._own.idle_s, stopped=self._own.stopped)
        self._detached = set()

    def cleanup(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a cleanup coroutine: waited for, except on the thread running the loop, where it is scheduled.

        Garbage collection can finalize an abandoned stream on any thread, the loop's driver included.
        """
        loop = self._loop
        if loop is None or self._own.stopped:
            coro.close()
        elif self._runs_the_loop(get_ident(), running_loop()):
            self._detach(coro)
        else:
            with contextlib.suppress(SessionClosed):  # stopped meanwhile: the loop's sockets are closed
                self.call(coro)

    def close_later(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` on the loop, then stop: what a finalizer does. Garbage collection runs finalizers wherever an
        allocation happens, a region holding this portal's lock included (a thread taking or giving back the loop),
        so this takes no lock and waits for nothing: the loop's driver runs it, or the keeper within `idle_s`."""
        loop = self._loop
        if loop is None or self._own.stopped:
            coro.close()
            return
        try:
            loop.call_soon_threadsafe(self._close_on_loop, coro)
        except RuntimeError:  # the loop was closed meanwhile: stopped, its sockets with it
            coro.close()

    def _close_on_loop(self, coro: Coroutine[Any, Any, None]) -> None:
        self._detach(self._then_stop(coro))

    async def _then_stop(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        finally:
            self.stop()

    def _detach(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` as a task on the loop (this thread runs it), kept until it ends."""
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    def stop(self) -> None:
        """Stop the keeper and close the loop (once whoever runs it is done with it)."""
        with self._lock:
            loop, keeper = self._loop, self._thread
            if self._own.stopped or loop is None or keeper is None:
                self._own.stopped = True
                return
            self._own.stopped = True
            self._changed.notify_all()
            if self._own.driver == KEEPER:
                loop.call_soon_threadsafe(loop.stop)
        if keeper is threading.current_thread() or self._own.driver == get_ident():
            return  # stopped from the loop's own thread (a finalizer): the loop is left to garbage collection
        keeper.join()
        with self._lock:
            done = self._changed.wait_for(lambda: self._own.driver is None, timeout=10)
            self._loop = self._thread = None
        if done:
            loop.close()


class Call:
    """One coroutine run as a task on the portal's loop, its outcome kept for the thread that asked.

    `driven`: the asking thread runs the loop, which the task stops as it ends; else it is counted
    in `Ownership.handed` until it ends.
    """

    __slots__ = ("coro", "driven", "expired", "loop", "outcome", "portal", "task")

    def __init__(
        self, portal: Portal, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], *, driven: bool
    ) -> None:
        self.portal = portal
        self.loop = loop
        self.coro = coro
        self.driven = driven
        self.expired = False
        self.task: asyncio.Task[None] | None = None
        self.outcome: tuple[bool, Any] | None = None
        """(True, the result) or (False, the exception), set as the coroutine ends."""

    async def run(self) -> None:
        """`coro`'s outcome kept here; a cancellation (and `KeyboardInterrupt`, `SystemExit`) also ends the task
        as it would have ended it, an exception is the caller's only (the task does not log it as never retrieved)."""
        try:
            self.outcome = (True, await self.coro)
        except Exception as exc:
            self.outcome = (False, exc)
        except BaseException as exc:
            self.outcome = (False, exc)
            raise
        finally:
            self.ended()

    def ended(self) -> None:
        if self.driven:
            self.loop.stop()
        else:
            self.portal._finished()

    def expire(self) -> None:
        self.expired = True
        self.loop.stop()

    def cancel_soon(self) -> None:
        """Cancel the call's task on the loop (from any thread, a signal handler included)."""
        self.loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def result(self) -> Any:
        """The coroutine's result or exception; `concurrent.futures.CancelledError` when its task was
        cancelled (as `run_coroutine_threadsafe`'s future reports it); `TimeoutError` when it has not ended."""
        if self.outcome is None:
            raise TimeoutError("the portal's call did not finish in time")
        done, value = self.outcome
        if done:
            return value
        if isinstance(value, asyncio.CancelledError):
            raise concurrent.futures.CancelledError
        raise value


class Handoff(Call):
    """A call handed to the thread running the loop: one lock is the whole hand-over, released by the
    task as it ends (`run_coroutine_threadsafe`'s future, condition and chained callbacks cost more)."""

    __slots__ = ("_finished",)

    def __init__(self, portal: Portal, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> None:
        super().__init__(portal, loop, coro, driven=False)
        self._finished = threading.Lock()
        self._finished.acquire()
        loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        self.task = self.loop.create_task(self.run())

    def ended(self) -> None:
        super().ended()
        self._finished.release()

    def result(self, timeout: float | None = None) -> Any:
        if not self._finished.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"the portal's call did not finish in {timeout} s")
        self._finished.release()  # finished for good: a later call answers at once
        return super().result()


class Interrupt:
    """Python's Ctrl-C handler while the main thread waits on the portal: the first Ctrl-C cancels the call.

    Python's own handler raises `KeyboardInterrupt` wherever the main thread is, and while it runs the loop that
    is anywhere on the loop: in another thread's call handed to it (which then raised it), in a socket's reader
    (a read lost), between taking the loop and giving it back (nobody could run it again). As `asyncio.run`
    does, the interrupt cancels the caller's call instead: its turn is given up as a cancelled task's is (its
    socket retired if the response was under way: the next call opens another) and the caller gets
    `KeyboardInterrupt` once it has ended. A second Ctrl-C raises at once (a call that does not end)."""

    __slots__ = ("call", "count")

    def __init__(self) -> None:
        self.count = 0
        self.call: Call | None = None

    def watch(self, call: Call) -> None:
        self.call = call
        if self.count:
            call.cancel_soon()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        if self.call is not None:
            self.call.cancel_soon()


class Pending(Generic[T]):
    """A coroutine submitted to the portal, run when its result is asked for."""

    def __init__(self, portal: Portal, coro: Coroutine[Any, Any, T]) -> None:
        self.portal = portal
        self.coro = coro

    def result(self, timeout: float | None = None) -> T:
        return self.portal.call(self.coro, timeout)


class AsyncChunks(Protocol):
    """An async byte stream whose iterator is a generator (so it can be closed mid-way)."""

    def __aiter__(self) -> AsyncGenerator[bytes, None]: ...

    async def aclose(self) -> None: ...


def never_ready() -> bool:
    """A stream none of whose steps is known to return at once (`PortalStream`'s `ready` by default)."""
    return False


class PortalStream(*_http.bases("SyncByteStream")):  # type: ignore[misc]
    """An async byte stream on the portal's loop, read from the caller's thread.

    `close()` may come from any thread while the reader waits for a chunk (a "stop" button). The
    chunk generator must never be closed while a step of it runs, so every step and the close
    run as tasks on the loop: the close cancels the running step, waits until it has unwound,
    then closes the generator. A step that starts after the close sees `closed` and does nothing.
    """

    def __init__(self, stream: AsyncChunks, portal: Portal, ready: Callable[[], bool] = never_ready) -> None:
        self.stream = stream
        self.portal = portal
        self.chunks = stream.__aiter__()
        self.ready = ready
        """Whether the generator's next step would not wait (its chunk is here, or it ends): such are read with
        the chunk before, in the same portal call (a call costs ~75k instructions: more than a chunk's reading)."""
        self._after: Exception | None = None
        """How the step after the chunks read ahead ended (`_END`, or an error), for the next call."""
        self._held: bytes | None = None
        """The chunk read as the stream was opened (`read_ahead`), handed on by the first read without a call."""
        self.closed = False
        self.finished = False
        """The chunks ended and the stream was closed on the loop, by the step that read their end: `close()`
        has nothing left to do there."""
        self._step: asyncio.Task[bytes | None] | None = None
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        """One portal call per chunk, with the chunks after it that are already there (this thread runs the loop
        for it when none does), none for the chunk read as the stream opened; `close()` from another thread
        interrupts the wait."""
        held, self._held = self._held, None
        if held is not None:
            if self.closed:
                raise self._closed_error()
            yield held
        while True:
            with self._lock:
                if self.closed:
                    raise self._closed_error()
                if self._after is _END:  # the end came with the last chunk: no call to learn it
                    return
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
            if self.finished:
                return
        self.portal.cleanup(self._aclose())

    async def read_ahead(self) -> None:
        """The first step, run on the loop by the call that opened the stream: a turn whose events came together
        is then read, its end included, in that one call."""
        self._held = await self._next()

    async def _next(self) -> bytes | None:
        """One step of the generator, on the loop; runs only while the stream is open."""
        if self.closed:
            raise _StreamClosed
        self._step = asyncio.current_task()
        after = self._after
        if after is not None:
            self._after = _END  # after an error the generator has ended
            if after is _END:
                return None
            raise after
        try:
            chunk = await anext(self.chunks)
        except StopAsyncIteration:
            await self._finish()
            return None
        while self.ready():  # steps that do not wait: no suspension, so no cancellation lands among them
            try:
                chunk += await anext(self.chunks)
            except StopAsyncIteration:
                self._after = _END
                break
            except Exception as exc:  # raised once the chunks before it are handed on
                self._after = exc
                break
        if self._after is not None:
            await self._finish()
        return chunk

    async def _finish(self) -> None:
        """The chunks ended (their generator is done): close the stream now, on the loop, so that `close()` (the
        SDK's, once it has read the end) needs no portal call of its own."""
        await self.stream.aclose()
        self.finished = True

    async def _aclose(self) -> None:
        step = self._step
        if step is not None and not step.done():
            step.cancel()
            await asyncio.wait([step])
        await self.chunks.aclose()
        await self.stream.aclose()


class _StreamClosed(Exception):
    """A chunk was asked for after the stream was closed."""


_END = StopAsyncIteration()
