"""uvicorn's HTTP/1.1 protocols (h11, and httptools when installed), with the deadlines they lack.

uvicorn times out only an idle kept-alive connection: a client that sends part of a request head,
or announces a body and sends part of it, or stops reading a streamed response, holds its socket
(and, for a stream, its backend request and tenant slot) for as long as it likes. The subclasses
here add three timers and a connection count, nothing per event:

- head: a request head must be complete within `http_header_timeout_s` of the connection opening
  or of the previous response ending; else 408 `request_timeout` and the connection is closed (closed
  without a 408 when not one byte of a head came: a pooled client's next request could cross it);
- body: an announced body must arrive whole within `http_body_timeout_s` of its head (a deadline, not
  an idle timer: a body trickled a byte at a time must not hold the socket), else 408 (the app
  sees the client gone, so the request is dropped) and the connection is closed;
- send: a response of which nothing can be written for `send_timeout_s` (the client does not read,
  its socket buffers are full; a slow reader that drains some keeps going) ends with the connection aborted: a streaming response is cancelled
  like one whose client went away, which frees its backend request and slot;
- at most `max_http_connections` open HTTP connections per process. A connection beyond it first
  closes the oldest one that is idle (no request head received yet, or kept alive after its
  response), so sockets that send nothing (no key is needed to open one) cannot hold the cap; only
  when every connection has a request under way does the newcomer get 503 `server_overloaded` with
  `Retry-After`, and even then its `/healthz` and `/readyz` are answered (a liveness probe must not
  fail because the server is busy). WebSocket connections are counted by the app's own cap
  (`max_connections`) once upgraded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from . import metrics
from .errors import APIError
from .http import error_response

log = logging.getLogger("responses_ws.http")

if sys.platform == "linux":
    import fcntl
    import termios

    _SIOCOUTQ: int | None = termios.TIOCOUTQ
else:
    _SIOCOUTQ = None


@dataclass
class HttpLimits:
    """The HTTP deadlines and cap of one server process, and its count of open HTTP connections."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    send_timeout_s: float = 30.0
    max_connections: int = 1024
    open_connections: int = 0
    idle: dict[Any, None] = field(default_factory=dict)
    """The open connections with no request under way, oldest idle first (a dict keeps insertion order)."""


