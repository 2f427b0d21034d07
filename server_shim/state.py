"""Response state: the connection-scoped cache and the response store behind a small interface."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import metrics
from .items import Item
from .render import ChatPrompt
from .tools import ChatTools


@dataclass(slots=True)
class ResponseState:
    """What a later turn needs to continue from a response without touching its history again."""

    response: dict[str, Any]
    input_items: list[Item]
    output_items: list[Item]
    tools: list[dict[str, Any]]
    chat_tools: ChatTools
    prompt: ChatPrompt
    call_ids: frozenset[str]
    deployment: str | None = None
    carry: dict[str, Any] = field(default_factory=dict)
    tenant: str | None = None
    """The id of the API key's tenant that created it (see `tenants`); None when the server has no keys."""
    checks: dict[str, Any] = field(default_factory=dict)
    """Each stateful check's state after this response's input (`checks.py`): JSON, never changed in place."""

    @property
    def id(self) -> str:
        return self.response["id"]

    @property
    def size(self) -> int:
        """Memory held, for the cache's byte bound: the rendered history dominates.

        States of one chain share their history, so the sum over-counts: the bound is safe.
        """
        return self.prompt.nbytes + 1024


class ConnectionCache:
    """Per-connection LRU of response states, bounded by count and by bytes; memory only."""

    def __init__(self, max_responses: int, max_bytes: int) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._states: OrderedDict[str, ResponseState] = OrderedDict()
        self._bytes = 0
        self.notices: set[str] = set()
        """What this connection was told once already (hosted tools dropped, ...)."""

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._states

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, response_id: str) -> ResponseState | None:
        state = self._states.get(response_id)
        if state is not None:
            self._states.move_to_end(response_id)
        return state

    def put(self, state: ResponseState) -> None:
        self.evict(state.id)
        self._states[state.id] = state
        self._bytes += state.size
        while len(self._states) > 1 and (len(self._states) > self.max_responses or self._bytes > self.max_bytes):
            _, oldest = self._states.popitem(last=False)
            self._bytes -= oldest.size
            metrics.CACHE_EVICTIONS.labels("capacity").inc()

    def evict(self, response_id: str) -> None:
        state = self._states.pop(response_id, None)
        if state is not None:
            self._bytes -= state.size

    def ids(self) -> list[str]:
        return list(self._states)


class ResponseStore(Protocol):
    """Where `store: true` responses live beyond one connection.

    Implementations must be safe to share between connections. Every read names the tenant
    asking: a response owned by another tenant is indistinguishable from an unknown id, so
    `load` returns None and `delete` returns False (and removes nothing) for both.
    """

    async def save(self, state: ResponseState) -> None: ...

    async def load(self, response_id: str, tenant: str | None) -> ResponseState | None: ...

    async def delete(self, response_id: str, tenant: str | None) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryResponseStore:
    """The default store: a bounded in-process dict (oldest dropped first)."""

    def __init__(self, max_responses: int = 10_000) -> None:
        self.max_responses = max_responses
        self._states: OrderedDict[str, ResponseState] = OrderedDict()

    async def save(self, state: ResponseState) -> None:
        self._states[state.id] = state
        self._states.move_to_end(state.id)
        while len(self._states) > self.max_responses:
            self._states.popitem(last=False)

    async def load(self, response_id: str, tenant: str | None) -> ResponseState | None:
        state = self._states.get(response_id)
        return state if state is not None and state.tenant == tenant else None

    async def delete(self, response_id: str, tenant: str | None) -> bool:
        if await self.load(response_id, tenant) is None:
            return False
        del self._states[response_id]
        return True

    async def aclose(self) -> None:
        self._states.clear()
