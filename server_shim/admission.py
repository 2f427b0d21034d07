"""Who gets in: the server-wide connection cap, draining, and per-tenant limits, as plain state machines.

Nothing here touches a socket or reads a clock: the WebSocket and HTTP layers ask for a
decision, passing `now` (seconds on a monotonic clock), and act on the answer. A refusal
carries a code, a status and how long to wait, so HTTP can send `Retry-After` and the
WebSocket `error` event can say when to try again.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from .errors import APIError


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    code: str
    message: str
    retry_after_s: float

    def api_error(self) -> APIError:
        kind = "rate_limit_error" if self.status == 429 else "server_error"
        return APIError(self.status, self.code, self.message, type=kind, retry_after_s=self.retry_after_s)

    @property
    def retry_after_header(self) -> str:
        """Whole seconds, at least 1, as HTTP wants them."""
        return str(max(1, math.ceil(self.retry_after_s)))


def shutting_down(retry_after_s: float = 1.0) -> Refusal:
    return Refusal(503, "server_shutting_down", "The server is shutting down; retry on another replica.", retry_after_s)


def tenant_connection_cap(max_connections: int, configured: int | None, tenants: int) -> int:
    """WebSocket connections one tenant may hold (0: no limit). Unset, half the server's when keys name two or
    more tenants, so one tenant's connections (open and idle up to `idle_timeout_s`) leave the other half free;
    with one tenant, or none, the server-wide cap is the only one."""
    if configured is not None:
        return configured
    return max(1, max_connections // 2) if tenants > 1 else 0


def tenant_reserved_connections(max_connections: int, tenant_cap: int, tenants: int) -> int:
    """WebSocket connections kept for each tenant while it holds fewer: half the server shared evenly among
    the tenants (0 with fewer than two tenants, or with the per-tenant cap off). The cap alone lets two
    tenants at half the server each take every slot from a third; the reserve does not, and costs a busy
    tenant nothing while the others are idle beyond what they may still claim."""
    if tenants < 2 or not tenant_cap:
        return 0
    return min(tenant_cap, max_connections // (2 * tenants))


@dataclass
class ConnectionGate:
    """Server-wide admission of new WebSocket connections and HTTP requests, and each tenant's share of the
    connections: at most `tenant_max_connections` (0: no limit), and while a tenant holds fewer than
    `tenant_reserved` the server keeps that many slots free for it (`tenants` names how many tenants the
    keys define; each tenant id passed here must be one of them)."""

    max_connections: int
    tenant_max_connections: int = 0
    tenants: int = 0
    draining: bool = False
    open_connections: int = 0
    _tenants: dict[str | None, int] = field(default_factory=dict)
    tenant_reserved: int = field(init=False)
    _unclaimed: int = field(init=False)
    """Reserved slots not yet used: the sum over tenants of how far each is below `tenant_reserved`."""

    def __post_init__(self) -> None:
        self.tenant_reserved = tenant_reserved_connections(
            self.max_connections, self.tenant_max_connections, self.tenants
        )
        self._unclaimed = self.tenant_reserved * self.tenants

    def admit_connection(self, tenant: str | None = None) -> Refusal | None:
        if self.draining:
            return shutting_down()
        if self.open_connections >= self.max_connections:
            return Refusal(
                503,
                "server_overloaded",
                f"The server holds its maximum of {self.max_connections} WebSocket connections; retry shortly.",
                1.0,
            )
        held = self._tenants.get(tenant, 0)
        if self.tenant_max_connections and held >= self.tenant_max_connections:
            return self._tenant_refusal(
                f"This API key holds its maximum of {self.tenant_max_connections} WebSocket connections"
            )
        if held < self.tenant_reserved:
            self._unclaimed -= 1
        elif self.max_connections - self.open_connections <= self._unclaimed:
            return self._tenant_refusal(
                f"This API key holds {held} WebSocket connections and the free ones are kept for other API keys "
                f"(each is sure of {self.tenant_reserved})"
            )
        self.open_connections += 1
        self._tenants[tenant] = held + 1
        return None

    @staticmethod
    def _tenant_refusal(why: str) -> Refusal:
        return Refusal(503, "tenant_connection_limit_reached", f"{why}; close one or retry shortly.", 1.0)

    def connection_closed(self, tenant: str | None = None) -> None:
        self.open_connections -= 1
        held = self._tenants.pop(tenant, 0) - 1
        if held > 0:
            self._tenants[tenant] = held
        if held < self.tenant_reserved:
            self._unclaimed += 1

    def admit_request(self) -> Refusal | None:
        return shutting_down() if self.draining else None


@dataclass
class TenantLimiter:
    """Per tenant: responses in flight at once, and responses started per minute (a sliding window).

    A limit of 0 is off. `acquire` admits (and counts) `count` responses together (a chat request's
    `n` choices are `n` responses) or refuses them all with `rate_limit_exceeded` and the seconds
    until they would be admitted; every admitted response is `release`d once, however it ends.
    `never_admits` says whether `count` is over a limit outright (a 429 would be retried forever).

    A tenant's count in flight is a plain int in a dict, its window a deque kept only under
    `turns_per_minute`: every WebSocket turn acquires and releases, most often with no limit set, and
    a record made and dropped per turn (a dataclass with a deque in it) cost ~7,000 instructions there.
    """

    max_concurrent: int = 0
    turns_per_minute: int = 0
    window_s: float = 60.0
    _in_flight: dict[str | None, int] = field(default_factory=dict)
    """Responses in flight per tenant, while it has any."""
    _starts: dict[str | None, deque[float]] = field(default_factory=dict)
    """When each tenant's responses in the window started (under `turns_per_minute`), while it has any."""

    def never_admits(self, count: int) -> int | None:
        """The limit `count` responses at once are over whatever is in flight, if any."""
        over = [limit for limit in (self.max_concurrent, self.turns_per_minute) if limit and count > limit]
        return min(over) if over else None

    def acquire(self, tenant: str | None, now: float, count: int = 1) -> Refusal | None:
        in_flight = self._in_flight.get(tenant, 0)
        if self.max_concurrent and in_flight + count > self.max_concurrent:
            return Refusal(
                429,
                "rate_limit_exceeded",
                f"At most {self.max_concurrent} responses may be in flight at once for this API key; "
                "retry when one finishes.",
                1.0,
            )
        if self.turns_per_minute:
            refusal = self._started(tenant, now, count)
            if refusal is not None:
                return refusal
        self._in_flight[tenant] = in_flight + count
        return None

    def _started(self, tenant: str | None, now: float, count: int) -> Refusal | None:
        """`count` starts at `now` in the tenant's window, or the refusal when it has no room for them."""
        starts = self._starts.get(tenant)
        if starts is None:
            starts = self._starts[tenant] = deque()
        while starts and starts[0] <= now - self.window_s:
            starts.popleft()
        if len(starts) + count > self.turns_per_minute:
            expiring = min(len(starts) + count - self.turns_per_minute, len(starts)) - 1
            wait = (starts[expiring] + self.window_s - now) if expiring >= 0 else self.window_s
            return Refusal(
                429,
                "rate_limit_exceeded",
                f"At most {self.turns_per_minute} responses per minute for this API key; retry in {wait:.1f} s.",
                wait,
            )
        starts.extend([now] * count)
        return None

    def release(self, tenant: str | None, count: int = 1) -> None:
        in_flight = self._in_flight.get(tenant)
        if in_flight is None:
            return
        if in_flight > count:
            self._in_flight[tenant] = in_flight - count
            return
        del self._in_flight[tenant]
        starts = self._starts.get(tenant)
        if starts is not None and not starts:
            del self._starts[tenant]

    def in_flight(self, tenant: str | None) -> int:
        return self._in_flight.get(tenant, 0)

    def busy(self) -> bool:
        """Whether any tenant has a response in flight."""
        return bool(self._in_flight)


@dataclass
class QueueBound:
    """What one connection holds in requests read but not started: bounded by count and by frame bytes.

    While `full`, the connection reads no more frames, so a client pipelining faster than its
    responses run is held back by TCP instead of by the server's memory.
    """

    max_requests: int
    max_bytes: int
    requests: int = 0
    nbytes: int = 0

    def add(self, size: int) -> None:
        self.requests += 1
        self.nbytes += size

    def remove(self, size: int) -> None:
        self.requests -= 1
        self.nbytes -= size

    @property
    def full(self) -> bool:
        return self.requests >= self.max_requests or self.nbytes >= self.max_bytes
