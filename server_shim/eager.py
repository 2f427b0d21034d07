"""A coroutine's first step run at once, in the caller's callback; a Task only for what is left after it waits.

Python 3.12's eager tasks, for the one place the shim needs them on 3.11: a connection's lane started by
the protocol's read (`ws.ResponsesConnection.frame_now`). A task's first step runs on the loop's next
iteration, an iteration of its own (~16,000 instructions: the loop's bookkeeping, a poll of the selector)
besides the task's creation; a lane whose whole turn is ready (the simulator's reply, a refusal) is done in
that one step. Run here, it is done inside the read, as the floor server answers; a lane that has to wait
(a real backend's first delta, a store, a slot) goes on in a Task from where it waited.

The step runs outside any task: `asyncio.current_task()` is None until it first waits. Code reached from a
lane that needs a current task (`asyncio.timeout`, a deadline `Watch`, a library's cancel scope, a plugin's
coroutine) first awaits `on_task()`, which moves the rest of the step onto its Task and costs nothing there.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@types.coroutine
def on_task() -> Generator[None, None, None]:
    """Awaited before code that needs a current task: in an eager first step (no current task), what follows
    runs on the Task that continues it, one loop iteration later as a task's first step would have; in a task,
    nothing. (`current_task()` rather than a flag: servers in threads of one process each have their own.)"""
    if asyncio.current_task() is None:
        yield


async def on_task_for(part: object) -> None:
    """`on_task()` before calling `part` (a store), unless it says its coroutines need no task
    (`runs_outside_tasks`, as the in-process store's, which never wait): one given to `create_app` may use a
    timeout or an HTTP client."""
    if not getattr(part, "runs_outside_tasks", False):
        await on_task()


def start(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run `coro`'s first step now, from a callback outside any task; the Task that runs the rest, or None
    when it finished (or failed) in that step.

    The step runs in a copy of the caller's context, the one the Task continues in: context variables
    a turn sets stay out of the caller (the protocol's reads) and out of the next turn, as in a task.
    An exception is what a task's would be: a `CancelledError` ends it quietly, any other is reported to
    the loop's exception handler (a task's would be, as never retrieved) and not raised into the caller.
    """
    context = contextvars.copy_context()
    try:
        pending = context.run(coro.send, None)
    except (StopIteration, asyncio.CancelledError):
        return None
    except Exception as exc:
        loop.call_exception_handler({"message": "an eagerly started task failed", "exception": exc})
        return None
    return loop.create_task(Continued(coro, pending), context=context)


class Continued(Coroutine[Any, Any, T]):
    """A coroutine that waited in its eager first step, as a task runs it: the task's first step hands over what
    it waited for (a future the task then waits on, or None: go on at the next iteration), later steps go to
    the coroutine. A task cancelled before its first step cancels that future, as it would one it waited on."""

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, T], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def send(self, value: Any) -> Any:
        pending = self._pending
        if pending is not None:
            self._pending = None
            return pending
        return self._coro.send(value)

    def throw(self, *exc: Any) -> Any:
        pending, self._pending = self._pending, None
        if isinstance(pending, asyncio.Future):
            pending.cancel()
        return self._coro.throw(*exc)

    def close(self) -> None:
        self._coro.close()

    @property
    def __name__(self) -> str:
        """The coroutine's name, for the task's `repr`."""
        return str(getattr(self._coro, "__name__", type(self._coro).__name__))

    def __await__(self) -> Generator[Any, None, T]:
        return self._coro.__await__()
