"""`ws_transport.wrap`: what a wrapped client still does, what it sends, and what it cleans up."""

from __future__ import annotations

import _thread
import asyncio
import gc
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.responses import Response
from support.wire import OPENAI_MAJOR

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from ws_transport.httpx_transport import _close_at_exit
from ws_transport.session import SessionState
from ws_transport.wrap import prepare

MODEL = "simulated-1"


class Recorder:
    def __init__(self) -> None:
        self.turns: list[tuple[int, str | None]] = []

    def __call__(self, new_items: list[dict], previous: Any, request: Any) -> None:
        self.turns.append((len(new_items), previous.id if previous else None))


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def server(recorder: Recorder) -> Iterator[BackgroundServer]:
    settings = Settings()
    with BackgroundServer(create_app(settings, validators=[recorder]), settings) as running:
        yield running


@pytest.fixture
def client(server: BackgroundServer) -> Iterator[OpenAI]:
    with ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as wrapped:
        yield wrapped


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def portal_thread(client: OpenAI) -> threading.Thread | None:
    return client._client._transport.portal._thread


def eventually(check: Any, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_wrap_returns_the_same_client_and_wrapping_twice_changes_nothing(server: BackgroundServer) -> None:
    with OpenAI(base_url=server.base_url, api_key="k") as plain:
        wrapped = ws_transport.wrap(plain)
        transport = plain._client._transport
        assert wrapped is plain and isinstance(wrapped, OpenAI)
        assert ws_transport.wrap(wrapped) is wrapped and plain._client._transport is transport


def test_other_endpoints_stay_on_http(client: OpenAI, server: BackgroundServer) -> None:
    sockets = server.shim.stats.websocket_connections
    assert [model.id for model in client.models.list()] == [MODEL]
    assert server.shim.stats.websocket_connections == sockets


def test_raw_response_wrapper_goes_over_the_session_and_parses(client: OpenAI, recorder: Recorder) -> None:
    history: list[Any] = [user("hello")]
    history += client.responses.create(model=MODEL, input=history, store=False).output
    history.append(user("raw please"))
    raw = client.responses.with_raw_response.create(model=MODEL, input=history, store=False)
    assert raw.status_code == 200
    assert isinstance(raw.parse(), Response) and raw.parse().status == "completed"
    assert ws_transport.session_of(client).stats.turns_chained == 1
    assert recorder.turns[-1][0] == 1


def test_streaming_response_wrapper_reads_the_sse_body(client: OpenAI) -> None:
    with client.responses.with_streaming_response.create(model=MODEL, input="hello", stream=True) as raw:
        assert raw.headers["content-type"] == "text/event-stream"
        lines = [line for line in raw.iter_lines() if line.startswith("event: ")]
    assert lines[0] == "event: response.created" and lines[-1] == "event: response.completed"
    assert ws_transport.session_of(client).stats.turns == 1


def test_copies_of_the_client_share_the_session_and_keep_chaining(client: OpenAI) -> None:
    history: list[Any] = [user("hello")]
    history += client.responses.create(model=MODEL, input=history, store=False).output
    history.append(user("from a copy"))
    copy = client.with_options(timeout=30)
    assert copy.responses.create(model=MODEL, input=history, store=False).status == "completed"
    assert ws_transport.session_of(copy) is ws_transport.session_of(client)
    assert ws_transport.session_of(client).stats.turns_chained == 1


def test_caller_previous_response_id_passes_through(client: OpenAI, recorder: Recorder) -> None:
    first = client.responses.create(model=MODEL, input="hello")
    second = client.responses.create(model=MODEL, input=[user("more")], previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert recorder.turns[-1] == (1, first.id)
    stats = ws_transport.session_of(client).stats
    assert (stats.turns, stats.turns_chained) == (2, 1), "a caller's own chaining counts as chained"


def test_extra_body_fields_reach_the_server(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="hello", extra_body={"max_output_tokens": 3})
    assert len(response.output_text.split()) == 3


def test_stats_and_debug_logging(client: OpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ws_transport")
    history: list[Any] = [user("x" * 2000)]
    for n in range(3):
        history += [*client.responses.create(model=MODEL, input=history, store=False).output, user(f"turn {n}")]
    stats = ws_transport.session_of(client).stats
    assert isinstance(stats, ws_transport.SessionStats)
    assert (stats.turns, stats.turns_chained, stats.reconnects, stats.fallbacks) == (3, 2, 0, 0)
    assert stats.bytes_saved > 2 * 2000
    sent = [r.getMessage() for r in caplog.records if "sent turn" in r.getMessage()]
    assert len(sent) == 3 and "chained=True" in sent[-1]


def test_sync_close_closes_the_socket_and_joins_the_thread(server: BackgroundServer) -> None:
    client = ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    client.responses.create(model=MODEL, input="hello")
    thread = portal_thread(client)
    assert thread is not None and thread.is_alive()
    client.close()
    assert not thread.is_alive()
    assert eventually(lambda: not server.shim.connections)


def test_a_dropped_sync_client_takes_its_thread_with_it(server: BackgroundServer) -> None:
    client = ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    client.responses.create(model=MODEL, input="hello")
    thread = portal_thread(client)
    assert thread is not None
    del client
    gc.collect()
    thread.join(20)  # the finalizer scheduled the close: the keeper runs it after its idle second
    assert not thread.is_alive()
    assert eventually(lambda: not server.shim.connections)


@pytest.mark.timeout(40)
def test_a_sync_client_collected_while_its_portal_is_locked_closes_later_without_waiting(
    server: BackgroundServer,
) -> None:
    """Garbage collection runs where an allocation happens, a region holding the portal's lock included (a
    thread taking or giving back its loop). A dropped client's finalizer that waited on its portal there took
    that lock again: the thread hung for good. The collection is forced at that moment: the portal's clock is
    read under its lock as a call gives the loop back."""
    client = ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    client.responses.create(model=MODEL, input="hello")
    portal = client._client._transport.portal
    thread = portal_thread(client)
    assert thread is not None and server.shim.connections
    me, clock = threading.get_ident(), portal.clock

    def collecting_clock() -> float:
        if threading.get_ident() == me:
            portal.clock = clock
            gc.collect()  # the dropped client's finalizer runs here, the portal's lock held by this thread
        return clock()

    gc.disable()  # the client is collected in the locked region, not before
    try:
        del client
        portal.clock = collecting_clock
        portal.call(asyncio.sleep(0))
    finally:
        gc.enable()
    assert portal.clock is clock, "the collection ran under the lock"
    thread.join(20)
    assert not thread.is_alive(), "the keeper closed the session and ended"
    assert eventually(lambda: not server.shim.connections)


def test_a_sync_client_left_open_is_closed_at_exit_waited_for(server: BackgroundServer) -> None:
    """A dropped client's finalizer only schedules its close; one still alive at exit is closed as `close()` does
    (the keeper is a daemon thread: a close left to it could be cut short)."""
    client = ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    client.responses.create(model=MODEL, input="hello")
    thread = portal_thread(client)
    assert thread is not None and thread.is_alive()
    _close_at_exit()
    assert not thread.is_alive()
    assert eventually(lambda: not server.shim.connections)


@pytest.fixture(scope="module")
def paced() -> Iterator[BackgroundServer]:
    """A shim whose replies take a while (10 tokens/s): a turn is still running when something else happens."""
    settings = Settings(simulated_tokens_per_s=10)
    with BackgroundServer(create_app(settings), settings) as running:
        yield running


def ctrl_c_at(kind: str, who: str) -> Any:
    """An observer that presses Ctrl-C (SIGINT, on the main thread) when the turn `who` (its metadata) reads its
    event `kind`, on the loop, while the main thread runs it; it notes the thread each such event was read on."""
    seen: list[threading.Thread] = []
    lanes: dict[str | None, str] = {}

    def observe(event: dict[str, Any]) -> None:
        response = event.get("response") or {}
        lane = event.get("stream_id")
        if response:
            lanes[lane] = (response.get("metadata") or {}).get("who", "")
        if event["type"] == kind and lanes.get(lane) == who:
            seen.append(threading.current_thread())
            if len(seen) == 1 and threading.current_thread() is threading.main_thread():
                signal.raise_signal(signal.SIGINT)

    observe.seen = seen  # type: ignore[attr-defined]
    return observe


@pytest.fixture
def python_ctrl_c() -> Iterator[None]:
    """Python's own Ctrl-C handler for the test: a run started in the background of a shell without job control
    (`.ci/run &`) inherits SIGINT ignored, and then `_thread.interrupt_main` does nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.timeout(30)
@pytest.mark.usefixtures("python_ctrl_c")
def test_ctrl_c_while_the_loop_runs_another_threads_turn_interrupts_only_the_callers_turn(
    paced: BackgroundServer,
) -> None:
    """Ctrl-C lands on the main thread wherever it is: here while its loop runs a turn handed to it by another
    thread. The main thread's call ends with `KeyboardInterrupt`, the other thread's turn completes, and the
    client's next call works. Before: the interrupt was raised inside the other thread's turn (that thread got
    `KeyboardInterrupt`), and out of the main thread's loop."""
    observe = ctrl_c_at("response.created", "other")
    other: list[Any] = []

    def other_turn() -> None:
        try:
            other.append(
                client.responses.create(model=MODEL, input="b", max_output_tokens=5, metadata={"who": "other"})
            )
        except BaseException as exc:
            other.append(exc)

    def start_other(event: dict[str, Any]) -> None:
        observe(event)
        if event["type"] == "response.created" and not thread.ident:
            thread.start()  # handed to the main thread, which runs the loop for its own 5 s turn

    thread = threading.Thread(target=other_turn)
    client = ws_transport.wrap(OpenAI(base_url=paced.base_url, api_key="k", max_retries=0), on_event=start_other)
    try:
        with pytest.raises(KeyboardInterrupt):
            client.responses.create(model=MODEL, input="a", max_output_tokens=50, metadata={"who": "main"})
        thread.join(10)
        assert observe.seen == [threading.main_thread()], "the other thread's turn ran on the main thread's loop"
        assert len(other) == 1 and isinstance(other[0], Response) and other[0].status == "completed", other
        assert client.responses.create(model=MODEL, input="c", max_output_tokens=2).status == "completed"
    finally:
        client.close()


@pytest.mark.timeout(30)
@pytest.mark.usefixtures("python_ctrl_c")
def test_ctrl_c_while_a_stream_waits_for_its_next_event_ends_that_call_and_the_next_call_works(
    paced: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C (from another thread, as a terminal's is) while the main thread's loop waits for its stream's next
    event: the iteration raises `KeyboardInterrupt` (not a read error, not a silent end), nothing is logged as an
    error, and the next streamed call reads every event."""
    client = ws_transport.wrap(OpenAI(base_url=paced.base_url, api_key="k", max_retries=0))
    try:
        events = iter(client.responses.create(model=MODEL, input="a", max_output_tokens=50, stream=True))
        read = [next(events).type]
        timer = threading.Timer(0.1, _thread.interrupt_main)  # the reply takes 5 s: the loop waits for its deltas
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            read.extend(event.type for event in events)
        timer.join()
        assert "response.completed" not in read
        again = [e.type for e in client.responses.create(model=MODEL, input="b", max_output_tokens=2, stream=True)]
        assert again[0] == "response.created" and again[-1] == "response.completed"
        gc.collect()  # a task ended by an interrupt, its exception never asked for, logs an error when collected
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    finally:
        client.close()


async def test_async_close_leaves_no_task_behind(server: BackgroundServer) -> None:
    async with ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
        await client.responses.create(model=MODEL, input="hello")
        session = ws_transport.session_of(client)
        readers = [conn.reader for conn in session.connections]
    assert readers and all(task.done() for task in readers)
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("ws_transport")]


def test_an_async_client_can_move_to_a_new_event_loop(server: BackgroundServer) -> None:
    client = ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0))

    async def ask() -> str:
        return (await client.responses.create(model=MODEL, input="hello")).status

    assert asyncio.run(ask()) == "completed"
    assert asyncio.run(ask()) == "completed"
    asyncio.run(client.close())


def test_websocket_base_url_of_the_client_is_where_the_session_connects(server: BackgroundServer) -> None:
    websocket_base_url = server.base_url.replace("http://", "ws://")
    dead_http = "http://127.0.0.1:9/v1"  # nothing listens there: only the WebSocket URL is usable
    plain = OpenAI(base_url=dead_http, websocket_base_url=websocket_base_url, api_key="k", max_retries=0)
    with ws_transport.wrap(plain) as client:
        assert client.responses.create(model=MODEL, input="hello").status == "completed"
        assert ws_transport.session_of(client).url == f"{websocket_base_url}/responses"


def test_options_come_as_one_object_or_as_keywords_not_both(server: BackgroundServer) -> None:
    with OpenAI(base_url=server.base_url, api_key="k") as plain, pytest.raises(TypeError):
        ws_transport.wrap(plain, ws_transport.SessionOptions(), lanes=False)


def test_a_copy_with_other_credentials_or_url_never_rides_the_original_socket() -> None:
    settings = Settings(api_keys=["good", "other"])
    with BackgroundServer(create_app(settings), settings) as guarded:
        client = ws_transport.wrap(OpenAI(base_url=guarded.base_url, api_key="good", max_retries=0))
        try:
            history: list[Any] = [user("hello")]
            history += client.responses.create(model=MODEL, input=history, store=False).output
            with pytest.raises(openai.AuthenticationError):
                client.with_options(api_key="bad").responses.create(model=MODEL, input="hi", store=False)
            with pytest.raises(openai.APIConnectionError):
                client.with_options(base_url="http://127.0.0.1:9/v1").responses.create(model=MODEL, input="hi")
            other = client.with_options(api_key="other").responses.create(model=MODEL, input="hi", store=False)
            assert other.status == "completed"
            history.append(user("still chained"))
            assert client.responses.create(model=MODEL, input=history, store=False).status == "completed"
            stats = ws_transport.session_of(client).stats
            assert stats.turns_chained == 1 and stats.fallbacks == 1
        finally:
            client.close()


def test_a_closed_sync_client_refuses_turns_as_plain_http_does(server: BackgroundServer) -> None:
    client = ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    assert client.responses.create(model=MODEL, input="hello", store=False).status == "completed"
    client.close()
    plain = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    plain.close()
    with pytest.raises(Exception) as over_http:  # openai 3.x: RuntimeError; 1.x/2.x: APIConnectionError from it
        plain.responses.create(model=MODEL, input="after close", store=False)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(type(over_http.value)) as wrapped:
        client.responses.create(model=MODEL, input="after close", store=False)
    assert "closed" in str(wrapped.value) + str(wrapped.value.__cause__)
    assert {t.name for t in threading.enumerate()} == before


async def test_a_turn_on_a_closed_session_raises_session_closed(server: BackgroundServer) -> None:
    async with ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
        await client.responses.create(model=MODEL, input="hello")
        session = ws_transport.session_of(client)
        await session.aclose()
        assert session.state is SessionState.CLOSED
        with pytest.raises(openai.OpenAIError) as caught:
            await client.responses.create(model=MODEL, input="after close")
    # openai 1.x wraps every transport error in APIConnectionError; later versions let OpenAIErrors through
    closed = caught.value if OPENAI_MAJOR >= 2 else caught.value.__cause__
    assert isinstance(closed, ws_transport.SessionClosed) and isinstance(closed, RuntimeError)


# --- prepare: a call split before the SDK serializes it -------------------------------------------


def test_prepare_splits_the_call_into_request_fields_and_input() -> None:
    session = ws_transport.Session()
    turn = prepare(
        session, {"model": MODEL, "input": "hi", "stream": True, "temperature": openai.NOT_GIVEN, "timeout": 5}
    )
    assert turn is not None and turn.stream
    assert turn.fields == {"model": MODEL}, "NOT_GIVEN and per-request arguments are not request fields"
    assert turn.plan.items == [{"type": "message", "role": "user", "content": "hi"}]


def test_prepare_merges_extra_body_into_the_fields() -> None:
    turn = prepare(ws_transport.Session(), {"model": MODEL, "input": "hi", "extra_body": {"max_output_tokens": 3}})
    assert turn is not None and turn.fields == {"model": MODEL, "max_output_tokens": 3}


@pytest.mark.parametrize(
    "call",
    [
        {"model": MODEL, "input": "hi", "background": True},
        {"model": MODEL, "extra_body": {"input": "hi"}},
        {"model": MODEL, "input": "hi", "extra_body": "not a dict"},
    ],
    ids=["background", "input-in-extra-body", "odd-extra-body"],
)
def test_prepare_leaves_calls_it_cannot_split_to_the_sdk(call: dict[str, Any]) -> None:
    assert prepare(ws_transport.Session(), call) is None


def test_prepare_leaves_everything_to_the_sdk_once_the_session_fell_back() -> None:
    session = ws_transport.Session()
    session.state = SessionState.HTTP_ONLY
    assert prepare(session, {"model": MODEL, "input": "hi"}) is None


def test_a_wrapped_call_leaves_no_ticket_behind(client: OpenAI) -> None:
    client.responses.create(model=MODEL, input="hello")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="hi", temperature=5)
    assert ws_transport.session_of(client).tickets == {}


@pytest.mark.parametrize(("idle_s", "reconnects"), [(0.05, 0), (30.0, 1)], ids=["keeper", "nobody-reads"])
def test_the_keeper_answers_the_servers_pings_while_the_sync_client_is_idle(
    monkeypatch: pytest.MonkeyPatch, idle_s: float, reconnects: int
) -> None:
    """The shim pings every 0.1 s and drops a socket whose pong is 0.5 s late: the keeper runs the sync
    client's loop once it was idle `IDLE_S`, so the socket (and its chain) outlives a 1.5 s tool call.
    With nobody reading the socket between calls (`IDLE_S` 30 s), the next turn finds it closed."""
    monkeypatch.setattr(ws_transport.portal, "IDLE_S", idle_s)
    settings = Settings()
    with BackgroundServer(create_app(settings), settings) as running:
        running.server.config.ws_ping_interval = 0.1  # read by each connection's protocol as it is made
        running.server.config.ws_ping_timeout = 0.5
        with ws_transport.wrap(OpenAI(base_url=running.base_url, api_key="k", max_retries=0)) as client:
            history: list[Any] = [user("one")]
            history += client.responses.create(model=MODEL, input=history, store=False).output
            time.sleep(1.5)
            second = client.responses.create(model=MODEL, input=[*history, user("two")], store=False)
            assert second.status == "completed"
            stats = ws_transport.session_of(client).stats
            assert stats.reconnects == reconnects
            assert stats.resends == reconnects  # sent chained, then again in full on the new socket


def waited_exit_code(pid: int, timeout_s: float = 20.0) -> int:
    """The child's exit code; killed (and -9) when it has not exited within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -9


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_opens_its_own_socket_and_the_parent_keeps_its_chain(server: BackgroundServer) -> None:
    """The inherited socket is the parent's: a child that used it would interleave its frames with the
    parent's (before, its call waited forever for a loop thread that does not survive a fork)."""
    with ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
        history: list[Any] = [user("one")]
        history += client.responses.create(model=MODEL, input=history, store=False).output
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # forking a process with threads
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                answer = client.responses.create(model=MODEL, input=[*history, user("child")], store=False)
                stats = ws_transport.session_of(client).stats
                code = 0 if (answer.status, stats.reconnects, stats.turns_chained) == ("completed", 1, 0) else 2
            finally:
                os._exit(code)
        assert waited_exit_code(pid) == 0
        answer = client.responses.create(model=MODEL, input=[*history, user("parent")], store=False)
        assert answer.status == "completed"
        stats = ws_transport.session_of(client).stats
        assert (stats.turns_chained, stats.reconnects, stats.resends) == (1, 0, 0)
