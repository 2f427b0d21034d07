"""Running under uvicorn: a free loopback port, and shutdown that closes WebSockets with 1001."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx2
import pytest
import websockets
from openai import AsyncOpenAI
from openai.types.websocket_reconnection import is_recoverable_close
from support.wire import API_KEY, MODEL, completed_ok, read_turn, run_turn, ws_url
from websockets.asyncio.client import connect as ws_connect
from websockets.frames import Frame, Opcode

from server_shim import BackgroundServer, Settings, create_app, ws_protocol
from server_shim.server import GIL_SWITCH_S, tune_interpreter
from server_shim.ws_protocol import ShimWebSocketProtocol, text_frame_header


def test_a_background_server_listens_on_a_free_loopback_port():
    settings = Settings(port=1)  # replaced by a free port
    with BackgroundServer(create_app(settings), settings) as server:
        assert server.base_url.startswith("http://127.0.0.1:") and server.settings.port != 1
        assert httpx2.get(server.base_url.removesuffix("/v1") + "/healthz").json()["status"] == "ok"


async def test_shutdown_closes_an_idle_websocket_with_1001(make_server):
    server = make_server()
    async with ws_connect(ws_url(server)) as ws:
        stopping = asyncio.create_task(asyncio.to_thread(server.stop))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        await stopping
    assert closed.value.rcvd.code == 1001


async def test_shutdown_lets_a_response_in_flight_finish_then_closes_with_1001(make_server):
    server = make_server(simulated_ttft_s=0.3)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "response.created"
        stopping = asyncio.create_task(asyncio.to_thread(server.stop))
        types = []
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                types.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
        await stopping
    assert types[-1] == "response.completed"
    assert closed.value.rcvd.code == 1001


async def test_the_sdk_sees_a_recoverable_close_on_shutdown(make_server):
    server = make_server()
    async with (
        AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk,
        sdk.responses.connect() as conn,
    ):
        completed_ok(await run_turn(conn, input="hi", store=False))
        await asyncio.to_thread(server.stop)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await read_turn(conn)
    assert closed.value.rcvd.code == 1001 and is_recoverable_close(1001)


async def test_a_stopped_server_refuses_new_connections(make_server):
    server = make_server()
    await asyncio.to_thread(server.stop)
    with pytest.raises(OSError):
        async with ws_connect(ws_url(server), open_timeout=2):
            pass


async def test_the_events_of_a_turn_that_are_ready_together_leave_in_one_socket_write(make_server):
    server = make_server(simulated_tokens_per_s=0)
    async with ws_connect(ws_url(server)) as ws:
        (protocol,) = [c for c in server.server.server_state.connections if isinstance(c, ShimWebSocketProtocol)]
        writes: list[bytes] = []
        protocol.transport = _CountingTransport(protocol.transport, writes)  # uvloop's cannot be patched
        create = {"type": "response.create", "model": MODEL, "input": "hi", "store": False, "max_output_tokens": 3}
        for _ in range(2):  # and the connection carries on with the next turn the same way
            writes.clear()
            await ws.send(json.dumps(create))
            types = []
            while not types or types[-1] != "response.completed":
                types.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
            assert len(types) >= 9 and "response.output_text.delta" in types
            assert len(writes) == 1, [len(w) for w in writes]


async def test_a_turn_ready_in_one_step_is_run_in_the_read_and_written_as_its_step_ends_not_by_a_loop_callback(
    make_server,
):
    """The lane runs as `FlushedSteps`: a turn whose events are all ready is written as the lane's step ends, with
    no loop iteration for the cork's callback. A request read whole (`frame_now`) has that step run inside the
    protocol's read (`eager`): no task, no iteration for it either; one from the receive loop, in its task."""
    server = make_server(simulated_tokens_per_s=0)
    async with ws_connect(ws_url(server)) as ws:
        (protocol,) = [c for c in server.server.server_state.connections if isinstance(c, ShimWebSocketProtocol)]
        writers: list[tuple[asyncio.Task | None, set[str]]] = []
        protocol.transport = _CountingTransport(protocol.transport, [], writers)
        create = {"type": "response.create", "model": MODEL, "input": "hi", "store": False, "max_output_tokens": 3}
        for _ in range(2):
            writers.clear()
            await ws.send(json.dumps(create))
            types = []
            while not types or types[-1] != "response.completed":
                types.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
            assert len(types) >= 9 and len(writers) == 1
            task, callers = writers[0]
            assert "FlushedSteps.send" in callers, "written as the lane's step ends"
            assert task is None and "ShimWebSocketProtocol.data_received" in callers, "the step ran in the read"
        await ws.send(json.dumps({**create, "model": ""}))  # refused by the receive loop: by the lane's task
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "error"
        task, callers = writers[1]
        assert len(writers) == 2 and "FlushedSteps.send" in callers and "_run_lane" in repr(task)


