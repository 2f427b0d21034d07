"""The shared response store on Redis: what lets another worker or replica continue a conversation.

One key per stored response (`<prefix>resp:<id>`) holding a versioned encoding of the
`ResponseState` (items, tools, what the next turn needs), and one list per conversation
(`<prefix>hist:<id of its first stored response>`) holding the history's items, one element per
batch (a turn's input, a response's output), both with a TTL:
a replica that never saw the conversation continues it without the client resending anything.
Readers accept every version they know and ignore fields they do not, so a rolling upgrade never
breaks a read.

Redis being down is reported as `store_unavailable` (503) to the turns that need the store; the
client library reconnects on the next command, so the service recovers by itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from .eager import on_task
from .errors import store_unavailable
from .history import History
from .redis_quota import ACCOUNT, FORGET, NO_QUOTA, TenantQuota
from .state import ResponseState
from .tools import chat_tools

if TYPE_CHECKING:
    import redis.asyncio

log = logging.getLogger(__name__)

ENCODING_VERSION = 3
"""Bump when a field changes meaning; `decode_state` keeps reading every older version it can.

v3: a header line `3<TAB>history key<TAB>batch count`, then the state as JSON: the history is a
Redis list shared by the turns of one conversation, one element per batch of Responses items (the
JSON array of a turn's input or a response's output), each turn appending only its own batches,
so a conversation of N turns holds O(total bytes) in Redis, not O(N^2). v1 (a JSON object with
the rendered chat `messages`) and v2 (the same header, the list holding chat messages) kept only
chat messages, from which the items cannot be rebuilt: such an entry reads as absent, so the
client resends that conversation in full once. Optional fields added
without a bump, absent from older entries: `checks` (each stateful check's state; a chain read
without it restarts its checks from their initial state on the new items) and `tokens` (the
tokenizer's count through the response's input; without it the prefix is counted once)."""

_SAVE = r"""
-- KEYS: entry, history list. ARGV: entry bytes, ttl ms, the list length it must have (-1: start it anew), fragments...
local expected = tonumber(ARGV[3])
if expected < 0 then
  redis.call('DEL', KEYS[2])
elseif redis.call('LLEN', KEYS[2]) ~= expected then
  return 0
end
for i = 4, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_LOAD = r"""
local entry = redis.call('GET', KEYS[1])
if not entry then return false end
local key, count = string.match(entry, '^%d\t([^\t]+)\t(%d+)\n')
if key then return {entry, redis.call('LRANGE', key, 0, tonumber(count) - 1)} end
return {entry}
"""


class UnreadableEntry(ValueError):
    """A stored entry written by a newer, unknown encoding (or damaged, or its history gone): treated as absent."""


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a stored response's history ends: its list, its length, and a fingerprint of that prefix."""

    key: str
    count: int
    nbytes: int
    tail: int


def encode_state(state: ResponseState, history_key: str) -> bytes:
    """A v2 entry: the header naming the history list and its length, then the state without its history."""
    header = f"{ENCODING_VERSION}\t{history_key}\t{state.history.batches}\n".encode()
    return header + orjson.dumps(
        {
            "tenant": state.tenant,
            "response": state.response,
            "input_items": state.input_items,
            "output_items": state.output_items,
            "tools": state.tools,
            "call_ids": sorted(state.call_ids),
            "deployment": state.deployment,
            "carry": state.carry,
            "checks": state.checks,
            "tokens": state.tokens,
        }
    )


