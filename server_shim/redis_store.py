"""The shared response store on Redis: what lets another worker or replica continue a conversation.

One key per stored response (`<prefix>resp:<id>`), written with a TTL, holding a versioned
encoding of the `ResponseState`: items, tools and the rendered history, so a replica that never
saw the conversation continues it without the client resending anything. Readers accept every
version they know and ignore fields they do not, so a rolling upgrade never breaks a read.

Redis being down is reported as `store_unavailable` (503) to the turns that need the store; the
client library reconnects on the next command, so the service recovers by itself.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import orjson

from .errors import store_unavailable
from .render import ChatPrompt
from .state import ResponseState
from .tools import chat_tools

if TYPE_CHECKING:
    import redis.asyncio

log = logging.getLogger(__name__)

ENCODING_VERSION = 1
"""Bump when a field changes meaning; `decode_state` must keep reading every older version."""


class UnreadableEntry(ValueError):
    """A stored entry written by a newer, unknown encoding (or damaged): treated as absent, and logged."""


def encode_state(state: ResponseState) -> bytes:
    """The stored form: plain JSON with a version number; the prompt as its chat messages."""
    return orjson.dumps(
        {
            "v": ENCODING_VERSION,
            "tenant": state.tenant,
            "response": state.response,
            "input_items": state.input_items,
            "output_items": state.output_items,
            "tools": state.tools,
            "messages": list(state.prompt.messages),
            "call_ids": sorted(state.call_ids),
            "deployment": state.deployment,
            "carry": state.carry,
            "checks": state.checks,
            "tokens": state.tokens,
        }
    )


def decode_state(raw: bytes) -> ResponseState:
    """Rebuild a state; the rendered prompt re-encodes to the same bytes, so backend prefix caches still hit."""
    try:
        body = orjson.loads(raw)
        version = body.get("v") if isinstance(body, dict) else None
    except orjson.JSONDecodeError as exc:
        raise UnreadableEntry(f"not JSON: {exc}") from None
    if version != ENCODING_VERSION:
        raise UnreadableEntry(f"encoding version {version!r}; this server reads up to {ENCODING_VERSION}")
    return ResponseState(
        response=body["response"],
        input_items=body["input_items"],
        output_items=body["output_items"],
        tools=body["tools"],
        chat_tools=chat_tools(body["tools"]),
        prompt=ChatPrompt().extend(body["messages"]),
        call_ids=frozenset(body.get("call_ids", ())),
        deployment=body.get("deployment"),
        carry=body.get("carry") or {},
        tenant=body.get("tenant"),
        checks=body.get("checks") or {},
        tokens=tuple(body["tokens"]) if body.get("tokens") else None,  # type: ignore[arg-type]
    )


class RedisResponseStore:
    """`ResponseStore` on a Redis server shared by every worker and replica.

    `ttl_s` bounds how long a response can be continued; `max_entry_bytes` bounds one entry
    (a larger response is not stored and a warning is logged; its connection can still continue it).
    Total memory is Redis's own business: set `maxmemory` with `volatile-lru`, every key has a TTL.
    """

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float = 30 * 86400,
        max_entry_bytes: int = 32 * 1024 * 1024,
        timeout_s: float = 2.0,
        prefix: str = "responses-ws:",
    ) -> None:
        self.url = url
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.max_entry_bytes = max_entry_bytes
        self.prefix = prefix
        self._redis = connect(url, timeout_s)

    def _key(self, response_id: str) -> str:
        return f"{self.prefix}resp:{response_id}"

    async def save(self, state: ResponseState) -> None:
        raw = encode_state(state)
        if len(raw) > self.max_entry_bytes:
            log.warning(
                "response %s not stored: %d bytes encoded, over the store's %d-byte entry bound",
                state.id,
                len(raw),
                self.max_entry_bytes,
            )
            return
        await self._call("save", self._redis.set(self._key(state.id), raw, px=self.ttl_ms))

    async def load(self, response_id: str, tenant: str | None) -> ResponseState | None:
        raw = await self._call("load", self._redis.get(self._key(response_id)))
        if raw is None:
            return None
        try:
            state = decode_state(raw)
        except (UnreadableEntry, KeyError, TypeError) as exc:
            log.warning("stored response %s is unreadable (%s): treated as absent", response_id, exc)
            return None
        return state if state.tenant == tenant else None

    async def delete(self, response_id: str, tenant: str | None) -> bool:
        if await self.load(response_id, tenant) is None:
            return False
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
        from redis.exceptions import ConnectionError, TimeoutError

        try:
            return await command
        except (ConnectionError, TimeoutError, OSError) as exc:
            log.warning("redis store %s failed: %s", what, exc)
            raise store_unavailable() from exc


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
        raise RuntimeError("a redis:// store needs the redis package: pip install 'responses-ws[redis]'") from None
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