async def test_a_delta_that_is_alone_is_written_at_once_not_held_for_the_next(make_server):
    server = make_server(simulated_tokens_per_s=10)  # a delta every 100 ms
    async with ws_connect(ws_url(server)) as ws:
        create = {"type": "response.create", "model": MODEL, "input": "hi", "store": False, "max_output_tokens": 3}
        await ws.send(json.dumps(create))
        arrivals = []
        while not arrivals or arrivals[-1][0] != "response.completed":
            event = json.loads(await asyncio.wait_for(ws.recv(), 10))
            arrivals.append((event["type"], asyncio.get_running_loop().time()))
    deltas = [t for kind, t in arrivals if kind == "response.output_text.delta"]
    assert len(deltas) == 3
    assert deltas[1] - deltas[0] > 0.05 and deltas[2] - deltas[1] > 0.05  # each one left when it was ready


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000])
def test_the_fast_path_frame_header_is_what_websockets_writes(size):
    payload = b"x" * size
    expected = Frame(Opcode.TEXT, payload).serialize(mask=False, extensions=[])
    assert text_frame_header(size) + payload == expected


def test_the_headers_made_ahead_are_what_websockets_writes_for_every_size_they_cover():
    """`send_texts_now` takes a frame's header from the table below `_HEADERS_MADE` bytes, and packs it above."""
    for size in range(ws_protocol._HEADERS_MADE + 1):
        expected = Frame(Opcode.TEXT, b"x" * size).serialize(mask=False, extensions=[])
        header = ws_protocol._HEADERS[size] if size < ws_protocol._HEADERS_MADE else text_frame_header(size)
        assert header + b"x" * size == expected


async def test_events_of_every_frame_length_arrive_whole_through_the_fast_path(make_server):
    server = make_server(simulated_tokens_per_s=0)
    async with ws_connect(ws_url(server), max_size=None) as ws:
        create = {"type": "response.create", "model": MODEL, "input": "hi", "store": False, "max_output_tokens": 9000}
        for _ in range(2):
            await ws.send(json.dumps(create))
            sizes = []
            while True:
                raw = await asyncio.wait_for(ws.recv(), 10)
                sizes.append(len(raw))
                event = json.loads(raw)
                if event["type"] == "response.completed":
                    break
            assert min(sizes) < 65536 <= max(sizes)  # 16-bit and 64-bit lengths; 7-bit in the header test
            assert len(event["response"]["output"][0]["content"][0]["text"]) > 65536


def test_the_startup_heap_is_frozen_out_of_the_collectors_sight_with_the_long_lived_thresholds():
    import gc

    from server_shim.trim import GC_THRESHOLDS, freeze_startup_heap

    before = gc.get_threshold()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0 and gc.get_threshold() == GC_THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def _callers() -> set[str]:
    frame, names = sys._getframe(1), set()
    while frame is not None:
        names.add(frame.f_code.co_qualname)
        frame = frame.f_back
    return names


