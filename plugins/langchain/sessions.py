"""The `openai` clients behind one model: its own root clients, and one wrapped client per agent thread."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import httpx2
import openai

from ws_transport import _sdk

from ..transport import wrap as wrap_client


def own_client(client: Any, given_http_client: Any, *, asynchronous: bool) -> tuple[Any, Any]:
    """The client to wrap, and the HTTP transport (connection pool) it and the per-thread sessions use.

    With no `http_client` given, langchain-openai hands every model with the same base URL one
    cached httpx client; wrapping that in place would switch unrelated models to WebSocket, so
    this model gets an httpx client of its own that borrows the cached one's connection pool
    (building a pool costs tens of milliseconds; borrowing costs nothing).
    """
    pool = _sdk.transport_of(client)
    if given_http_client is None:
        http = (
            openai.DefaultAsyncHttpxClient(transport=_AsyncBorrowed(pool))
            if asynchronous
            else openai.DefaultHttpxClient(transport=_Borrowed(pool))
        )
        client = client.copy(http_client=http)
    return client, pool


class _Borrowed(httpx2.BaseTransport):
    """Another client's HTTP transport, used but never closed by this one."""

    def __init__(self, inner: httpx2.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        return self.inner.handle_request(request)

    def close(self) -> None:
        pass


class _AsyncBorrowed(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        pass


class AgentSessions:
    """Wrapped clients per thread key, sync and async, each with its own WebSocket session.

    Each is a copy of the model's root client on a fresh httpx client that borrows the root's
    connection pool (so only the WebSocket is per thread). At most `capacity` per side; the least
    recently used is closed when a new thread needs room. An async client belongs to the event
    loop it was made on; on another loop the thread gets a new one.
    """

    def __init__(
        self,
        sync_root: openai.OpenAI | None,
        async_root: openai.AsyncOpenAI | None,
        sync_inner: Any,
        async_inner: Any,
        *,
        capacity: int,
        options: dict[str, Any],
        owned: tuple[bool, bool] = (True, True),
    ) -> None:
        self.sync_root = sync_root
        self.async_root = async_root
        self.sync_inner = sync_inner
        self.async_inner = async_inner
        self.capacity = max(1, capacity)
        self.options = options
        self.owned = owned
        self._sync: OrderedDict[Hashable, openai.OpenAI] = OrderedDict()
        self._async: OrderedDict[Hashable, tuple[openai.AsyncOpenAI, asyncio.AbstractEventLoop]] = OrderedDict()
        self._lock = threading.Lock()
        self._closing: set[asyncio.Task[Any]] = set()

    def get(self, key: Hashable | None, *, asynchronous: bool) -> openai.OpenAI | openai.AsyncOpenAI | None:
        if key is None:
            return self.async_root if asynchronous else self.sync_root
        with self._lock:
            if asynchronous:
                entry = self._async.get(key)
                return None if entry is None else entry[0]
            return self._sync.get(key)

    def sync_client(self, key: Hashable) -> openai.OpenAI:
        if self.sync_root is None:
            raise ValueError("this model has no sync client (its API key is an async callable)")
        evicted: list[openai.OpenAI] = []
        with self._lock:
            client = self._sync.get(key)
            if client is None:
                http = openai.DefaultHttpxClient(transport=_Borrowed(self.sync_inner))
                client = wrap_client(self.sync_root.copy(http_client=http), **self.options)
                self._sync[key] = client
                while len(self._sync) > self.capacity:
                    evicted.append(self._sync.popitem(last=False)[1])
            else:
                self._sync.move_to_end(key)
        for old in evicted:
            old.close()
        return client

    def async_client(self, key: Hashable) -> openai.AsyncOpenAI:
        assert self.async_root is not None
        loop = asyncio.get_running_loop()
        evicted: list[tuple[openai.AsyncOpenAI, asyncio.AbstractEventLoop]] = []
        with self._lock:
            entry = self._async.get(key)
            if entry is not None and entry[1] is not loop:
                evicted.append(self._async.pop(key))
                entry = None
            if entry is None:
                http = openai.DefaultAsyncHttpxClient(transport=_AsyncBorrowed(self.async_inner))
                entry = (wrap_client(self.async_root.copy(http_client=http), **self.options), loop)
                self._async[key] = entry
                while len(self._async) > self.capacity:
                    evicted.append(self._async.popitem(last=False)[1])
            else:
                self._async.move_to_end(key)
        for client, owner in evicted:
            self._close_async(client, owner)
        return entry[0]

    def close(self, key: Hashable) -> None:
        with self._lock:
            client = self._sync.pop(key, None)
            entry = self._async.pop(key, None)
        if client is not None:
            client.close()
        if entry is not None:
            self._close_async(*entry)

    async def aclose(self, key: Hashable) -> None:
        with self._lock:
            client = self._sync.pop(key, None)
            entry = self._async.pop(key, None)
        if client is not None:
            await asyncio.to_thread(client.close)
        if entry is not None:
            aclient, owner = entry
            if owner is asyncio.get_running_loop():
                await aclient.close()
            else:
                self._close_async(aclient, owner)

    def close_all(self) -> None:
        with self._lock:
            clients, self._sync = list(self._sync.values()), OrderedDict()
            entries, self._async = list(self._async.values()), OrderedDict()
        for client in clients:
            client.close()
        for entry in entries:
            self._close_async(*entry)
        if self.sync_root is not None and self.owned[0]:
            self.sync_root.close()

    async def aclose_all(self) -> None:
        with self._lock:
            keys = [*self._sync, *(k for k in self._async if k not in self._sync)]
        for key in keys:
            await self.aclose(key)
        if self.sync_root is not None and self.owned[0]:
            await asyncio.to_thread(self.sync_root.close)
        if self.async_root is not None and self.owned[1]:
            await self.async_root.close()

    def _close_async(self, client: openai.AsyncOpenAI, loop: asyncio.AbstractEventLoop) -> None:
        """Close an async client on its own loop (its sockets live there); a stopped loop took them along."""
        if loop.is_closed() or not loop.is_running():
            return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            task = loop.create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        else:
            asyncio.run_coroutine_threadsafe(client.close(), loop)
