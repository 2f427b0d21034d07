"""Response state: the connection-scoped cache and the response store behind a small interface."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping, Set
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import metrics
from .callids import own_calls
from .errors import APIError, previous_response_in_progress, previous_response_not_found
from .footprint import footprint
from .history import History
from .items import Item
from .response_held import Template, made_held, response_held
from .tools import ChatTools

if TYPE_CHECKING:
    from .budgets import CacheBudget

STATE_OVERHEAD = 1024
_CAPACITY_EVICTIONS = metrics.CACHE_EVICTIONS.labels("capacity")
"""The state object, its call-id set and the bookkeeping around it, per response."""


@dataclass(slots=True)
class ResponseState:
    """What a later turn needs to continue from a response without touching its history again."""

    response: dict[str, Any]
    input_items: list[Item]
    output_items: list[Item]
    tools: list[dict[str, Any]]
    chat_tools: ChatTools
    history: History
    """The conversation through this response's output, with the backends' renderings of it cached."""
    call_ids: Set[str]
    deployment: str | None = None
    carry: dict[str, Any] = field(default_factory=dict)
    tenant: str | None = None
    """The id of the API key's tenant that created it (see `tenants`); None when the server has no keys."""
    checks: dict[str, Any] = field(default_factory=dict)
    """Each stateful check's state after this response's input (`checks.py`): JSON, never changed in place."""
    tokens: tuple[str, int] | None = None
    """(tokenizer, tokens of the prompt through this response's input), when a tokenizer counts (`tokens.py`)."""
    base_held: int = 0
    """Memory shared with the previous response: its history, and its tools when this state's are the same list
    (0 when it has none)."""
    own_bytes: int = field(default=0, compare=False)
    """Memory this state adds: its batches of the history (input and output items, their renderings),
    tools (unless shared with `parent`) and Response object."""
    tools_held: int | None = field(default=None, compare=False)
    """The footprint of `tools` (the list alone), when measured: given by the turn (measured in slices), taken
    from `parent` when the list is its, else walked here."""
    parent: InitVar[ResponseState | None] = None
    """The previous response's state, when this one may share its tools list (see `shared_tools`)."""
    echo_held: InitVar[Mapping[int, int] | None] = None
    """The footprints of request containers the Response object echoes, measured already (by `id`)."""
    template: InitVar[Template | None] = None
    """The memo `response_object` has just copied the Response object from (`response_held.made_held`)."""

    def __post_init__(
        self, parent: ResponseState | None, echo_held: Mapping[int, int] | None, template: Template | None
    ) -> None:
        # the output is in the history; the tools are counted once, whichever of the two lists holds them
        echoed = self.response.get("tools")
        inherited = parent is not None and self.tools is parent.tools
        if echoed is None or echoed is self.tools:
            if inherited and parent is not None and parent.tools_held is not None:
                self.tools_held = parent.tools_held
            elif self.tools_held is None:
                self.tools_held = footprint(self.tools) if self.tools else sys.getsizeof(self.tools)
            tools = self.tools_held
        else:
            tools = footprint((self.tools, echoed))
        if inherited:
            self.base_held += tools
        others = (self.carry, self.checks, tuple(own_calls(self.call_ids)))
        held = (
            response_held(self.response, others, echo_held)
            if template is None
            else made_held(self.response, others, template, echo_held)
        )
        self.own_bytes = STATE_OVERHEAD + self.history.held - self.base_held + held + tools

    @property
    def id(self) -> str:
        return self.response["id"]

    @property
    def parent_id(self) -> str | None:
        return self.response.get("previous_response_id")

    @property
    def size(self) -> int:
        """Memory held by this state alone, history included (what it costs when its parent is gone)."""
        return self.own_bytes + self.base_held


def shared_tools(
    given: list[dict[str, Any]], response: dict[str, Any], previous: ResponseState | None
) -> list[dict[str, Any]]:
    """The request's tools as the previous state's list when equal, the Response object's echo the same list.

    An agent sends the same tools every turn, each parsed anew: shared, a conversation holds them
    once rather than twice per turn (the state's and the Response object's).
    """
    tools = previous.tools if previous is not None and previous.tools == given else given
    if response.get("tools") == tools:
        response["tools"] = tools
    return tools