class _CountingTransport:
    """The protocol's own transport, with each `write` recorded on the way through."""

    def __init__(self, inner, writes: list[bytes], writers: list[tuple[asyncio.Task | None, set[str]]] | None = None):
        self._inner = inner
        self._writes = writes
        self._writers = writers
        self.pauses = 0

    def write(self, data: bytes) -> None:
        self._writes.append(data)
        if self._writers is not None:  # the running task, and the functions the write was made from
            self._writers.append((asyncio.current_task(), _callers()))
        self._inner.write(data)

    def pause_reading(self) -> None:
        self.pauses += 1
        self._inner.pause_reading()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


async def test_reading_pauses_only_when_a_frame_is_already_waiting_not_once_per_turn(make_server):
    server = make_server(simulated_ttft_s=0.2)
    async with ws_connect(ws_url(server)) as ws:
        (protocol,) = [c for c in server.server.server_state.connections if isinstance(c, ShimWebSocketProtocol)]
        transport = protocol.transport = _CountingTransport(protocol.transport, [])

        async def turns(count: int, lane: str) -> None:
            create = {"type": "response.create", "model": MODEL, "input": "hi", "store": False, "stream_id": lane}
            frame = Frame(Opcode.TEXT, json.dumps(create).encode()).serialize(mask=True, extensions=[])
            ws.transport.write(frame * count)  # pipelined: all in one write, so they reach the server together
            done = 0
            while done < count:
                done += json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "response.completed"

        await turns(1, "a")
        await turns(1, "a")
        assert transport.pauses == 0  # one frame, then its reply: the socket stays readable
        await turns(6, "a")  # pipelined on one lane: frames wait for the app, and reading pauses
        assert transport.pauses >= 1


class RecordSends:
    """A user's ASGI middleware that looks at every message the app sends (as logging or tracing would)."""

    def __init__(self, app, seen: list[dict]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope, receive, send) -> None:
        async def recording(message) -> None:
            self.seen.append(message)
            await send(message)

        await self.app(scope, receive, recording)


async def test_a_middleware_that_wraps_send_sees_every_event_frame_the_direct_writer_would_skip(tmp_path):
    settings = Settings(drain_timeout_s=2.0, usage_path=str(tmp_path / "usage.db"))
    app = create_app(settings)
    seen: list[dict] = []
    app.add_middleware(RecordSends, seen=seen)
    with BackgroundServer(app, settings) as server:
        async with ws_connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
            received = [json.loads(await asyncio.wait_for(ws.recv(), 10))["type"]]
            while received[-1] != "response.completed":
                received.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
    sent = [json.loads(m["text"])["type"] for m in seen if m["type"] == "websocket.send"]
    assert sent == received and len(sent) > 3


def test_the_direct_writer_is_kept_only_where_send_is_the_protocols_own_and_no_user_middleware_wraps_it():
    app = create_app(Settings())

    async def own_send(message) -> None: ...

    async def wrapped_send(message) -> None: ...

    extension = {"asgi_send": own_send}
    assert app._sends_unwrapped(extension, own_send)
    assert not app._sends_unwrapped(extension, wrapped_send), "an ASGI wrapper around the app"
    assert not app._sends_unwrapped({}, own_send), "a protocol that does not say which send is its own"
    app.add_middleware(RecordSends, seen=[])
    assert not app._sends_unwrapped(extension, own_send), "a middleware added inside the app"


def test_a_serving_process_hands_the_gil_over_sooner_than_cpythons_default() -> None:
    """`serve` (and each worker) tunes its interpreter: a thread (the usage ledger's writer) keeps the GIL at most
    `GIL_SWITCH_S` while the event loop waits for it, not CPython's 5 ms, a stall for every turn in flight."""
    import gc

    before, thresholds = sys.getswitchinterval(), gc.get_threshold()
    try:
        tune_interpreter()
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_S) and GIL_SWITCH_S < 0.005
        assert gc.get_freeze_count() > 0
    finally:
        sys.setswitchinterval(before)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
