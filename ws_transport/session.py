"""One persistent WebSocket session: sockets, `stream_id` lanes, and the reconnect/resend policy.

A `Connection` is one socket whose reader task puts each event in the queue of the lane (the
`stream_id`) that waits for it; every turn gets a fresh lane id, so a late event of an
abandoned turn has no queue and is dropped instead of reaching the next turn. A `Session` hands
turns to connections (the one holding the turn's chain first), opens sockets with bounded
backoff, resends a turn in full once when its chain or socket is lost, and switches to HTTP for
good when the upgrade is refused. Everything runs on one event loop: the caller's for the async
client, a private one for the sync client (see `portal.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx2
import orjson
from openai.lib._websocket import _WebSocketConnect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from .chaining import Chain, ChainBook, should_resend
from .errors import ConnectionLost, TurnRejected, UpgradeRejected, UseHTTP, error_code
from .options import FALLBACK_STATUSES, SessionOptions, SessionStats
from .turn import TICKET_HEADER, TurnRequest

log = logging.getLogger("ws_transport")

COMPLETED = frozenset({"response.completed", "response.incomplete"})
FAILED = "response.failed"
ABNORMAL_CLOSURE = 1006
MESSAGE_TOO_BIG = 1009
DROP_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "accept",
        "accept-encoding",
        "connection",
        "transfer-encoding",
        "user-agent",
        "idempotency-key",
        TICKET_HEADER,
        "x-stainless-raw-response",
        "x-stainless-retry-count",
        "x-stainless-read-timeout",
        "x-stainless-timeout",
    }
)
"""Request headers that describe one HTTP exchange; the rest (auth, org, project, beta, custom) go on the upgrade."""
CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "openai-organization", "openai-project"})
"""Headers that say who a request speaks for (`api-key` is Azure's)."""

Headers = list[tuple[str, str]]
Credentials = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class _Attempt:
    """How far one send of a turn got: what may still be retried, and whether its lane is clean."""

    sent: bool = False
    nbytes: int = 0
    delivered: bool = False
    """Events reached a consumer that keeps them (a stream): a restart can no longer be hidden."""
    finished: bool = False


@dataclass(frozen=True, slots=True)
class Closed:
    """Put in every waiting lane when the socket closes, so no turn waits forever."""

    code: int
    reason: str


class Connection:
    """One socket; its reader routes each event to the lane (stream_id) waiting for it."""

    def __init__(
        self, socket: ClientConnection, generation: int, *, lanes: bool, capacity: int, credentials: Credentials = ()
    ) -> None:
        self.socket = socket
        self.generation = generation
        self.credentials = credentials
        """The credentials the socket was upgraded with: only turns with the same ones ride it."""
        self.opened_at = time.monotonic()
        self.use_lanes = lanes
        self.capacity = capacity if lanes else 1
        self.lanes: dict[str | None, asyncio.Queue[dict[str, Any] | Closed]] = {}
        self.closed: Closed | None = None
        self.draining = False
        self._lane_ids = 0
        self.reader = asyncio.create_task(self._read(), name=f"ws_transport reader #{generation}")

    @property
    def usable(self) -> bool:
        return self.closed is None and not self.draining

    @property
    def free(self) -> int:
        return self.capacity - len(self.lanes)

    def open_lane(self) -> str | None:
        lane = None
        if self.use_lanes:
            self._lane_ids += 1
            lane = f"t{self._lane_ids}"
        self.lanes[lane] = asyncio.Queue()
        return lane

    def close_lane(self, lane: str | None) -> None:
        self.lanes.pop(lane, None)

    async def send(self, frame: bytes) -> None:
        try:
            await self.socket.send(frame.decode())  # a text frame; `send(bytes, text=True)` needs websockets 14
        except ConnectionClosed as exc:
            raise ConnectionLost(*_close_info(self.socket)) from exc

    async def next_event(self, lane: str | None, timeout: float | None) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            item = await self.lanes[lane].get()
        if isinstance(item, Closed):
            raise ConnectionLost(item.code, item.reason)
        return item

    async def aclose(self) -> None:
        await self.socket.close()
        await asyncio.gather(self.reader, return_exceptions=True)

    async def _read(self) -> None:
        try:
            async for message in self.socket:
                event = orjson.loads(message)
                if isinstance(event, dict):
                    self._route(event)
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            self.socket.transport.abort()  # the loop is going away (asyncio.run ending): no close handshake
            raise
        except orjson.JSONDecodeError as exc:
            log.warning("ws_transport: closing a socket that sent a frame that is not JSON: %s", exc)
            await self.socket.close(1002)
        finally:
            self.closed = Closed(*_close_info(self.socket))
            for queue in self.lanes.values():
                queue.put_nowait(self.closed)

    def _route(self, event: dict[str, Any]) -> None:
        queue = self.lanes.get(event.get("stream_id") if self.use_lanes else None)
        if queue is not None:
            queue.put_nowait(event)
            return
        if error_code(event) == "websocket_connection_limit_reached":
            self.draining = True
        log.debug("ws_transport: dropped %s event for no waiting lane (%s)", event.get("type"), event.get("stream_id"))


def _close_info(socket: ClientConnection) -> tuple[int, str]:
    return socket.close_code or ABNORMAL_CLOSURE, socket.close_reason or ""


class Session:
    """A persistent session shared by every `responses.create` of one client.

    `events(turn)` sends one turn and yields its server events. Chains, stats and tickets may be
    touched from any thread; sockets only from the session's event loop.
    """

    def __init__(self, options: SessionOptions | None = None) -> None:
        self.options = options or SessionOptions()
        self.stats = SessionStats()
        self.chains = ChainBook(self.options.max_chains)
        self.tickets: dict[str, TurnRequest] = {}
        self.url: str | None = None
        self.user_agent: str | None = None
        self.http_only = False
        self.frame_limit: int | None = None
        """The smallest frame the server refused with 1009: frames this large go over HTTP untried."""
        self.closed = False
        self._connections: list[Connection] = []
        self._generation = 0
        self._opening = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._closers: set[asyncio.Task[None]] = set()

    def bind(self, request: httpx2.Request) -> Headers | None:
        """The upgrade headers (credentials included) for this request's turn; the first request sets the URL.

        Returns None for a request to another URL than the session's: that one goes over HTTP.
        """
        url = self.options.websocket_url or websocket_url(request.url)
        if self.url is None:
            self.url = url
        elif url != self.url:
            return None
        self.user_agent = request.headers.get("user-agent")
        return [(k, v) for k, v in request.headers.multi_items() if k.lower() not in DROP_HEADERS]

    async def events(
        self, turn: TurnRequest, *, transparent: bool, read_timeout: float | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Send `turn` and yield its events up to the terminal one.

        A lost chain or socket before the first yielded event (any time when `transparent`, i.e.
        the consumer only keeps the terminal event) resends the turn in full once. Raises
        `TurnRejected` for an error before the response started, `ConnectionLost` when the
        socket dies and cannot be hidden, `UseHTTP` when this turn or the session goes to HTTP.
        """
        self._check_loop()
        resent = False
        while True:
            conn, lane = await self._acquire(turn.chain, turn.headers)
            attempt = _Attempt()
            try:
                chained = not resent and turn.can_chain(conn.generation)
                attempt.nbytes = await self._send(conn, lane, turn, chained=chained)
                attempt.sent = True
                event = await self._next_event(conn, lane, read_timeout)
                if event.get("type") == "error":
                    attempt.finished = True
                    self._resend_or_reject(conn, turn, event, chained=chained, resent=resent)
                else:
                    attempt.delivered = not transparent
                    async with contextlib.aclosing(self._rest(conn, lane, turn, event, read_timeout, attempt)) as rest:
                        async for event in rest:
                            yield event
                    return
            except ConnectionLost as lost:
                self._check_resendable(lost, attempt, resent=resent)
                self.chains.forget(turn.chain)
            finally:
                self._release(conn, lane, clean=attempt.finished or not attempt.sent)
            resent = True
            self.stats.resends += 1

    async def _rest(
        self,
        conn: Connection,
        lane: str | None,
        turn: TurnRequest,
        first: dict[str, Any],
        timeout: float | None,
        attempt: _Attempt,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events from the first on; state is settled before the terminal event is handed on.

        (A consumer may stop reading at the terminal event and never ask for more.)
        """
        event = first
        while True:
            kind = event.get("type")
            if kind in COMPLETED:
                self._record(turn, event, conn.generation)
            elif kind == FAILED:
                self.chains.forget(turn.chain)
            attempt.finished = kind in COMPLETED or kind == "error"
            yield event
            if attempt.finished:
                return
            if kind == FAILED:
                trailing = await self._trailing_error(conn, lane)
                attempt.finished = True
                if trailing is not None:
                    yield trailing
                return
            event = await self._next_event(conn, lane, timeout)

    async def _next_event(self, conn: Connection, lane: str | None, timeout: float | None) -> dict[str, Any]:
        event = await conn.next_event(lane, timeout)
        if self.options.on_event is not None:
            _observe(self.options.on_event, event)
        return event

    def _check_resendable(self, lost: ConnectionLost, attempt: _Attempt, *, resent: bool) -> None:
        """Raise unless the turn can be resent in full: once, before the caller saw anything, for a
        recoverable close (any close, if the frame never left). A frame over the server's size limit
        goes over HTTP instead, where there is no frame limit.
        """
        if lost.code == MESSAGE_TOO_BIG and not attempt.delivered:
            if self.frame_limit is None:
                log.warning(
                    "ws_transport: a %d-byte request exceeded the server's frame limit; such go over HTTP",
                    attempt.nbytes,
                )
            self.frame_limit = min(self.frame_limit or attempt.nbytes, attempt.nbytes)
            raise UseHTTP("frame too large") from lost
        recoverable = not attempt.sent or self.options.reconnect.recoverable(lost.code)
        if resent or attempt.delivered or not recoverable:
            raise lost
        log.debug("ws_transport: %s; resending the turn in full", lost)

    async def _trailing_error(self, conn: Connection, lane: str | None) -> dict[str, Any] | None:
        """The `error` event that may follow `response.failed`: it carries the status HTTP would return."""
        try:
            event = await self._next_event(conn, lane, self.options.failed_error_grace_s)
        except (TimeoutError, ConnectionLost):
            return None
        return event if event.get("type") == "error" else None

    def _resend_or_reject(
        self, conn: Connection, turn: TurnRequest, event: dict[str, Any], *, chained: bool, resent: bool
    ) -> None:
        code = error_code(event)
        if resent or not should_resend(code, chained=chained):
            raise TurnRejected(event)
        if code in ("websocket_connection_limit_reached", "server_shutting_down"):
            conn.draining = True
        self.chains.forget(turn.chain)
        log.debug("ws_transport: %s; resending the turn in full", code)

    async def _send(self, conn: Connection, lane: str | None, turn: TurnRequest, *, chained: bool) -> int:
        """Send the turn's frame; returns its size. A frame the server would refuse (1009) goes over HTTP."""
        frame, http_equivalent = turn.frame(lane, chained=chained)
        if self.frame_limit is not None and len(frame) >= self.frame_limit:
            log.debug("ws_transport: %d-byte frame over the server's limit; sending it over HTTP", len(frame))
            raise UseHTTP("frame too large")
        if self.options.on_request is not None:
            _observe(self.options.on_request, orjson.loads(frame))
        await conn.send(frame)
        stats = self.stats
        stats.bytes_sent += len(frame)
        if not turn.counted:
            turn.counted = True
            stats.turns += 1
            stats.turns_chained += chained or "previous_response_id" in turn.fields
            stats.bytes_http_equivalent += http_equivalent
        log.debug(
            "ws_transport: sent turn on socket #%d lane %s: chained=%s new_items=%d frame=%dB http_equivalent=%dB",
            conn.generation,
            lane,
            chained,
            len(turn.plan.new_items) if chained else len(turn.plan.items),
            len(frame),
            http_equivalent,
        )
        return len(frame)

    def _record(self, turn: TurnRequest, event: dict[str, Any], generation: int) -> None:
        response = event.get("response") or {}
        response_id = response.get("id")
        if isinstance(response_id, str):
            output = response.get("output") or []
            nbytes = turn.record_nbytes(output)
            turn.recorded = self.chains.record(turn.plan, response_id, output, nbytes, generation, turn.fields)

    async def _acquire(self, chain: Chain | None, headers: Headers) -> tuple[Connection, str | None]:
        """A lane on the socket holding `chain` if it has room, else on any socket with room, else a new one;
        always on a socket upgraded with this turn's credentials."""
        credentials = credentials_of(headers)
        while True:
            if self.closed:
                raise RuntimeError("the ws_transport session is closed")
            if self.http_only:
                raise UseHTTP("the session fell back to HTTP")
            conn = self._pick(chain, credentials)
            if conn is not None:
                return conn, conn.open_lane()
            live = sum(c.usable for c in self._connections)
            if live >= self.options.max_connections:
                self._retire_idle(credentials)
            if self._opening or live >= self.options.max_connections:
                await self._changed.wait()
                continue
            self._opening = True
            try:
                conn = await self._open(headers, replacing=live == 0 and self._generation > 0)
                self._connections.append(conn)
            finally:
                self._opening = False
                self._notify()
            return conn, conn.open_lane()

    def _pick(self, chain: Chain | None, credentials: Credentials) -> Connection | None:
        self._retire()
        ready = [c for c in self._connections if c.usable and c.free > 0 and c.credentials == credentials]
        if not ready:
            return None
        if chain is not None:
            for conn in ready:
                if conn.generation == chain.generation:
                    return conn
        return max(ready, key=lambda c: c.free)

    def _retire(self) -> None:
        """Drop closed sockets; retire those past the age limit (closed once their last turn ends)."""
        now = time.monotonic()
        for conn in list(self._connections):
            if conn.usable and now - conn.opened_at > self.options.max_connection_age_s:
                log.debug("ws_transport: socket #%d reached its age limit", conn.generation)
                conn.draining = True
            if conn.closed is not None:
                self._connections.remove(conn)
            elif conn.draining and not conn.lanes:
                self._connections.remove(conn)
                self._close_later(conn)

    def _retire_idle(self, credentials: Credentials) -> None:
        """Make room for a socket with other credentials: idle sockets with different ones close."""
        for conn in list(self._connections):
            if conn.usable and not conn.lanes and conn.credentials != credentials:
                conn.draining = True
                self._connections.remove(conn)
                self._close_later(conn)
                self._notify()

    def _release(self, conn: Connection, lane: str | None, *, clean: bool) -> None:
        """Free the lane. A turn abandoned mid-response keeps running on the server (this mode has
        no cancel but closing the socket), and without lanes its events would reach the next turn:
        its socket is retired, and closes once its other turns end, which cancels it server-side."""
        conn.close_lane(lane)
        if not clean:
            conn.draining = True
        if conn.draining and not conn.lanes and conn in self._connections:
            self._connections.remove(conn)
            self._close_later(conn)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _close_later(self, conn: Connection) -> None:
        task = asyncio.create_task(conn.aclose())
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    async def _open(self, headers: Headers, *, replacing: bool) -> Connection:
        """Connect with bounded backoff; refusal (404/405/426) or a spent budget means HTTP from now on."""
        policy = self.options.reconnect
        failure: Exception | None = None
        for attempt in range(policy.max_attempts):
            await asyncio.sleep(policy.delay(attempt))
            try:
                socket = await self._connect(headers)
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in FALLBACK_STATUSES:
                    self._fall_back(f"the server refused the WebSocket upgrade with HTTP {status}")
                if status < 500 and status not in (408, 429):
                    content_type = exc.response.headers.get("content-type", "text/plain")
                    body = bytes(exc.response.body or b"")
                    raise UpgradeRejected(status, body, [("content-type", content_type)]) from exc
                failure = exc
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                failure = exc
            else:
                self._generation += 1
                if replacing:
                    self.stats.reconnects += 1
                log.debug("ws_transport: opened socket #%d to %s", self._generation, self.url)
                return Connection(
                    socket,
                    self._generation,
                    lanes=self.options.lanes,
                    capacity=self.options.max_in_flight,
                    credentials=credentials_of(headers),
                )
            log.debug("ws_transport: connection attempt %d failed: %s", attempt + 1, failure)
        self._fall_back(f"could not open a WebSocket after {policy.max_attempts} attempts ({failure})")

    async def _connect(self, headers: Headers) -> ClientConnection:
        assert self.url is not None
        options: dict[str, Any] = {"max_size": None, "compression": None, "open_timeout": self.options.open_timeout_s}
        options.update(self.options.connect_options)
        return await _WebSocketConnect(
            self.url, additional_headers=headers, user_agent_header=self.user_agent, **options
        )

    def _fall_back(self, reason: str) -> NoReturn:
        if not self.http_only:
            self.http_only = True
            log.warning("ws_transport: %s; this session continues over HTTP", reason)
        raise UseHTTP(reason)

    def _check_loop(self) -> None:
        """Sockets belong to one event loop; a client reused on a new loop starts with fresh ones."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._connections:
            log.debug("ws_transport: the event loop changed; leaving %d socket(s) behind", len(self._connections))
        self._loop = loop
        self._connections = []
        self._opening = False
        self._changed = asyncio.Event()

    async def aclose(self) -> None:
        """Close every socket and wait for the reader tasks: nothing of the session outlives this call."""
        self.closed = True
        if self._loop is not asyncio.get_running_loop():
            return
        connections, self._connections = self._connections, []
        await asyncio.gather(*(c.aclose() for c in connections), *self._closers, return_exceptions=True)
        self._notify()


def _observe(observer: Callable[[dict[str, Any]], None], payload: dict[str, Any]) -> None:
    """Observers see traffic; they must not break a turn, so their errors are logged and dropped."""
    try:
        observer(payload)
    except Exception:
        log.exception("ws_transport: observer %r failed", observer)


def credentials_of(headers: Headers) -> Credentials:
    """What decides who a socket speaks for: a turn rides only a socket upgraded with the same."""
    return tuple(sorted((k.lower(), v) for k, v in headers if k.lower() in CREDENTIAL_HEADERS))


def websocket_url(url: httpx2.URL) -> str:
    return str(url.copy_with(scheme={"http": "ws", "https": "wss"}.get(url.scheme, url.scheme)))
