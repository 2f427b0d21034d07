"""A lane's first step run inside the protocol's read (`server_shim.eager`), a Task only for what waits.

On a real loop, from a callback outside any task (where the protocol's read runs it): a coroutine that
finishes in its first step makes no task; one that waits goes on in a Task, in the same context, from
where it waited; context variables stay out of the caller; errors are reported as a task's would be,
never raised into the read; a cancelled continuation cancels what it waited for; `on_task()` moves the
rest of the step onto its Task. Then over a real server: two chained turns on one connection, each turn's
context its own, a plugin coroutine that needs a current task, and a lane whose step fails leaving the
connection sound.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from openai import AsyncOpenAI
from support.wire import API_KEY, MODEL, completed_ok, only_connection, run_turn

from server_shim import eager
from server_shim.backends.base import Finish, TextDelta, Usage
from server_shim.state import MemoryResponseStore, ResponseState

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("MARK", default="unset")


async def from_callback(call: Callable[[], Any]) -> Any:
    """`call()` run by the loop as a plain callback (no current task), as `data_received` runs; its result."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def callback() -> None:
        try:
            done.set_result(call())
        except BaseException as exc:
            done.set_exception(exc)

    loop.call_soon(callback)
    return await done


async def chained(conn: Any, text: str, previous: str | None) -> str:
    """A turn on `conn` continuing `previous`; its response id."""
    turn = await run_turn(conn, input=text, previous_response_id=previous)
    completed_ok(turn)
    return str(turn.response["id"])


def started(coro: Coroutine[Any, Any, None]) -> Callable[[], asyncio.Task[None] | None]:
    return lambda: eager.start(asyncio.get_running_loop(), coro)


async def test_a_coroutine_that_does_not_wait_runs_whole_in_the_callback_and_makes_no_task():
    seen: list[Any] = []

    async def whole() -> None:
        MARK.set("turn")
        seen.append((asyncio.current_task(), MARK.get()))

    tasks_before = len(asyncio.all_tasks())
    assert await from_callback(started(whole())) is None
    assert seen == [(None, "turn")]  # ran before `start` returned, outside any task
    assert len(asyncio.all_tasks()) == tasks_before
    assert MARK.get() == "unset"


async def test_a_coroutine_that_waits_goes_on_in_a_task_in_its_own_context_from_where_it_waited():
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[str] = loop.create_future()
    seen: list[Any] = []

    async def waits() -> None:
        MARK.set("turn")
        seen.append(await gate)
        seen.append((asyncio.current_task(), MARK.get()))

    outside: list[str] = []
    task = await from_callback(lambda: (eager.start(loop, waits()), outside.append(MARK.get()))[0])
    assert isinstance(task, asyncio.Task) and not task.done() and seen == []
    assert outside == ["unset"] and MARK.get() == "unset"  # the step's context is a copy
    gate.set_result("delta")
    await task
    assert seen == ["delta", (task, "turn")]


async def test_on_task_moves_the_rest_of_an_eager_step_onto_its_task_and_is_nothing_in_a_task():
    seen: list[Any] = []

    async def needs_a_task() -> None:
        seen.append(asyncio.current_task())
        await eager.on_task()
        seen.append(asyncio.current_task())
        async with asyncio.timeout(5):  # needs a current task
            await asyncio.sleep(0)

    task = await from_callback(started(needs_a_task()))
    await task
    assert seen == [None, task]
    seen.clear()
    running = asyncio.create_task(needs_a_task())
    await running
    assert seen == [running, running]


async def test_an_error_in_the_step_is_reported_as_a_tasks_would_be_and_a_cancellation_ends_it_quietly():
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:

        async def fails() -> None:
            raise RuntimeError("bug")

        async def cancelled() -> None:
            raise asyncio.CancelledError

        assert await from_callback(started(fails())) is None
        assert await from_callback(started(cancelled())) is None
    finally:
        loop.set_exception_handler(None)
    assert [type(c["exception"]) for c in reported] == [RuntimeError]


@pytest.mark.parametrize("when", ["before its first step", "while it waits"])
async def test_cancelling_the_continuation_cancels_what_it_waited_for_and_the_coroutine_sees_it(when):
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def waits() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = await from_callback(started(waits()))
    if when == "while it waits":
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"] and gate.cancelled()


# --- over a real server: the lane started by the protocol's read --------------------------------------


