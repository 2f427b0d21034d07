"""What a session may do, as data: reconnect policy, limits, and the counters it keeps."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._sdk import is_recoverable_close

FALLBACK_STATUSES = frozenset({404, 405, 426})
"""Upgrade answers that mean "no WebSocket here": the session switches to HTTP for good."""


@dataclass(frozen=True)
class ReconnectPolicy:
    """When and how fast to reconnect; the same close codes the `openai` SDK treats as recoverable.

    A turn is resent (in full) at most once; `max_attempts` bounds the connection attempts made
    for it. When they are spent the session falls back to HTTP rather than failing the caller.
    """

    max_attempts: int = 4
    initial_delay_s: float = 0.05
    max_delay_s: float = 2.0
    jitter: float = 0.25

    def recoverable(self, close_code: int) -> bool:
        return is_recoverable_close(close_code)

    def delay(self, attempt: int, rand: float | None = None) -> float:
        """Seconds to wait before connection attempt `attempt` (0 = first, no wait); `rand` in [0, 1)
        picks the jitter (a random one when None), so the same inputs give the same delay."""
        if attempt <= 0:
            return 0.0
        base = min(self.max_delay_s, self.initial_delay_s * 2 ** (attempt - 1))
        return base * (1 - self.jitter * (random.random() if rand is None else rand))


@dataclass(frozen=True)
class SessionOptions:
    """Options for one wrapped client; every field has a default that suits the OpenAI API and the shim."""

    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    websocket_url: str | None = None
    """Override the `ws(s)://.../responses` URL derived from the HTTP request."""
    failover_base_urls: tuple[str, ...] = ()
    """Other replicas, as base URLs like the client's (`http://host:8787/v1`). When a socket cannot
    be opened where the session dials now, the next attempt dials the next URL (round robin) and
    stays there. With replicas sharing a Redis store, stored conversations continue on any of them.
    Turns sent over HTTP (the fallback) go to the same replica, and a refused connection moves them
    on to the next; other HTTP requests still go to the client's own base URL."""
    lanes: bool = True
    """Multiplex concurrent turns on one socket with `stream_id` lanes; False: one turn per socket."""
    max_in_flight: int = 16
    """Turns in flight per socket (the shim runs 16 at once and allows 32 lanes)."""
    max_connections: int = 4
    """Sockets per session, opened only when every open one is full."""
    max_connection_age_s: float = 55 * 60
    """Open a fresh socket before the server's 60-minute connection limit."""
    max_chains: int = 64
    """Conversations remembered for automatic chaining (least recently used dropped first)."""
    open_timeout_s: float = 10.0
    failed_error_grace_s: float = 0.5
    """After `response.failed`, how long to wait for the `error` event that carries its status."""
    connect_options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for `websockets.asyncio.client.connect`."""
    on_request: Callable[[dict[str, Any]], None] | None = None
    """Observer: a copy of each `response.create` payload as it goes on the wire (after chaining)."""
    on_event: Callable[[dict[str, Any]], None] | None = None
    """Observer: each server event of a turn, before the caller sees it. Observer errors are logged."""
    clock: Callable[[], float] = time.monotonic
    """Seconds from any fixed point; what `max_connection_age_s` is measured with (tests pass their own)."""
    chat_completions: bool = True
    """Send `chat.completions.create` calls over the session too (translated to `response.create`);
    False leaves them on HTTP."""
    direct: bool = True
    """Let a non-streaming `responses.create` skip the SDK's HTTP pipeline once the client's upgrade
    headers are known (see `direct.py`); False sends every turn through it, so httpx event hooks and
    HTTP instrumentation see every turn."""


@dataclass
class SessionStats:
    """Counters a user can read at any time; `bytes_http_equivalent` is what plain HTTP would have sent.

    `bytes_http_equivalent` for a chained turn is computed incrementally (the chain's known history
    size plus this turn's frame) rather than by serializing the history, so it is exact to within
    a few bytes of field framing per turn.
    """

    turns: int = 0
    """`responses.create` calls, however they travelled (a resend or an SDK retry is not a new turn)."""
    turns_chained: int = 0
    """Turns sent with a `previous_response_id`: chained by the transport, or by the caller itself."""
    resends: int = 0
    """Turns sent again in full after a lost chain or a lost socket."""
    bytes_sent: int = 0
    """Request bytes on the wire: frames on the socket plus bodies of turns sent over HTTP."""
    bytes_http_equivalent: int = 0
    """What the same turns would have sent over plain HTTP (the whole history each time)."""
    reconnects: int = 0
    """Sockets opened after every earlier one had closed or retired."""
    fallbacks: int = 0
    """Turns sent over HTTP: the upgrade was refused, the budget spent, or the frame over the server's limit."""
    chat_turns: int = 0
    """`chat.completions.create` calls sent over the session (also counted in `turns`)."""
    chat_fallbacks: dict[str, int] = field(default_factory=dict)
    """Chat calls left on HTTP, by reason (`"n > 1"`, `"logit_bias"`, ...): they could not be translated faithfully."""

    @property
    def bytes_saved(self) -> int:
        return self.bytes_http_equivalent - self.bytes_sent