class ChainLedger:
    """Bytes held by a set of states whose histories are shared along `previous_response_id` chains.

    A state whose parent is in the set is charged only what it adds; one whose parent is not
    is charged its whole history too. When a parent leaves, its children in the set are
    re-charged in full. So a chain of N turns counts O(total bytes), as it holds, not O(N^2);
    branches from one evicted parent count the shared history once each (an over-count).
    """

    def __init__(self) -> None:
        self.total = 0
        self._charges: dict[str, int] = {}
        self._children: dict[str, str | set[str]] = {}
        """Children in the set per parent: the id alone, as a parent has one child but for forks (a set costs
        216 bytes), a set beyond one."""
        self._states: dict[str, ResponseState] = {}

    def add(self, state: ResponseState) -> None:
        response = state.response
        response_id = response["id"]
        states = self._states
        if response_id in states:
            self.remove(response_id)
        parent = response.get("previous_response_id")
        if parent is not None and parent in states:
            charge = state.own_bytes
            siblings = self._children.get(parent)
            if siblings is None:
                self._children[parent] = response_id
            elif isinstance(siblings, str):
                self._children[parent] = {siblings, response_id}
            else:
                siblings.add(response_id)
        else:
            charge = state.size
        states[response_id] = state
        self._charges[response_id] = charge
        self.total += charge

    def remove(self, response_id: str) -> None:
        state = self._states.pop(response_id, None)
        if state is None:
            return
        self.total -= self._charges.pop(response_id)
        parent = state.parent_id
        siblings = self._children.get(parent) if parent is not None else None
        if siblings == response_id:
            del self._children[parent]  # type: ignore[arg-type]
        elif isinstance(siblings, set):
            siblings.discard(response_id)
        children = self._children.pop(response_id, ())
        for child_id in (children,) if isinstance(children, str) else children:
            child = self._states[child_id]
            self.total += child.size - self._charges[child_id]
            self._charges[child_id] = child.size


class ConnectionCache:
    """Per-connection LRU of response states, bounded by count and by bytes, and by the server's `budget`
    for all caches together (see `budgets.CacheBudget`); memory only."""

    def __init__(
        self, max_responses: int, max_bytes: int, *, tenant: str | None = None, budget: CacheBudget | None = None
    ) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.tenant = tenant
        self.budget = budget
        self._states: OrderedDict[str, ResponseState] = OrderedDict()
        self._ledger = ChainLedger()
        self.notices: set[str] = set()
        """What this connection was told once already (hosted tools dropped, ...)."""

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._states

    @property
    def nbytes(self) -> int:
        """Memory the cached states hold (see `ChainLedger`)."""
        return self._ledger.total

    def get(self, response_id: str) -> ResponseState | None:
        state = self._states.get(response_id)
        if state is not None:
            self._states.move_to_end(response_id)
        return state

    def put(self, state: ResponseState) -> None:
        """Once per turn: the id read once, and only looked up to evict when it is cached already (a retried id)."""
        response_id = state.response["id"]
        states = self._states
        if response_id in states:
            self.evict(response_id)
        states[response_id] = state
        ledger = self._ledger
        ledger.add(state)
        while len(states) > 1 and (len(states) > self.max_responses or ledger.total > self.max_bytes):
            self.drop_oldest()
            metrics.add(_CAPACITY_EVICTIONS)
        if self.budget is not None:
            self.budget.settle(self)

    def drop_oldest(self) -> None:
        oldest, _ = self._states.popitem(last=False)
        self._ledger.remove(oldest)

    def evict(self, response_id: str) -> None:
        if self._states.pop(response_id, None) is not None:
            self._ledger.remove(response_id)
            if self.budget is not None:
                self.budget.settle(self)

    def close(self) -> None:
        """The connection is gone: its states no longer count toward the budget."""
        if self.budget is not None:
            self.budget.leave(self)

    def ids(self) -> list[str]:
        return list(self._states)


class RunningResponses:
    """Stored responses still streaming in this process, by id, with the tenant each belongs to.

    A `previous_response_id` the store does not have yet but that is running here is 409
    `previous_response_in_progress` (wait for its terminal event), whichever connection or path
    asks, rather than `previous_response_not_found`. Only `store: true` responses are listed: one
    that is not stored can never be found from elsewhere, so "not found" is the true answer there.
    Per process: a response streaming on another worker or replica still reads as not found.
    """

    def __init__(self) -> None:
        self._tenants: dict[str, str | None] = {}

    def started(self, response_id: str, tenant: str | None) -> None:
        self._tenants[response_id] = tenant

    def ended(self, response_id: str | None) -> None:
        if response_id is not None:
            self._tenants.pop(response_id, None)

    def missing(self, response_id: str, tenant: str | None) -> APIError:
        """The error for a parent the store does not have: in progress here (for this tenant), or not found."""
        if self._tenants.get(response_id, ()) == tenant:
            return previous_response_in_progress(response_id)
        return previous_response_not_found(response_id)


