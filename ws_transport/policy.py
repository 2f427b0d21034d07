"""The session's decisions, with no sockets, no event loop and no clock of its own (sans-I/O).

Three small machines, each driven by what happened and answering with what to do; the asyncio
layer (`session.py`) feeds them and carries out their answers, and the tests drive them directly:

- `Pool`: the socket table. Which socket a turn rides (one upgraded with its credentials; the
  one holding its chain first), when to open another, when a socket retires (age limit, a
  server that is closing, a turn abandoned mid-response) and when a retired one may be closed.
- `Dialer`: one round of connection attempts. The wait before each (bounded exponential
  backoff) and what a failed upgrade means: try again, fall back to HTTP for good (404, 405,
  426 or a spent budget), or answer the caller with the refusal (401, 403, ...).
- `TurnAttempts`: one turn through its sends. Chained or in full, resent in full at most once
  after a lost chain or a lost socket, over HTTP when the frame is over the server's size limit.

Time comes from the `clock` a `Pool` is given (`time.monotonic` unless a test passes its own).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .headers import Credentials
from .options import FALLBACK_STATUSES, ReconnectPolicy

Clock = Callable[[], float]

MESSAGE_TOO_BIG = 1009
RESEND_CODES = frozenset({"previous_response_not_found", "websocket_connection_limit_reached", "server_shutting_down"})
"""Error codes after which the turn is resent once with its full input (nothing is lost)."""
DRAIN_CODES = frozenset({"websocket_connection_limit_reached", "server_shutting_down"})
"""Error codes of a server that is closing the socket: it takes no new turns, the resend goes on another."""


class SessionState(enum.Enum):
    """Where a session is in its life: one state, not a flag per condition."""

    WEBSOCKET = "websocket"
    """Turns ride the session's sockets."""
    HTTP_ONLY = "http_only"
    """The upgrade was refused (404/405/426) or the reconnect budget spent: every turn goes over HTTP."""
    CLOSED = "closed"
    """Closed with its client: no turn is sent."""


class SocketState(enum.Enum):
    """Where a socket is in its life; only an OPEN one takes new turns."""

    OPEN = "open"
    DRAINING = "draining"
    """Finishes the turns it has, takes no new ones, and is closed when the last one ends."""
    CLOSED = "closed"


@dataclass(eq=False)
class Socket:
    """The core's record of one socket: whom it speaks for, when it opened, how many turns ride it."""

    generation: int
    credentials: Credentials
    opened_at: float
    capacity: int
    in_flight: int = 0
    state: SocketState = SocketState.OPEN

    @property
    def usable(self) -> bool:
        return self.state is SocketState.OPEN

    @property
    def free(self) -> int:
        return self.capacity - self.in_flight


@dataclass(frozen=True)
class Take:
    """Ride `socket` (one lane of it is now counted as in flight)."""

    socket: Socket


@dataclass(frozen=True)
class Open:
    """Open a new socket, then report `opened` or `open_failed`. `replacing`: every earlier one is gone."""

    replacing: bool


@dataclass(frozen=True)
class Wait:
    """Nothing free now: wait until a turn ends, a socket closes or an opening finishes, then ask again."""