def decode_state(raw: bytes, history: list[bytes] | None = None) -> ResponseState:
    """Rebuild a state from a v3 entry and its history's batches.

    The history renders batch by batch to the same bytes, so backend prefix caches still hit.
    """
    head, _, rest = raw.partition(b"\n")
    fields = head.split(b"\t")
    if raw.startswith(b"{") or fields[0] != b"3" or len(fields) != 3:
        raise UnreadableEntry(
            f"encoding {head[:20]!r}; this server reads {ENCODING_VERSION} (older ones kept chat messages)"
        )
    if history is None or len(history) != int(fields[2]):
        raise UnreadableEntry("its conversation history expired or was evicted")
    body, batches = _json(rest), [orjson.loads(batch) for batch in history]
    return ResponseState(
        response=body["response"],
        input_items=body["input_items"],
        output_items=body["output_items"],
        tools=body["tools"],
        chat_tools=chat_tools(body["tools"]),
        history=History.from_batches(batches),
        call_ids=frozenset(body.get("call_ids", ())),
        deployment=body.get("deployment"),
        carry=body.get("carry") or {},
        tenant=body.get("tenant"),
        checks=body.get("checks") or {},
        tokens=tuple(body["tokens"]) if body.get("tokens") else None,  # type: ignore[arg-type]
    )