def raw_error(error: APIError) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection, written to the socket as it is."""
    body = orjson.dumps({"error": error.body()})
    reason = HTTPStatus(error.status).phrase.encode()
    head = [
        b"HTTP/1.1 %d %s" % (error.status, reason),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _timeout_error(part: str, seconds: float) -> APIError:
    return APIError(408, "request_timeout", f"The request {part} did not arrive within {seconds:g} s.")


class DeadlineMixin:
    """The timers and the count, over either uvicorn HTTP protocol (which supplies the attributes used)."""

    config: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any
    app: Any

    _limits: HttpLimits
    _timer: asyncio.TimerHandle | None = None
    _timer_kind = ""
    _timed_cycle: Any = None
    _send_timer: asyncio.TimerHandle | None = None
    _unsent = 0
    _counted = False
    _heard = False
    """Bytes arrived since the timer was armed: a head deadline passing without any is a silent close."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._limits = self.config.http_limits
        limits = self._limits
        limits.open_connections += 1
        self._counted = True
        if limits.open_connections > limits.max_connections:
            oldest = next(iter(limits.idle), None)
            if oldest is not None:
                del limits.idle[oldest]
                metrics.CLOSED_CONNECTIONS.labels("http", "idle_evicted").inc()
                oldest.transport.close()  # nothing under way on it; its count goes when it is lost
            else:
                self.app = _overloaded(limits.max_connections, self.app)  # this connection's requests only
        limits.idle[self] = None
        self._arm("head", limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        self._heard = True
        super().data_received(data)  # type: ignore[misc]
        self._follow_cycle()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self.cycle is self._timed_cycle or self.cycle is None:
            self._limits.idle[self] = None
            self._arm("head", self._limits.header_timeout_s)
        self._follow_cycle()

    def handle_websocket_upgrade(self, *args: Any) -> None:
        """From here the WebSocket protocol owns the socket (and the app's `max_connections` counts it)."""
        self._stop_timers()
        super().handle_websocket_upgrade(*args)  # type: ignore[misc]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._send_timer is None:
            self._watch_sending()

    def _watch_sending(self) -> None:
        self._unsent = unsent_bytes(self.transport)
        self._send_timer = self.loop.call_later(self._limits.send_timeout_s, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _follow_cycle(self) -> None:
        """A new request's head arrived: its body (if still to come) gets the body deadline; a body
        complete ends it. Attribute checks only, on every read."""
        cycle = self.cycle
        if cycle is None:
            return
        if cycle is not self._timed_cycle:
            self._timed_cycle = cycle
            self._limits.idle.pop(self, None)
            if cycle.more_body and not cycle.response_complete:
                self._arm("body", self._limits.body_timeout_s)
            else:
                self._cancel()
        elif self._timer_kind == "body" and not cycle.more_body:
            self._cancel()

    def _arm(self, kind: str, seconds: float) -> None:
        self._cancel()
        self._heard = False
        self._timer_kind = kind
        self._timer = self.loop.call_later(seconds, self._expired)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_kind = ""

    def _stop_timers(self) -> None:
        self._cancel()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        if self._counted:
            self._counted = False
            self._limits.open_connections -= 1
            self._limits.idle.pop(self, None)

    def _expired(self) -> None:
        """The head or body deadline passed: 408 where no response has started, then close."""
        kind = self._timer_kind
        self._timer = None
        self._timer_kind = ""
        if self.transport.is_closing():
            return
        seconds = self._limits.header_timeout_s if kind == "head" else self._limits.body_timeout_s
        cycle = self.cycle if kind == "body" else None
        if cycle is not None:  # the app waits for the rest of the body: to it, the client went away
            cycle.disconnected = True
            cycle.message_event.set()
        if kind == "head" and not self._heard:
            pass  # nothing of a request came: a 408 could be read as the answer to a request sent meanwhile
        elif cycle is None or not cycle.response_started:
            self.transport.write(raw_error(_timeout_error(kind, seconds)))
            metrics.ERRORS.labels("request_timeout").inc()
        metrics.CLOSED_CONNECTIONS.labels("http", f"{kind}_timeout").inc()
        log.debug("HTTP request %s from %s not complete after %g s; closing", kind, _peer(self.transport), seconds)
        self.transport.close()

    def _not_reading(self) -> None:
        """Writing has been paused for `send_timeout_s`. A client that read some of it since (a slow link,
        a large body written at once) gets another period; one that read nothing does not read: abort the
        socket (a graceful close would wait for the buffer to drain), which cancels the response as for a
        client gone."""
        self._send_timer = None
        if self.transport.is_closing():
            return
        if unsent_bytes(self.transport) < self._unsent:
            self._watch_sending()
            return
        log.warning(
            "HTTP client %s not reading for %.0f s; closing", _peer(self.transport), self._limits.send_timeout_s
        )
        metrics.CLOSED_CONNECTIONS.labels("http", "slow_reader").inc()
        self.transport.abort()


def unsent_bytes(transport: asyncio.Transport) -> int:
    """Bytes written but not yet taken by the client: the transport's buffer, plus the kernel's send queue
    where it can be read (Linux `SIOCOUTQ`), which holds hundreds of KiB and frees space in large steps."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if _SIOCOUTQ is not None and sock is not None:
        with contextlib.suppress(OSError, ValueError):
            size += int.from_bytes(fcntl.ioctl(sock.fileno(), _SIOCOUTQ, bytes(4)), sys.byteorder, signed=True)
    return size


def _peer(transport: asyncio.Transport) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "-"


PROBE_PATHS = frozenset({"/healthz", "/readyz"})


def _overloaded(limit: int, app: Any) -> Any:
    """The app for a connection beyond the cap: each of its requests gets 503 and the connection closes,
    except the probes, which `app` answers."""
    refusal = _refusal(limit)

    async def overloaded(scope: Any, receive: Any, send: Any) -> None:
        await (app if scope.get("path") in PROBE_PATHS else refusal)(scope, receive, send)

    return overloaded


def _refusal(limit: int) -> Any:
    response = error_response(
        APIError(
            503,
            "server_overloaded",
            f"The server holds its maximum of {limit} HTTP connections; retry shortly.",
            type="server_error",
            retry_after_s=1.0,
        )
    )
    response.headers["connection"] = "close"
    return response


class ShimH11Protocol(DeadlineMixin, H11Protocol):  # type: ignore[misc]
    """uvicorn's h11 protocol with the deadlines and the cap."""


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # the `speed` extra is not installed
    HTTP_PROTOCOL: type[asyncio.Protocol] = ShimH11Protocol
else:

    class ShimHttpToolsProtocol(DeadlineMixin, HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's httptools protocol with the deadlines and the cap."""

    HTTP_PROTOCOL = ShimHttpToolsProtocol
"""httptools' protocol when it is installed (as uvicorn's `auto` picks), else h11's; both with the deadlines."""