class Pool:
    """The sockets of a session and the rules for using them; the I/O layer opens and closes them.

    After each call, `closable()` hands over the sockets that have retired and have no turn left:
    the I/O layer closes them (closing is this mode's only way to stop a turn on the server).
    """

    def __init__(
        self,
        *,
        max_connections: int = 4,
        max_in_flight: int = 16,
        lanes: bool = True,
        max_age_s: float = 55 * 60,
        clock: Clock,
    ) -> None:
        self.max_connections = max_connections
        self.capacity = max_in_flight if lanes else 1
        self.max_age_s = max_age_s
        self.clock = clock
        self.sockets: list[Socket] = []
        self.generation = 0
        self.opening = False
        self._closable: list[Socket] = []

    @property
    def live(self) -> int:
        return sum(s.usable for s in self.sockets)

    def acquire(self, credentials: Credentials, chain_generation: int | None = None) -> Take | Open | Wait:
        """Where a turn goes: a socket with room (its chain's first), else a new one, else wait."""
        self._retire_aged()
        socket = self._pick(credentials, chain_generation)
        if socket is not None:
            socket.in_flight += 1
            return Take(socket)
        if self.live >= self.max_connections:
            self._retire_idle(credentials)
        if self.opening or self.live >= self.max_connections:
            return Wait()
        self.opening = True
        return Open(replacing=self.live == 0 and self.generation > 0)

    def opened(self, credentials: Credentials) -> Socket:
        """The socket an `Open` asked for is up; the turn that opened it rides it."""
        self.opening = False
        self.generation += 1
        socket = Socket(self.generation, credentials, self.clock(), self.capacity, in_flight=1)
        self.sockets.append(socket)
        return socket

    def open_failed(self) -> None:
        self.opening = False

    def release(self, socket: Socket, *, clean: bool) -> None:
        """A turn left `socket`. Not `clean` (abandoned mid-response): the socket retires, since
        the server stops a turn only when its socket closes, and without lanes its late events
        would reach the next turn."""
        socket.in_flight = max(0, socket.in_flight - 1)
        if not clean:
            self.drain(socket)
        self._collect(socket)

    def drain(self, socket: Socket) -> None:
        """Take no new turns on `socket` (the server is closing it, or it is past its age)."""
        if socket.state is SocketState.OPEN:
            socket.state = SocketState.DRAINING
        self._collect(socket)

    def lost(self, socket: Socket) -> None:
        """The socket closed (either side): it leaves the table."""
        socket.state = SocketState.CLOSED
        if socket in self.sockets:
            self.sockets.remove(socket)

    def closable(self) -> list[Socket]:
        """Retired sockets with no turn left, for the I/O layer to close; each is handed over once."""
        out, self._closable = self._closable, []
        return out

    def clear(self) -> list[Socket]:
        """Forget every socket (the session closes, or moved to another event loop); returns them."""
        sockets, self.sockets = self.sockets, []
        self.opening = False
        return sockets

    def _pick(self, credentials: Credentials, chain_generation: int | None) -> Socket | None:
        for socket in self.sockets:  # the chain's own socket, looked for first without building the list below
            if socket.generation == chain_generation:
                if socket.usable and socket.free > 0 and socket.credentials == credentials:
                    return socket
                break
        ready = [s for s in self.sockets if s.usable and s.free > 0 and s.credentials == credentials]
        if not ready:
            return None
        for socket in ready:
            if socket.generation == chain_generation:
                return socket
        return max(ready, key=lambda s: s.free)

    def _retire_aged(self) -> None:
        """Sockets past the age limit retire (before the server's own 60-minute limit closes them)."""
        now = self.clock()
        for socket in self.sockets:  # every turn asks: one pass without a copy while none is past it
            if now - socket.opened_at > self.max_age_s:
                break
        else:
            return
        for socket in list(self.sockets):
            if socket.usable and now - socket.opened_at > self.max_age_s:
                self.drain(socket)

    def _retire_idle(self, credentials: Credentials) -> None:
        """Make room for a socket with other credentials: idle sockets with different ones retire."""
        for socket in list(self.sockets):
            if socket.usable and not socket.in_flight and socket.credentials != credentials:
                self.drain(socket)

    def _collect(self, socket: Socket) -> None:
        if socket.state is SocketState.DRAINING and not socket.in_flight and socket in self.sockets:
            self.sockets.remove(socket)
            self._closable.append(socket)


class Verdict(enum.Enum):
    """What to do after a failed attempt (to connect, or to run a turn)."""

    RETRY = "retry"
    """Connect again after the dialer's next delay; for a turn: resend it in full."""
    FALL_BACK = "fall_back"
    """Send over HTTP: this turn (frame too large) or, from the dialer, every turn from now on."""
    REJECT = "reject"
    """Hand the failure to the caller as it is."""


def upgrade_verdict(status: int | None) -> Verdict:
    """A failed upgrade: `status` is the HTTP answer, None when there was none (refused, timed out)."""
    if status is None or status >= 500 or status in (408, 429):
        return Verdict.RETRY
    if status in FALLBACK_STATUSES:
        return Verdict.FALL_BACK
    return Verdict.REJECT


@dataclass
class Dialer:
    """One round of connection attempts under a `ReconnectPolicy`: call `next_delay()` before each
    attempt (None: the budget is spent), then `failed(status, error)` if it failed; after
    FALL_BACK, `reason` says why for the one warning the session logs."""

    policy: ReconnectPolicy
    random: Callable[[], float] = random.random
    attempts: int = 0
    reason: str = "no connection attempt is allowed (max_attempts=0)"

    def next_delay(self) -> float | None:
        if self.attempts >= self.policy.max_attempts:
            return None
        delay = self.policy.delay(self.attempts, self.random())
        self.attempts += 1
        return delay

    def failed(self, status: int | None, error: str) -> Verdict:
        """An attempt failed with HTTP `status` (None: no HTTP answer) and `error` as its message."""
        verdict = upgrade_verdict(status)
        self.reason = error
        if verdict is Verdict.RETRY and self.attempts >= self.policy.max_attempts:
            self.reason = f"could not open a WebSocket after {self.attempts} attempts ({error})"
            return Verdict.FALL_BACK
        return verdict