def _json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UnreadableEntry(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise UnreadableEntry("not a JSON object")
    return body


def _where(key: str, history: History) -> _Where:
    return _Where(key, history.batches, history.nbytes, hash(orjson.dumps(history.own)))


def _extends(history: History, where: _Where) -> bool:
    """Whether `history` is the history at `where` plus more: a node of its chain matches that prefix."""
    node: History | None = history
    while node is not None and node.batches > where.count:
        node = node.parent
    return node is not None and node.batches == where.count and _where(where.key, node) == where


class RedisResponseStore:
    """`ResponseStore` on a Redis server shared by every worker and replica.

    `ttl_s` bounds how long a response can be continued; `max_entry_bytes` bounds one response with
    its history (a larger one is not stored and a warning is logged; its connection can still
    continue it). Total memory is Redis's own business: set `maxmemory` with `volatile-lru`, every
    key has a TTL; `quota` bounds each tenant's share (see `redis_quota`). A turn appends its messages to its parent's history list when it continues the
    list's newest response (which this process saved or loaded); a fork, or a parent it does not
    know, starts a list of its own.
    """

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float = 30 * 86400,
        max_entry_bytes: int = 32 * 1024 * 1024,
        timeout_s: float = 2.0,
        prefix: str = "responses-ws:",
        known: int = 10_000,
        quota: TenantQuota = NO_QUOTA,
    ) -> None:
        self.url = url
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.max_entry_bytes = max_entry_bytes
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._redis = connect(url, timeout_s)
        self._save_script = self._redis.register_script(_SAVE)
        self._load_script = self._redis.register_script(_LOAD)
        self.quota = quota
        self._account_script = self._redis.register_script(ACCOUNT)
        self._forget_script = self._redis.register_script(FORGET)
        self._known: OrderedDict[str, _Where] = OrderedDict()
        self._known_max = known

    def _key(self, response_id: str) -> str:
        return f"{self.prefix}resp:{response_id}"

    def _history_key(self, response_id: str) -> str:
        return f"{self.prefix}hist:{response_id}"

    async def save(self, state: ResponseState) -> None:
        parent = self._known.get(state.response.get("previous_response_id") or "")
        if (
            parent is not None
            and _extends(state.history, parent)
            and await self._write(state, parent.key, parent.count)
        ):
            return
        # no parent it knows, a fork (another turn appended first), or the list expired: a list of its own
        await self._write(state, self._history_key(state.id), -1)

    async def _write(self, state: ResponseState, history_key: str, expected: int) -> bool:
        """One atomic script: append the new batches (all of them when `expected` is -1), set the entry.

        False when the list is not `expected` long. A response over the bound is skipped (True: done).
        """
        entry = encode_state(state, history_key)
        if len(entry) + state.history.nbytes > self.max_entry_bytes:
            log.warning(
                "response %s not stored: %d bytes with its history, over the store's %d-byte bound",
                state.id,
                len(entry) + state.history.nbytes,
                self.max_entry_bytes,
            )
            return True
        fragments = [orjson.dumps(batch) for batch in state.history.batch_list()[max(expected, 0) :]]
        keys = [self._key(state.id), history_key]
        written = await self._call(
            "save", self._save_script(keys=keys, args=[entry, self.ttl_ms, expected, *fragments])
        )
        if written:
            self._remember(state.id, _where(history_key, state.history))
            if self.quota.on:
                appended = sum(len(fragment) for fragment in fragments)
                await self._account(state, len(entry), appended, history_key)
        return bool(written)

    async def _account(self, state: ResponseState, entry: int, appended: int, history_key: str) -> None:
        """Count the saved response against its tenant's quota, dropping that tenant's oldest beyond it."""
        args = self.quota.account_args(state.id, int(time.time() * 1000), entry, appended, history_key)
        keys = TenantQuota.keys(self.prefix, state.tenant)
        await self._call("save", self._account_script(keys=keys, args=[*args, self._key(""), self.ttl_ms]))

    async def load(self, response_id: str, tenant: str | None) -> ResponseState | None:
        found = await self._call("load", self._load_script(keys=[self._key(response_id)]))
        if not found:
            return None
        try:
            state = decode_state(found[0], found[1] if len(found) > 1 else None)
        except (UnreadableEntry, KeyError, TypeError) as exc:
            log.warning("stored response %s is unreadable (%s): treated as absent", response_id, exc)
            return None
        if state.tenant != tenant:
            return None
        if not found[0].startswith(b"{"):
            self._remember(response_id, _where(found[0].split(b"\t", 2)[1].decode(), state.history))
        return state

    def _remember(self, response_id: str, where: _Where) -> None:
        self._known[response_id] = where
        self._known.move_to_end(response_id)
        while len(self._known) > self._known_max:
            self._known.popitem(last=False)

    async def delete(self, response_id: str, tenant: str | None) -> bool:
        if await self.load(response_id, tenant) is None:
            return False
        self._known.pop(response_id, None)
        if self.quota.on:
            keys = TenantQuota.keys(self.prefix, tenant)
            await self._call("delete", self._forget_script(keys=keys, args=[response_id]))
        return bool(await self._call("delete", self._redis.delete(self._key(response_id))))

    async def ping(self) -> bool:
        """Whether Redis answers within half a second (for `/readyz`, whose probes time out quickly); never raises."""
        try:
            async with asyncio.timeout(0.5):
                return bool(await self._redis.ping())
        except Exception:
            return False

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def _call(self, what: str, command: Any) -> Any:
        """`command`, within `timeout_s` all told: the client's retries (three tries of `timeout_s` each on a
        Redis that accepts but does not answer) must not make a turn wait three times what was configured."""
        from redis.exceptions import ConnectionError
        from redis.exceptions import TimeoutError as RedisTimeout

        await on_task()  # the timeout cancels the current task
        try:
            async with asyncio.timeout(self.timeout_s):
                return await command
        except (ConnectionError, RedisTimeout, TimeoutError, OSError) as exc:
            log.warning("redis store %s failed: %s", what, exc or f"no answer within {self.timeout_s:g} s")
            raise store_unavailable() from exc


EXTRA = "pip install 'responses-ws[redis]'"


def available() -> bool:
    """Whether the `redis` extra is installed: checked before `serve` binds, not when the first worker dies."""
    try:
        import redis.asyncio  # noqa: F401
    except ImportError:
        return False
    return True


def connect(url: str, timeout_s: float, max_connections: int = 64) -> redis.asyncio.Redis:
    """An asyncio client that fails fast when Redis is away (a short retry, then an error) and reconnects later.

    A blocking pool: under load a command waits (up to 10 s, or `timeout_s` if longer) for one of
    `max_connections` connections instead of failing with "Too many connections"; a Redis that is
    down still fails at once (connection refused) or within `timeout_s` (no answer).
    """
    try:
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
    except ImportError:
        raise RuntimeError(f"a redis:// store needs the redis package: {EXTRA}") from None
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=max(timeout_s, 10.0),
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
        health_check_interval=30,
    )
    return redis.asyncio.Redis.from_pool(pool)
