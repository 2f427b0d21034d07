"""The WebSocket connection: frames -> lanes -> turns, with limits and close codes.

One `ResponsesConnection` per socket. Requests on one lane (`stream_id`, or the default
lane) run in order; lanes run concurrently up to `max_in_flight` responses. Malformed
frames get an `error` event, in the order of the lane they name (the default lane when
they name none), and the connection carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from starlette.websockets import WebSocket, WebSocketDisconnect

from . import eager, json_slices, metrics, tracing
from .admission import QueueBound
from .errors import APIError
from .events import new_id
from .in_flight import InFlight
from .limits import is_large
from .requests import CreateRequest, check_stream_id, parse_create
from .steer import Steering
from .tenants import scope_tenant
from .turn_settings import SettingsMemo
from .ws_frames import (
    CLOSE_GOING_AWAY,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_POLICY_VIOLATION,
    FORCE_CLOSE_EXTENSION,
    ConnectionState,
    age_limit_error,
    encode_event,
    frame_nbytes,
    idle_error,
    lane_of,
    read_frame,
    read_frame_now,
    too_large_error,
    with_lane,
)
from .ws_turns import run_turn

if TYPE_CHECKING:
    from .app import ShimState

log = logging.getLogger(__name__)
_BYTES_RECEIVED = metrics.BYTES_RECEIVED.labels("websocket")
_OPEN, _CLOSED = ConnectionState.OPEN, ConnectionState.CLOSED
"""Read as globals where a turn's frame is read and its events sent: an Enum's member read off its class costs
~900 instructions under Python 3.11 (its metaclass is not `type`: no specialized lookup)."""


@dataclass
class _Lane:
    queue: deque[tuple[CreateRequest | APIError | str | bytes, int]] = field(default_factory=deque)
    """Each request with the size of the frame it came in, for the connection's `QueueBound` (a plain
    deque: the worker drains it and ends, nothing waits on it). A request that has to wait is kept as its
    frame and parsed when its turn comes: parsed, it holds 7-8 times its JSON, so `max_queued_bytes` would
    bound the frames but not the memory."""
    worker: asyncio.Future[None] | None = None
    """The task running the lane, or while the lane waits in line (`passes`), the future that stands for it."""


class ResponsesConnection:
    def __init__(self, websocket: WebSocket, shim: ShimState) -> None:
        settings = shim.settings
        self.websocket = websocket
        self.shim = shim
        self.settings = settings
        self.steering = Steering(shim.env.limits)
        self.state = ConnectionState.OPEN
        self._lanes: dict[str | None, _Lane] = {}
        self._in_flight = InFlight(settings.max_in_flight, asyncio.get_running_loop())
        self._send_lock = asyncio.Lock()
        self._closing: asyncio.Task[None] | None = None
        self._closing_error = APIError(503, "server_shutting_down", "The server is shutting down.")
        self.id = new_id("conn")
        self._loop = asyncio.get_running_loop()
        """The connection's loop, looked up once (each `get_running_loop` is a `getpid` system call in 3.11)."""
        self._passes = shim.pass_starts(self._loop)
        self.trace_carrier = tracing.carrier(websocket.scope["headers"])  # the upgrade request's trace context
        self.tenant = scope_tenant(websocket.scope)
        self.cache = shim.connection_cache(self.tenant)
        self.memo = SettingsMemo(shim.derivations, self.tenant)
        """What turns derive from the settings, reused while a request's are the same as the last's (`turn_settings`)."""
        self.queued = QueueBound(settings.max_queued_requests, settings.max_queued_bytes)
        self._room = asyncio.Event()
        """Set while `queued` is not full: frames are read only then."""
        self._room.set()
        self._idle: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0
        """Loop time when the connection last started waiting for a frame (the idle timeout counts from it)."""
        protocol = websocket.scope.get("extensions", {}).get(FORCE_CLOSE_EXTENSION, {})
        self._writable = protocol.get("writable")
        self._send_now = protocol.get("send_texts") if self._writable is not None else None
        self._steps = protocol.get("steps")
        """Runs a lane's coroutine so that its frames leave as each of its task's steps ends (`ws_protocol`)."""
        self._protocol = protocol
        self._parked = False
        """The receive loop waits for the next frame (`frame_now` may take it)."""

    async def run(self) -> None:
        await self.websocket.accept()
        if self._send_now is not None:  # the app's own send and receive (see `app.ShimApp`): frames may skip the loop
            self._protocol["on_text"] = self.frame_now
        age_limit = asyncio.get_running_loop().call_later(
            self.settings.connection_max_age_s, self._start_close, CLOSE_GOING_AWAY, age_limit_error()
        )
        try:
            await self._receive_loop()
        finally:
            self._protocol.pop("on_text", None)
            age_limit.cancel()
            if self._idle is not None:
                self._idle.cancel()
            self.state = ConnectionState.CLOSED
            await self._cancel_lanes()
            self.cache.close()
            release = self.shim.release
            if release is not None:
                try:
                    await release(self.id)
                except Exception:
                    log.exception("backend failed to release connection %s", self.id)

    async def _receive_loop(self) -> None:
        while self.state is not ConnectionState.CLOSED:
            self._arm_idle_timer()
            if not self._room.is_set():  # backpressure: a client pipelining past the bound is not read from
                await self._room.wait()
            self._parked = True
            try:
                message = await self.websocket.receive()
            finally:
                self._parked = False
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            data = text if text is not None else message.get("bytes") or b""
            size = frame_nbytes(data)
            self.shim.stats.bytes_received += size
            metrics.add(_BYTES_RECEIVED, size)
            if size > self.settings.max_frame_bytes:
                self._start_close(CLOSE_MESSAGE_TOO_BIG, too_large_error(self.settings.max_frame_bytes))
                continue
            if self.state is ConnectionState.DRAINING:
                await self.send(with_lane(self._closing_error.event(), lane_of(data)))
                continue
            await self._handle_frame(data, size)

    async def _handle_frame(self, data: str | bytes, size: int) -> None:
        stream_id, body = None, None
        request: CreateRequest | APIError | str | bytes
        try:
            limits = self.shim.env.limits
            read = read_frame_now(data, size, self.settings.sliced_parse_bytes, limits)
            body, shape = read or await read_frame(data, size, self.settings.sliced_parse_bytes, limits)
            if body["type"] == "response.steer":  # answered at once, whatever the lanes are doing
                await self.send(self.steering.submit(body))
                return
            stream_id = check_stream_id(body.get("stream_id"))
            request = (
                data
                if self._waits(stream_id)
                else parse_create(body, websocket=True, limits=self.shim.env.limits, depth=shape.depth)
            )
        except APIError as error:
            request = error  # refused in lane order, after the requests queued before it
        if is_large(nbytes=size):  # parsed: others run before it is freed (refused or kept as its frame) or queued
            await asyncio.sleep(0)
            if not isinstance(request, CreateRequest):
                await json_slices.dispose(body)
        if self._lane_limited(stream_id):
            message = f"At most {self.settings.max_lanes} stream_id lanes may be active on one connection."
            limit = APIError(400, "websocket_stream_limit_reached", message, "stream_id")
            await self.send(with_lane(limit.event(), stream_id))
            return
        self._enqueue(stream_id, request, size)

    def frame_now(self, text: str) -> bool:
        """A text frame as the protocol reads it (`ws_protocol`), while the receive loop waits with nothing queued
        for it: the usual `response.create` (small, valid, on a lane it may use, leaving room) is queued on its
        lane here, without waking the receive loop for it (a loop iteration and its task step per request).
        False, having changed nothing: anything else, which the receive loop then gets as before."""
        if not self._parked or self.state is not _OPEN or not self._room.is_set():
            return False
        size = frame_nbytes(text)
        queued = self.queued
        if (
            size > self.settings.max_frame_bytes
            or is_large(nbytes=size)
            or queued.requests + 1 >= queued.max_requests
            or queued.nbytes + size >= queued.max_bytes  # so this request leaves room, as the loop would
        ):
            return False
        limits = self.shim.env.limits
        try:
            read = read_frame_now(text, size, self.settings.sliced_parse_bytes, limits)
            if read is None or read[0]["type"] != "response.create":
                return False
            body, shape = read
            stream_id = body.get("stream_id")
            if stream_id is not None and self._lane_limited(check_stream_id(stream_id)):  # the default lane: never
                return False
            request = (
                text if self._waits(stream_id) else parse_create(body, websocket=True, limits=limits, depth=shape.depth)
            )
        except APIError:
            return False  # refused by the receive loop, in lane order
        self._waiting_since = self._loop.time()  # the receive loop would take it and wait again from now
        self.shim.stats.bytes_received += size
        metrics.add(_BYTES_RECEIVED, size)
        self._enqueue(stream_id, request, size, eagerly=True)
        return True

    def _lane_limited(self, stream_id: str | None) -> bool:
        """Whether `stream_id` would be a lane beyond `max_lanes`."""
        new_named = stream_id is not None and stream_id not in self._lanes
        return new_named and sum(k is not None for k in self._lanes) >= self.settings.max_lanes

    def _enqueue(
        self, stream_id: str | None, request: CreateRequest | APIError | str | bytes, size: int, eagerly: bool = False
    ) -> None:
        """`request` on its lane, the lane's worker started when it has none: `eagerly` (from the protocol's read,
        outside any task), its first step run here (`eager`), often the whole turn, and a task only for the rest
        (unless this pass of the loop has started its share of lanes: then in line, started by a later pass as here,
        see `passes`);
        from the receive loop, in a task of its own (a step run in the receive loop's task would have its
        `current_task()`)."""
        lane = self._lanes.get(stream_id)
        if lane is None:
            lane = self._lanes[stream_id] = _Lane()
            metrics.add(metrics.LANES, 1)
        lane.queue.append((request, size))
        self.queued.add(size)
        if self.queued.full:
            self._room.clear()
        if lane.worker is None:
            if eagerly and not self._passes.at_once():
                lane.worker = self._passes.in_line(functools.partial(self._start_lane, stream_id, lane))
            else:
                lane.worker = self._start_lane(stream_id, lane, eagerly)

    def _start_lane(self, stream_id: str | None, lane: _Lane, eagerly: bool = True) -> asyncio.Task[None] | None:
        """The lane's worker: its first step run here when `eagerly`, the task that goes on with it (or None)."""
        worker = self._run_lane(stream_id, lane)
        steps = worker if self._steps is None else self._steps(worker)
        if not eagerly:
            return self._loop.create_task(steps)
        task = eager.start(self._loop, steps)
        if lane.worker is not None and task is not None:  # started from the line: the task stands for itself now
            lane.worker = task
        return task

    def _waits(self, stream_id: str | None) -> bool:
        """Whether a request for this lane would wait (its lane busy, or every in-flight slot taken)."""
        lane = self._lanes.get(stream_id)
        return (lane is not None and lane.worker is not None) or not self._in_flight.free

    async def _parsed(self, frame: str | bytes, size: int) -> CreateRequest | APIError:
        """A queued frame read again when its turn comes (its JSON and type were checked on arrival)."""
        try:
            body, shape = await read_frame(frame, size, self.settings.sliced_parse_bytes, self.shim.env.limits)
            return parse_create(body, websocket=True, limits=self.shim.env.limits, depth=shape.depth)
        except APIError as error:
            return error

    async def _run_lane(self, stream_id: str | None, lane: _Lane) -> None:
        """Run the lane's requests in order; the lane goes away when its queue is empty."""
        try:
            while lane.queue:
                request, size = lane.queue.popleft()
                self._dequeued(size)
                if isinstance(request, APIError):
                    await self.send(with_lane(request.event(), stream_id))
                    continue
                if not self._in_flight.take_now():
                    await self._in_flight.take()
                try:  # a queued frame is parsed only once it may run
                    if isinstance(request, str | bytes):
                        request = await self._parsed(request, size)
                    if isinstance(request, APIError):
                        await self.send(with_lane(request.event(), stream_id))
                    else:
                        await run_turn(self, request, stream_id)
                finally:
                    self._in_flight.give()
        except WebSocketDisconnect:
            pass  # the client is gone: the turn was stopped (and metered) on the way out; nothing is left to tell
        finally:
            self._drop_lane(stream_id, lane)

    def _drop_lane(self, stream_id: str | None, lane: _Lane) -> None:
        """The lane is done: its queue released and the lanes gauge undone, once (from its worker, or from
        `_cancel_lanes` for a worker cancelled before it ever ran, whose `finally` never runs)."""
        while lane.queue:
            self._dequeued(lane.queue.popleft()[1])
        if self._lanes.get(stream_id) is lane:
            del self._lanes[stream_id]
            metrics.add(metrics.LANES, -1)

    def _dequeued(self, size: int) -> None:
        self.queued.remove(size)
        if not self.queued.full:
            self._room.set()

    def _arm_idle_timer(self) -> None:
        """From now, `idle_timeout_s` without a frame closes the connection. One timer per connection,
        moved only when it fires (not cancelled and made again for every frame)."""
        self._waiting_since = self._loop.time()
        if self._idle is None:
            self._idle = self._loop.call_at(self._waiting_since + self.settings.idle_timeout_s, self._on_idle)

    def _on_idle(self) -> None:
        """No frame for `idle_timeout_s`: close if nothing is in flight, else look again later."""
        self._idle = None
        due = self._waiting_since + self.settings.idle_timeout_s
        if self._loop.time() < due:  # a frame came since the timer was set
            self._idle = self._loop.call_at(due, self._on_idle)
        elif self._lanes:
            self._arm_idle_timer()
        else:
            self._start_close(CLOSE_GOING_AWAY, idle_error(self.settings.idle_timeout_s))

    def sent_at_once(self, events: list[dict[str, Any] | bytes]) -> bool:
        """Send `events` now if the socket is writable and no send waits before them (nothing to await);
        False when `send` must do it. A turn's events take this path without a coroutine each, and most often
        encoded already (`event_frames`): they then go as they are, without a list made for them."""
        if self._send_now is None or self._send_lock.locked() or not self._writable():
            return False
        if self.state is _CLOSED:
            raise WebSocketDisconnect(1006)
        try:
            for event in events:
                if event.__class__ is not bytes:
                    events = [encode_event(event) for event in events]
                    break
            self._send_now(events)
        except OSError:
            self._gone()
        return True

    async def send_all(self, events: list[dict[str, Any] | bytes]) -> None:
        """`send` each of `events` in order: a turn's batch that `sent_at_once` could not send."""
        for event in events:
            await self.send(event)

    async def send(self, event: dict[str, Any] | bytes) -> None:
        if self.sent_at_once([event]):
            return
        data = encode_event(event)
        async with self._send_lock:
            if self.state is ConnectionState.CLOSED:
                raise WebSocketDisconnect(1006)
            try:
                if self._writable is not None and self._writable():  # the send will not wait: no timer needed
                    await self.websocket.send_text(data.decode())
                    return
                await eager.on_task()  # the timeout cancels the current task
                async with asyncio.timeout(self.settings.send_timeout_s):
                    await self.websocket.send_text(data.decode())
            except TimeoutError:
                self._close_slow_reader()
                raise WebSocketDisconnect(CLOSE_POLICY_VIOLATION) from None
            except (OSError, RuntimeError):  # closed under us (peer gone, or closed with 1009)
                self._gone()

    def _gone(self) -> NoReturn:
        """The socket closed under a send (peer gone, or closed with 1009): the connection is over."""
        self.state = ConnectionState.CLOSED
        self._room.set()
        raise WebSocketDisconnect(1006) from None

    def _close_slow_reader(self) -> None:
        """The client has not read for `send_timeout_s`: it holds a slot and a buffer, so it is let go."""
        log.warning("connection %s: client not reading for %.0f s; closing", self.id, self.settings.send_timeout_s)
        metrics.CLOSED_CONNECTIONS.labels("websocket", "slow_reader").inc()
        self.state = ConnectionState.CLOSED
        self._room.set()
        force_close = self.websocket.scope.get("extensions", {}).get(FORCE_CLOSE_EXTENSION)
        reason = "client not reading"
        if force_close is not None:
            force_close["close"](CLOSE_POLICY_VIOLATION, reason)
        else:
            asyncio.get_running_loop().create_task(self.websocket.close(CLOSE_POLICY_VIOLATION, reason))

    def _start_close(self, code: int, error: APIError | None) -> None:
        """Stop taking requests, let in-flight responses finish, then close with `code`."""
        if self._closing is not None or self.state is ConnectionState.CLOSED:
            return
        self.state = ConnectionState.DRAINING
        if error is not None:
            self._closing_error = error
        self._closing = asyncio.create_task(self._drain_and_close(code, error))

    async def close(self, code: int = CLOSE_GOING_AWAY) -> None:
        """Close from the server side (shutdown); waits for in-flight responses first."""
        self._start_close(code, None)
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)

    async def _drain_and_close(self, code: int, error: APIError | None) -> None:
        workers = [lane.worker for lane in self._lanes.values() if lane.worker is not None]
        if workers:
            _, pending = await asyncio.wait(workers, timeout=self.settings.drain_timeout_s)
            for task in pending:
                task.cancel()
        with contextlib.suppress(Exception):
            if error is not None:
                await self.send(error.event())
            self.state = ConnectionState.CLOSED
            await self.websocket.close(code)

    async def _cancel_lanes(self) -> None:
        workers = [lane.worker for lane in self._lanes.values() if lane.worker is not None]
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for stream_id, lane in list(self._lanes.items()):
            self._drop_lane(stream_id, lane)
        if self._closing is not None and self._closing is not asyncio.current_task():
            self._closing.cancel()
            await asyncio.gather(self._closing, return_exceptions=True)