class ResponseStore(Protocol):
    """Where `store: true` responses live beyond one connection.

    Implementations must be safe to share between connections. Every read names the tenant
    asking: a response owned by another tenant is indistinguishable from an unknown id, so
    `load` returns None and `delete` returns False (and removes nothing) for both.

    A turn calls `save` and `load` from a task (they may use `asyncio.timeout` or an HTTP client), unless the
    store has `runs_outside_tasks = True`: then also from a lane's first step run inside the socket's read
    (`eager`), which saves a loop iteration per turn; only for coroutines that need no current task.
    """

    async def save(self, state: ResponseState) -> None: ...

    async def load(self, response_id: str, tenant: str | None) -> ResponseState | None: ...

    async def delete(self, response_id: str, tenant: str | None) -> bool: ...

    async def ping(self) -> bool:
        """Whether the store answers now (shown by `/readyz`); never raises."""
        ...

    async def aclose(self) -> None: ...


@dataclass
class _Pool:
    """One tenant's stored responses, oldest saved first, and the memory they hold."""

    order: OrderedDict[str, None] = field(default_factory=OrderedDict)
    ledger: ChainLedger = field(default_factory=ChainLedger)


class MemoryResponseStore:
    """The default store: an in-process dict bounded by count and by the memory it holds, in all and per tenant.

    Each tenant's responses are a pool of their own (a chain never crosses tenants, so its shared history is
    counted within one pool). A tenant over its quota (`tenant_max_responses`, `tenant_max_bytes`; 0: none)
    drops its own oldest; past the store's bounds the oldest of the tenant holding the most (bytes, or
    responses for the count bound) is dropped, so a tenant that stores much cannot evict one that stores little.
    """

    runs_outside_tasks = True
    """Its coroutines never wait: a lane's eager first step may call them (`ResponseStore`)."""

    def __init__(
        self,
        max_responses: int = 10_000,
        max_bytes: int = 512 * 1024 * 1024,
        *,
        tenant_max_responses: int = 0,
        tenant_max_bytes: int = 0,
    ) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.tenant_max_responses = tenant_max_responses or max_responses
        self.tenant_max_bytes = tenant_max_bytes or max_bytes
        self._states: dict[str, ResponseState] = {}
        self._pools: dict[str | None, _Pool] = {}
        self.nbytes = 0
        """Memory the stored states hold (see `ChainLedger`), all tenants."""

    def tenant_bytes(self, tenant: str | None) -> int:
        pool = self._pools.get(tenant)
        return pool.ledger.total if pool is not None else 0

    async def save(self, state: ResponseState) -> None:
        self._drop(state.id)
        pool = self._pools.setdefault(state.tenant, _Pool())
        self._states[state.id] = state
        pool.order[state.id] = None
        self._add(pool, state)
        while len(pool.order) > 1 and (
            len(pool.order) > self.tenant_max_responses or pool.ledger.total > self.tenant_max_bytes
        ):
            self._drop(next(iter(pool.order)))
        while len(self._states) > self.max_responses or self.nbytes > self.max_bytes:
            victim = self._largest(by_count=len(self._states) > self.max_responses, keep=state.id)
            if victim is None:
                break
            self._drop(next(iter(victim.order)))

    def _largest(self, by_count: bool, keep: str) -> _Pool | None:
        """The pool holding the most, of those with something to drop other than `keep` (the newest save)."""
        pools = [pool for pool in self._pools.values() if len(pool.order) > 1 or keep not in pool.order]
        if not pools:
            return None
        return max(pools, key=lambda pool: len(pool.order) if by_count else pool.ledger.total)

    def _add(self, pool: _Pool, state: ResponseState) -> None:
        before = pool.ledger.total
        pool.ledger.add(state)
        self.nbytes += pool.ledger.total - before

    def _drop(self, response_id: str) -> None:
        state = self._states.pop(response_id, None)
        if state is None:
            return
        pool = self._pools[state.tenant]
        del pool.order[response_id]
        before = pool.ledger.total
        pool.ledger.remove(response_id)
        self.nbytes += pool.ledger.total - before
        if not pool.order:
            del self._pools[state.tenant]

    async def load(self, response_id: str, tenant: str | None) -> ResponseState | None:
        state = self._states.get(response_id)
        return state if state is not None and state.tenant == tenant else None

    async def delete(self, response_id: str, tenant: str | None) -> bool:
        if await self.load(response_id, tenant) is None:
            return False
        self._drop(response_id)
        return True

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._states.clear()
        self._pools.clear()
        self.nbytes = 0