async def test_each_turn_on_a_connection_runs_in_its_own_context_and_the_first_step_outside_any_task(make_server):
    """A validator (run in the lane's first step) sets a context variable: the next turn on the same
    connection does not see it, whichever path started the lane."""
    seen: list[tuple[str, bool]] = []

    def validator(new_items: Any, previous: Any, request: Any) -> None:
        seen.append((MARK.get(), asyncio.current_task() is None))
        MARK.set("set by a turn")

    server = make_server(validators=[validator])
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        first = await chained(conn, "one", None)
        second = await chained(conn, "two", first)
        await chained(conn, "three", second)
    assert [mark for mark, _ in seen] == ["unset"] * 3
    assert any(eagerly for _, eagerly in seen)  # the protocol's read ran the turn (the usual path)


async def test_a_plugin_coroutine_runs_on_a_task_and_in_the_steps_context(make_server):
    """An async validator may need a current task (a timeout, an HTTP client): it gets the lane's Task, and
    sees what the turn set before it in its first step."""
    seen: list[tuple[str, bool]] = []

    def validator(new_items: Any, previous: Any, request: Any) -> Coroutine[Any, Any, None]:
        MARK.set("this turn's")
        return checked()

    async def checked() -> None:
        async with asyncio.timeout(5):
            await asyncio.sleep(0)
        seen.append((MARK.get(), asyncio.current_task() is not None))

    server = make_server(validators=[validator])
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        await chained(conn, "two", await chained(conn, "one", None))
    assert seen == [("this turn's", True)] * 2


async def test_a_lane_whose_first_step_fails_is_logged_and_dropped_and_the_connection_chains_on(
    make_server, monkeypatch, caplog
):
    import server_shim.ws as ws

    original = ws.run_turn
    calls: list[str] = []

    async def fails_once(conn: Any, request: Any, stream_id: Any, successor_of: Any = None) -> None:
        calls.append(str(request.input))
        if len(calls) == 1:
            raise RuntimeError("a bug in the lane")
        await original(conn, request, stream_id, successor_of)

    monkeypatch.setattr(ws, "run_turn", fails_once)
    server = make_server()
    with caplog.at_level(logging.ERROR):
        async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
            await conn.response.create(model=MODEL, input="lost", store=False)
            deadline = time.monotonic() + 5
            while calls != ["lost"] or only_connection(server)._lanes:  # failed (a request queued behind it is lost)
                assert time.monotonic() < deadline, "the failed lane was not dropped"
                await asyncio.sleep(0.01)
            await chained(conn, "two", await chained(conn, "one", None))
    assert calls == ["lost", "one", "two"]
    assert "a bug in the lane" in caplog.text


class TimedBackend:
    """A backend given to `create_app` (no router between) that bounds its read with `asyncio.timeout`, as an
    HTTP client's deadline does: it needs a current task."""

    name = "timed"

    async def stream(self, request: Any) -> Any:
        async with asyncio.timeout(5):
            await asyncio.sleep(0)
        yield TextDelta("on a task" if asyncio.current_task() is not None else "no task")
        yield Usage(input_tokens=3, output_tokens=1)
        yield Finish("stop")

    async def models(self) -> list[str]:
        return [MODEL]

    async def aclose(self) -> None:
        pass


class TimedStore(MemoryResponseStore):
    """A store given to `create_app` whose calls are bounded by a timeout (a remote store's): not marked
    `runs_outside_tasks`, so the turn calls it from a task."""

    runs_outside_tasks = False

    async def save(self, state: ResponseState) -> None:
        async with asyncio.timeout(5):
            await super().save(state)

    async def load(self, response_id: str, tenant: str | None) -> ResponseState | None:
        async with asyncio.timeout(5):
            return await super().load(response_id, tenant)


async def test_a_backend_or_store_given_to_create_app_is_called_from_a_task(make_server):
    """The router hops onto the lane's task before its backends stream; a backend or store given to `create_app`
    directly has no router between, and before the turn's own hop every such turn failed (`asyncio.timeout`:
    'Timeout should be used inside a task'; httpx: 'unknown async library')."""
    server = make_server(backend_impl=TimedBackend(), store_impl=TimedStore())
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk:
        async with sdk.responses.connect() as conn:
            first = await run_turn(conn, input="one", store=True)
            completed_ok(first)
            second = await run_turn(conn, input="two", store=True, previous_response_id=first.response["id"])
            completed_ok(second)
            assert second.response["output"][0]["content"][0]["text"] == "on a task"
        async with sdk.responses.connect() as other:  # a new connection: the parent comes from the store
            third = await run_turn(other, input="three", previous_response_id=second.response["id"])
            completed_ok(third)