@dataclass
class Replicas:
    """Where sockets are opened: the session's own URL first, then the failover replicas, in turn.

    A failed connection attempt moves to the next URL (and back to the first after the last); a
    socket that opens stays on the URL that worked, so later sockets go there too.
    """

    urls: list[str] = field(default_factory=list)
    index: int = 0
    bases: list[str] = field(default_factory=list)
    """The failover replicas' HTTP base URLs (`http://host:8787/v1`), in the order of `urls[1:]`."""

    @property
    def current(self) -> str:
        return self.urls[self.index]

    def http_order(self, own: str, endpoint: str) -> list[str]:
        """Where a turn goes over HTTP, in order: the replica the sockets use now first, then the rest in turn.

        `own` is the request's own URL (the primary's); a failover replica gets `endpoint`
        (`/responses`, `/chat/completions`) after its base URL. Call `failed()` after each that
        could not be reached, so sockets and HTTP move on together.
        """
        targets = [own, *(base.rstrip("/") + endpoint for base in self.bases)]
        start = self.index if len(self.urls) == len(targets) else 0
        return targets[start:] + targets[:start]

    def set_primary(self, url: str) -> None:
        """The session's own URL (known from its first request), ahead of the failover ones."""
        self.urls.insert(0, url)

    def failed(self) -> None:
        self.index = (self.index + 1) % len(self.urls)


def should_resend(code: str | None, *, chained: bool) -> bool:
    """The resend-on-miss rule: a chain we chose was lost, or the socket retired; nothing else.

    A request rejected for itself (any other 400) is never resent, and neither is a
    `previous_response_id` the caller chose: resending it in full is impossible.
    """
    if code == "previous_response_not_found":
        return chained
    return code in RESEND_CODES


@dataclass
class FrameLimit:
    """The smallest frame the server refused with 1009: frames this large go over HTTP untried."""

    nbytes: int | None = None
    refusals: int = 0

    def allows(self, nbytes: int) -> bool:
        return self.nbytes is None or nbytes < self.nbytes

    def learn(self, nbytes: int) -> None:
        self.refusals += 1
        self.nbytes = nbytes if self.nbytes is None else min(self.nbytes, nbytes)


@dataclass
class TurnAttempts:
    """One turn through its sends: at most one resend in full, and only while it can be hidden.

    Drive it with `begin()` before each send, `sent(nbytes)` once the frame left, `delivering()`
    when events start reaching a consumer that keeps them (a stream), `finished()` at the terminal
    event, and `closed(code)` / `error(code)` when the attempt fails; the answers say what next.
    """

    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    frame_limit: FrameLimit = field(default_factory=FrameLimit)
    resent: bool = False
    is_sent: bool = False
    nbytes: int = 0
    delivered: bool = False
    """Events reached a consumer that keeps them: a restart can no longer be hidden."""
    done: bool = False
    chained: bool = False

    def begin(self, *, can_chain: bool) -> bool:
        """A new attempt; returns whether it goes chained (never after a resend: that one is in full)."""
        self.is_sent = self.delivered = self.done = False
        self.nbytes = 0
        self.chained = can_chain and not self.resent
        return self.chained

    def fits(self, nbytes: int) -> bool:
        """Whether a frame this large may go on the socket (else the turn goes over HTTP)."""
        return self.frame_limit.allows(nbytes)

    def sent(self, nbytes: int) -> None:
        self.is_sent = True
        self.nbytes = nbytes

    def delivering(self) -> None:
        self.delivered = True

    def finished(self) -> None:
        self.done = True

    @property
    def clean(self) -> bool:
        """The lane carries nothing more of this attempt: never sent, or answered to the end."""
        return self.done or not self.is_sent

    def closed(self, code: int) -> Verdict:
        """The socket closed before the terminal event. RETRY: resend in full on another socket;
        FALL_BACK: over HTTP (the frame was over the server's limit); REJECT: the caller sees it."""
        if code == MESSAGE_TOO_BIG and not self.delivered:
            self.frame_limit.learn(self.nbytes)
            return Verdict.FALL_BACK
        recoverable = not self.is_sent or self.reconnect.recoverable(code)
        if self.resent or self.delivered or not recoverable:
            return Verdict.REJECT
        self.resent = True
        return Verdict.RETRY

    def error(self, code: str | None) -> Verdict:
        """An `error` event answered the request before the response started."""
        self.done = True
        if self.resent or not should_resend(code, chained=self.chained):
            return Verdict.REJECT
        self.resent = True
        return Verdict.RETRY
