"""One persistent WebSocket session: the asyncio layer that carries out the policy's decisions.

A `Session` hands each turn to a `Connection` (a socket and its lanes, see `connection.py`) and
moves its frames; every decision (which socket, when to open or retire one, how long to back
off, whether to resend in full or fall back to HTTP) comes from the sans-I/O machines in
`policy.py`, driven here by what the sockets do. Everything runs on one event loop: the caller's
for the async client, a private one for the sync client (see `portal.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any, NoReturn

import httpx2
import orjson
from websockets.asyncio.client import ClientConnection

from .chaining import ChainBook
from .chat_completions import ChatBook
from .connection import Connection, Lane
from .dialing import FallBack, dial
from .errors import ConnectionLost, SessionClosed, TurnRejected, UseHTTP, error_code
from .headers import Credentials, Headers, credentials_of, upgrade_headers, websocket_url
from .options import SessionOptions, SessionStats
from .policy import (
    DRAIN_CODES,
    FrameLimit,
    Open,
    Pool,
    Replicas,
    SessionState,
    Socket,
    TurnAttempts,
    Verdict,
    Wait,
)
from .turn import TurnRequest

log = logging.getLogger("ws_transport")

COMPLETED = frozenset({"response.completed", "response.incomplete"})
FAILED = "response.failed"
TERMINAL = COMPLETED | {FAILED}


class Session:
    """A persistent session shared by every `responses.create` of one client.

    `events(turn)` sends one turn and yields its server events. Chains, stats and tickets may be
    touched from any thread; sockets only from the session's event loop.
    """

    def __init__(self, options: SessionOptions | None = None) -> None:
        self.options = options or SessionOptions()
        self.stats = SessionStats()
        self.chains = ChainBook(self.options.max_chains)
        self.chat_book = ChatBook(self.options.max_chains)
        self.tickets: dict[str, TurnRequest] = {}
        self.url: str | None = None
        """The `/responses` WebSocket URL of the client's base URL: which requests ride the session."""
        failover = self.options.failover_base_urls
        self.replicas = Replicas(
            [websocket_url(httpx2.URL(base.rstrip("/") + "/responses")) for base in failover], bases=list(failover)
        )
        """Where sockets are opened: the session's own URL first (set by `bind`), then the failover replicas."""
        self.user_agent: str | None = None
        self.state = SessionState.WEBSOCKET
        self.frame_limit = FrameLimit()
        """The smallest frame the server refused with 1009: frames this large go over HTTP untried."""
        self.pool = self._new_pool()
        self._connections: dict[Socket, Connection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._waiting = 0
        self._closers: set[asyncio.Task[None]] = set()

    @property
    def http_only(self) -> bool:
        """Whether every turn goes over HTTP (the session fell back for good)."""
        return self.state is SessionState.HTTP_ONLY

    @property
    def connections(self) -> list[Connection]:
        """The open sockets, oldest first."""
        return [self._connections[s] for s in self.pool.sockets if s in self._connections]

    def bind(self, request: httpx2.Request, endpoint: httpx2.URL | None = None) -> Headers | None:
        """The upgrade headers (credentials included) for this request's turn; the first request sets the URL.

        `endpoint` is the `/responses` URL when the request went elsewhere (a chat call). Returns
        None for a request to another URL than the session's: that one goes over HTTP.
        """
        url = self.options.websocket_url or websocket_url(endpoint or request.url)
        if self.url is None:
            self.url = url
            self.replicas.set_primary(url)
        elif url != self.url:
            return None
        self.user_agent = request.headers.get("user-agent")
        return upgrade_headers(request)

    async def events(
        self, turn: TurnRequest, *, read_timeout: float | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Send `turn` and yield its events up to the terminal one (a stream; see `outcome` for a call that
        keeps only that). State is settled before the terminal event is handed on (a consumer may stop there).

        A lost chain or socket before the first event resends the turn in full once. Raises `TurnRejected`
        for an error before the response started, `ConnectionLost` when the socket dies after it started,
        `UseHTTP` when this turn or the session goes to HTTP.
        """
        self._check_loop()
        attempts = TurnAttempts(self.options.reconnect, self.frame_limit)
        observed = self.options.on_event is not None
        while True:
            conn, lane = await self._acquire(turn)
            try:
                await self._send(conn, lane, turn, attempts)
                event = await self._next_event(conn, lane, read_timeout)
                if event.get("type") == "error":
                    self._after_error(conn, turn, event, attempts)
                else:
                    attempts.delivering()
                    turn.ready = _ready(conn.lanes[lane], attempts)
                    while True:
                        kind = self._settle(conn, turn, event, attempts)
                        yield event
                        if attempts.done:
                            return
                        if kind == FAILED:
                            trailing = await self._trailing_error(conn, lane)
                            attempts.finished()
                            if trailing is not None:
                                yield trailing
                            return
                        queued = None if observed else conn.queued(lane)
                        event = await self._next_event(conn, lane, read_timeout) if queued is None else queued
            except ConnectionLost as lost:
                self._after_close(lost, turn, attempts)
            finally:
                self._release(conn, lane, clean=attempts.clean)
            self.stats.resends += 1

    async def outcome(self, turn: TurnRequest, *, read_timeout: float | None = None) -> list[dict[str, Any]]:
        """A non-streaming turn's outcome (its terminal event, and the `error` that may follow it), sent as by
        `events`, but a lost chain or socket is hidden (resent in full once) at any time: nothing was handed on.
        Other events are dropped unread unless `on_event` is set. One coroutine, not a generator per turn."""
        self._check_loop()
        attempts = TurnAttempts(self.options.reconnect, self.frame_limit)
        terminal_only = self.options.on_event is None
        while True:
            conn, lane = await self._acquire(turn, terminal_only=terminal_only)
            try:
                await self._send(conn, lane, turn, attempts)
                event = await self._next_event(conn, lane, read_timeout)
                if event.get("type") == "error":
                    self._after_error(conn, turn, event, attempts)
                else:
                    return await self._kept(conn, lane, turn, event, read_timeout, attempts)
            except ConnectionLost as lost:
                self._after_close(lost, turn, attempts)
            finally:
                self._release(conn, lane, clean=attempts.clean)
            self.stats.resends += 1

    async def _kept(
        self,
        conn: Connection,
        lane: str | None,
        turn: TurnRequest,
        event: dict[str, Any],
        timeout: float | None,
        attempts: TurnAttempts,
    ) -> list[dict[str, Any]]:
        """The events from `event` on read to the end, and what of them `outcome` keeps."""
        kept = []
        while True:
            kind = self._settle(conn, turn, event, attempts)
            if kind in TERMINAL or kind == "error":
                kept.append(event)
            if attempts.done:
                return kept
            if kind == FAILED:
                trailing = await self._trailing_error(conn, lane)
                attempts.finished()
                return kept if trailing is None else [*kept, trailing]
            event = await self._next_event(conn, lane, timeout)

    def _settle(self, conn: Connection, turn: TurnRequest, event: dict[str, Any], attempts: TurnAttempts) -> Any:
        """What an event of the turn settles before it is handed on (the chain it records or loses); its type."""
        kind = event.get("type")
        if kind in COMPLETED:
            self._record(turn, event, conn.generation)
        elif kind == FAILED:
            self.chains.forget(turn.chain)
        if kind in COMPLETED or kind == "error":
            attempts.finished()
        return kind

    async def _next_event(self, conn: Connection, lane: str | None, timeout: float | None) -> dict[str, Any]:
        event = await conn.next_event(lane, timeout)
        if self.options.on_event is not None:
            _observe(self.options.on_event, event)
        return event

    def _after_close(self, lost: ConnectionLost, turn: TurnRequest, attempts: TurnAttempts) -> None:
        """Return to resend the turn in full; raise what the caller or the HTTP fallback must see."""
        verdict = attempts.closed(lost.code)
        if verdict is Verdict.FALL_BACK:
            if self.frame_limit.refusals == 1:
                log.warning(
                    "ws_transport: a %d-byte request exceeded the server's frame limit; such go over HTTP",
                    attempts.nbytes,
                )
            raise UseHTTP("frame too large") from lost
        if verdict is Verdict.REJECT:
            raise lost
        self.chains.forget(turn.chain)
        log.debug("ws_transport: %s; resending the turn in full", lost)

    def _after_error(self, conn: Connection, turn: TurnRequest, event: dict[str, Any], attempts: TurnAttempts) -> None:
        """Return to resend the turn in full (a lost chain, a closing socket); else raise `TurnRejected`."""
        code = error_code(event)
        if attempts.error(code) is Verdict.REJECT:
            raise TurnRejected(event)
        if code in DRAIN_CODES:
            self.pool.drain(conn.record)
        self.chains.forget(turn.chain)
        log.debug("ws_transport: %s; resending the turn in full", code)

    async def _trailing_error(self, conn: Connection, lane: str | None) -> dict[str, Any] | None:
        """The `error` event that may follow `response.failed`: it carries the status HTTP would return."""
        try:
            event = await self._next_event(conn, lane, self.options.failed_error_grace_s)
        except (TimeoutError, ConnectionLost):
            return None
        return event if event.get("type") == "error" else None

    async def _send(self, conn: Connection, lane: str | None, turn: TurnRequest, attempts: TurnAttempts) -> None:
        """Send the turn's frame, chained when it can be. A frame the server would refuse (1009) goes over HTTP."""
        chained = attempts.begin(can_chain=turn.can_chain(conn.generation))
        frame, http_equivalent = turn.frame(lane, chained=chained)
        if not attempts.fits(len(frame)):
            log.debug("ws_transport: %d-byte frame over the server's limit; sending it over HTTP", len(frame))
            raise UseHTTP("frame too large")
        if self.options.on_request is not None:
            _observe(self.options.on_request, orjson.loads(frame))
        await conn.send(frame)
        turn.on_socket = True
        attempts.sent(len(frame))
        stats = self.stats
        stats.bytes_sent += len(frame)
        if not turn.counted:
            turn.counted = True
            stats.turns += 1
            stats.turns_chained += chained or turn.fields.get("previous_response_id") is not None
            stats.bytes_http_equivalent += http_equivalent
        if log.isEnabledFor(logging.DEBUG):
            new, size = len(turn.plan.new_items if chained else turn.plan.items), len(frame)
            text = "sent turn on socket #%d lane %s: chained=%s new_items=%d frame=%dB http_equivalent=%dB"
            log.debug("ws_transport: " + text, conn.generation, lane, chained, new, size, http_equivalent)

    def adopt(self, turn: TurnRequest, response: Any) -> None:
        """The turn's complete `Response`, as its caller got it, lends its output objects to the chain the turn
        recorded: the caller's next history holds those very objects, which then match by identity. An output
        that is not a list (a server out of spec) is left alone: the chain keeps the recorded JSON."""
        output = response.output
        if turn.recorded is not None and type(output) is list:
            self.chains.adopt_output(turn.recorded, output)

    def _record(self, turn: TurnRequest, event: dict[str, Any], generation: int) -> None:
        response = event.get("response") or {}
        response_id = response.get("id")
        if isinstance(response_id, str):
            output = response.get("output") or []
            nbytes = turn.record_nbytes(output)
            turn.recorded = self.chains.record(turn.plan, response_id, output, nbytes, generation, turn.fields)

    async def _acquire(self, turn: TurnRequest, *, terminal_only: bool = False) -> tuple[Connection, str | None]:
        """A lane on the socket the pool picks for this turn, opening one when the pool says so."""
        chain, headers = turn.chain, turn.headers
        known = turn.credentials
        credentials = known[1] if known is not None and known[0] is headers else credentials_of(headers)
        while True:
            if self.state is SessionState.CLOSED:
                raise SessionClosed("the ws_transport session is closed")
            if self.state is SessionState.HTTP_ONLY:
                raise UseHTTP("the session fell back to HTTP")
            decision = self.pool.acquire(credentials, None if chain is None else chain.generation)
            self._close_retired()
            if isinstance(decision, Wait):
                self._waiting += 1
                try:
                    await self._changed.wait()
                finally:
                    self._waiting -= 1
                continue
            if isinstance(decision, Open):
                conn = await self._open(headers, credentials, replacing=decision.replacing)
            else:
                conn = self._connections[decision.socket]
            return conn, conn.open_lane(terminal_only=terminal_only)

    async def _open(self, headers: Headers, credentials: Credentials, *, replacing: bool) -> Connection:
        try:
            socket = await self._dial(headers)
        except BaseException:
            self.pool.open_failed()
            self._notify()
            raise
        record = self.pool.opened(credentials)
        if replacing:
            self.stats.reconnects += 1
        log.debug("ws_transport: opened socket #%d to %s", record.generation, self.replicas.current)
        conn = self._connections[record] = Connection(socket, record, lanes=self.options.lanes)
        conn.start(self)
        self._notify()
        return conn

    def _release(self, conn: Connection, lane: str | None, *, clean: bool) -> None:
        """Free the lane; a turn abandoned mid-response retires its socket (see `Pool.release`)."""
        conn.close_lane(lane)
        self.pool.release(conn.record, clean=clean)
        self._close_retired()
        self._notify()

    def socket_closed(self, conn: Connection) -> None:
        """From the connection's reader: its socket is gone."""
        self.pool.lost(conn.record)
        if self._connections.get(conn.record) is conn:
            del self._connections[conn.record]
        self._notify()

    def stray_event(self, conn: Connection, event: dict[str, Any]) -> None:
        """From the connection's reader: an event for no waiting lane (a turn given up, or the server closing)."""
        if error_code(event) in DRAIN_CODES:
            self.pool.drain(conn.record)
            self._close_retired()
        log.debug("ws_transport: dropped %s event for no waiting lane (%s)", event.get("type"), event.get("stream_id"))

    def _close_retired(self) -> None:
        for record in self.pool.closable():
            conn = self._connections.pop(record, None)
            if conn is not None:
                task = asyncio.create_task(conn.aclose())
                self._closers.add(task)
                task.add_done_callback(self._closers.discard)

    def _notify(self) -> None:
        """Wake the turns waiting for a socket (a fresh event for the next waits; none made when none waits)."""
        if self._waiting:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _dial(self, headers: Headers) -> ClientConnection:
        """A socket (see `dialing.dial`); a refusal (404/405/426) or a spent budget means HTTP from now on."""
        assert self.url is not None
        try:
            return await dial(self.options, self.replicas, headers, self.user_agent)
        except FallBack as exc:
            self._fall_back(exc.reason)

    def _fall_back(self, reason: str) -> NoReturn:
        if self.state is SessionState.WEBSOCKET:
            self.state = SessionState.HTTP_ONLY
            log.warning("ws_transport: %s; this session continues over HTTP", reason)
        raise UseHTTP(reason)

    def _new_pool(self) -> Pool:
        options = self.options
        return Pool(
            max_connections=options.max_connections,
            max_in_flight=options.max_in_flight,
            lanes=options.lanes,
            max_age_s=options.max_connection_age_s,
            clock=options.clock,
        )

    def _check_loop(self) -> None:
        """Sockets belong to one event loop; a client reused on a new loop starts with fresh ones."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._connections:
            log.debug("ws_transport: the event loop changed; leaving %d socket(s) behind", len(self._connections))
        self._loop = loop
        self.pool.clear()
        self._connections = {}
        self._changed = asyncio.Event()

    async def aclose(self) -> None:
        """Close every socket and wait for the reader tasks: nothing of the session outlives this call."""
        self.state = SessionState.CLOSED
        if self._loop is not asyncio.get_running_loop():
            return
        connections, self._connections = list(self._connections.values()), {}
        self.pool.clear()
        await asyncio.gather(*(c.aclose() for c in connections), *self._closers, return_exceptions=True)
        self._notify()


def _observe(observer: Callable[[dict[str, Any]], None], payload: dict[str, Any]) -> None:
    """Observers see traffic; they must not break a turn, so their errors are logged and dropped."""
    try:
        observer(payload)
    except Exception:
        log.exception("ws_transport: observer %r failed", observer)


def _ready(inbox: Lane, attempts: TurnAttempts) -> Callable[[], bool]:
    """Whether a stream's next step returns at once: its next event is in its lane, or it has ended."""
    return lambda: attempts.done or bool(inbox.events)
