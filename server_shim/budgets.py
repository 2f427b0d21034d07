"""Memory the connection caches hold together: a server-wide budget and a per-tenant share, sans-I/O.

Each connection's cache is bounded on its own (`cache_max_bytes`), but a thousand connections of
32 MiB each are 32 GiB: `CacheBudget` bounds their sum. A cache reports to it after each change
(once per turn, never per event); past a bound, cached responses are dropped, oldest first, from the
least recently used connection of the tenant holding the most (or, past the tenant's share, of that
tenant), so a tenant that caches much cannot evict one that caches little. A connection keeps the
response it has just cached. A dropped response is gone from that connection's cache only: with
`store` (the default) the next turn loads it from the store; with `store: false` the client gets
`previous_response_not_found` and resends its conversation (`ws_transport.wrap()` does so by itself).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Protocol

from . import metrics

MIB = 1024 * 1024
_BUDGET_EVICTIONS = metrics.CACHE_EVICTIONS.labels("budget")


class Budgeted(Protocol):
    """What the budget needs of a cache: its tenant, its bytes, and dropping its oldest response."""

    tenant: str | None

    @property
    def nbytes(self) -> int: ...

    def __len__(self) -> int: ...

    def drop_oldest(self) -> None: ...


class CacheBudget:
    """The bytes every cache holds, in all and per tenant, and what to drop when over (a plain object).

    Each tenant's caches are kept in their own least-recently-changed order, so a drop looks at the
    front of one tenant's queue (a cache found with nothing to drop goes to the back: it has nothing
    to lose until it caches again, which moves it there anyway): a settle that drops N responses costs
    about N steps, not N times the number of connections, and runs on the event loop."""

    def __init__(self, max_bytes: int, tenant_max_bytes: int = 0) -> None:
        self.max_bytes = max_bytes
        self.tenant_max_bytes = tenant_max_bytes or max_bytes
        self.total = 0
        self.evicted = 0
        """Responses dropped to keep within the budget (also `responses_ws_cache_evictions{reason="budget"}`)."""
        self._tenants: dict[str | None, int] = {}
        self._charged: dict[Budgeted, int] = {}
        """Each cache with the bytes it was last charged."""
        self._queues: dict[str | None, OrderedDict[Budgeted, None]] = {}
        """Each tenant's caches, least recently changed first."""

    def tenant_bytes(self, tenant: str | None) -> int:
        return self._tenants.get(tenant, 0)

    def settle(self, cache: Budgeted) -> None:
        """`cache` changed (a response put or dropped): charge its bytes, then drop what is over a bound."""
        tenant = cache.tenant
        self._charge(cache)
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = OrderedDict()
        queue[cache] = None
        queue.move_to_end(cache)
        while self._tenants.get(tenant, 0) > self.tenant_max_bytes and self._drop(tenant, cache):
            pass
        while self.total > self.max_bytes and self._drop_from_largest(cache):
            pass
        metrics.set_later(metrics.CACHE_BYTES, self.total)

    def leave(self, cache: Budgeted) -> None:
        """The connection closed: its cache no longer counts."""
        charged = self._charged.pop(cache, 0)
        queue = self._queues.get(cache.tenant)
        if queue is not None:
            queue.pop(cache, None)
            if not queue:
                del self._queues[cache.tenant]
        self._add(cache.tenant, -charged)
        metrics.set_later(metrics.CACHE_BYTES, self.total)

    def _charge(self, cache: Budgeted) -> None:
        nbytes = cache.nbytes
        self._add(cache.tenant, nbytes - self._charged.get(cache, 0))
        self._charged[cache] = nbytes

    def _add(self, tenant: str | None, delta: int) -> None:
        self.total += delta
        held = self._tenants.get(tenant, 0) + delta
        if held > 0:
            self._tenants[tenant] = held
        else:
            self._tenants.pop(tenant, None)

    def _drop_from_largest(self, keep: Budgeted) -> bool:
        """Drop from the tenant holding the most that has something to drop (tenants are few)."""
        return any(self._drop(tenant, keep) for tenant in sorted(self._tenants, key=self.tenant_bytes, reverse=True))

    def _drop(self, tenant: str | None, keep: Budgeted) -> bool:
        """Drop the oldest response of `tenant`'s least recently used cache; False when nothing can go."""
        queue = self._queues.get(tenant)
        for _ in range(len(queue or ())):
            assert queue is not None
            cache = next(iter(queue))
            if _droppable(cache, keep):
                cache.drop_oldest()
                self._charge(cache)
                self.evicted += 1
                metrics.add(_BUDGET_EVICTIONS)
                return True
            queue.move_to_end(cache)
        return False


def _droppable(cache: Budgeted, keep: Budgeted) -> bool:
    """A cache may lose anything but the response `keep` (the cache being settled) has just cached."""
    return len(cache) > (1 if cache is keep else 0)


def default_cache_budget(total_memory: int | None = None) -> int:
    """A quarter of the memory this process may use (its cgroup's limit, else the machine's), at least 64 MiB."""
    memory = total_memory if total_memory is not None else available_memory()
    return max(64 * MIB, memory // 4)


def available_memory() -> int:
    """The cgroup v2 (or v1) memory limit when there is one, else physical memory."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * 1024 * MIB
