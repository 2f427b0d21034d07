"""Upstreams that speak `/v1/responses` themselves (vLLM, OpenAI, another shim).

The items go upstream as the turn has them, with no conversion: content parts, `developer`
messages, reasoning items and every other item type arrive as the client sent them. Only the
`id` of messages, calls and call outputs is dropped: those ids are the shim's own (or the
client's), unknown upstream, and a `store: false` upstream refuses an id it never stored.
Tools, `tool_choice` and the other request fields pass as the client sent them, so an
upstream runs hosted and namespace tools itself.

Over HTTP (the default) the upstream gets the whole conversation each turn with
`store: false`, so nothing depends on its own response store (vLLM's is an in-process dict,
gone on restart).

With `websocket=True`, each client connection of the shim gets one upstream WebSocket of its
own, opened on its first turn and closed when the client connection ends. A conversation then
continues upstream with `previous_response_id` and only its new items, the upstream's response
id kept for the next turn (yielded as `Carry`); when the upstream has lost that response, the
turn is resent once in full. Turns of one client connection take the upstream socket one at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import websockets
from websockets.asyncio.client import ClientConnection

from ..errors import BackendError, without_credentials
from .base import BackendRequest, Carry, Delta, Finish, TextDelta, ToolCallDelta, Usage, as_logprobs, encode, loads
from .pooled import PooledHTTPBackend, drain, unreached
from .sse import bounded_lines

log = logging.getLogger(__name__)

UPSTREAM_RESPONSE_ID = "upstream_response_id"


@dataclass
class _Upstream:
    socket: ClientConnection
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ResponsesPassthroughBackend(PooledHTTPBackend):
    """Streams `POST {base_url}/responses`, or `response.create` over one upstream socket per client connection."""

    def __init__(self, base_url: str, *, websocket: bool = False, api_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(base_url, api_key=api_key, **kwargs)
        self.websocket = websocket
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._upstreams: dict[str, _Upstream] = {}
        self._responses = self.endpoint("/responses")

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]:
        if self.websocket and request.connection_id is not None:
            async for delta in self._stream_websocket(request, request.connection_id):
                yield delta
            return
        try:
            async with self._client.stream("POST", self._responses, content=responses_body(request)) as response:
                self.rate_limit.update(response.headers)
                if response.status_code != 200:
                    raise await self._status_error(response)
                reader = _EventReader()
                async for line in _data_lines(bounded_lines(response.aiter_bytes())):
                    for delta in reader.feed(loads(line)):
                        yield delta
                    if reader.done:
                        await drain(response)
                        return
                raise BackendError("upstream stream ended before the response finished")
        except httpx2.HTTPError as exc:
            raise BackendError(
                f"upstream {self.where} failed: {type(exc).__name__}: {exc}", unreached=unreached(exc)
            ) from exc

    async def _stream_websocket(self, request: BackendRequest, connection_id: str) -> AsyncGenerator[Delta, None]:
        upstream = await self._upstream(connection_id)
        async with upstream.lock:
            previous = request.carry.get(UPSTREAM_RESPONSE_ID)
            reader = _EventReader()
            try:
                await upstream.socket.send(responses_body(request, previous=previous, websocket=True).decode())
                async for delta in self._read(upstream, reader):
                    yield delta
                if reader.lost_previous:
                    log.debug("upstream lost response %s; resending the conversation in full", previous)
                    reader = _EventReader()
                    await upstream.socket.send(responses_body(request, websocket=True).decode())
                    async for delta in self._read(upstream, reader):
                        yield delta
            except websockets.ConnectionClosed as exc:
                self._drop(connection_id)
                raise BackendError(f"upstream socket {self.where} closed: {exc}") from exc
            except BaseException:
                if not reader.done:  # stopped mid-response: the socket still holds its events
                    self._drop(connection_id)
                raise
            yield Carry({UPSTREAM_RESPONSE_ID: reader.response_id})

    async def _read(self, upstream: _Upstream, reader: _EventReader) -> AsyncGenerator[Delta, None]:
        while not reader.done:
            for delta in reader.feed(loads(await upstream.socket.recv())):
                yield delta

    async def _upstream(self, connection_id: str) -> _Upstream:
        upstream = self._upstreams.get(connection_id)
        if upstream is None:
            url = "ws" + self.base_url.removeprefix("http") + "/responses"
            try:
                socket = await websockets.connect(url, additional_headers=self._headers, max_size=None)
            except (OSError, websockets.InvalidHandshake, TimeoutError) as exc:
                raise BackendError(f"upstream socket {without_credentials(url)} unreachable: {exc}") from exc
            upstream = self._upstreams.setdefault(connection_id, _Upstream(socket))
            if upstream.socket is not socket:
                await socket.close()
        return upstream

    def _drop(self, connection_id: str) -> None:
        upstream = self._upstreams.pop(connection_id, None)
        if upstream is not None:
            upstream.socket.transport.abort()

    async def release(self, connection_id: str) -> None:
        upstream = self._upstreams.pop(connection_id, None)
        if upstream is not None:
            await upstream.socket.close()

    async def aclose(self) -> None:
        await asyncio.gather(*(self.release(key) for key in list(self._upstreams)))
        await super().aclose()


def responses_body(request: BackendRequest, *, previous: str | None = None, websocket: bool = False) -> bytes:
    """A `/v1/responses` request for the conversation: whole, or its new items after `previous`."""
    items = request.new_items if previous else request.history.items
    body: dict[str, Any] = {"type": "response.create"} if websocket else {"stream": True}
    body.update(
        model=request.model, input=[upstream_item(item) for item in items], **request.responses_fields, store=False
    )
    if previous:
        body["previous_response_id"] = previous
    if request.instructions:
        body["instructions"] = request.instructions
    if request.tools:
        body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
    if request.max_output_tokens is not None:
        body["max_output_tokens"] = request.max_output_tokens
    return encode(body)


ID_DROPPED = frozenset(
    {"message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output"}
)
CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})


def upstream_item(item: dict[str, Any]) -> dict[str, Any]:
    """The item as the upstream gets it: unchanged, less the `id` of a message, call or call output."""
    if "id" in item and item.get("type", "message") in ID_DROPPED:
        return {key: value for key, value in item.items() if key != "id"}
    return item


async def _data_lines(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()


@dataclass
class _EventReader:
    """Upstream Responses events -> deltas, for one response (SSE or WebSocket alike)."""

    done: bool = False
    lost_previous: bool = False
    response_id: str | None = None
    calls: set[int] = field(default_factory=set)

    def feed(self, event: dict[str, Any]) -> list[Delta]:
        kind = event.get("type")
        if kind == "response.created":
            self.response_id = event["response"]["id"]
        elif kind == "response.output_text.delta":
            return [TextDelta(event["delta"], as_logprobs(event.get("logprobs")))]
        elif kind == "response.output_item.added" and event["item"].get("type") in CALL_ITEMS:
            item = event["item"]
            custom = item["type"] == "custom_tool_call"
            self.calls.add(event["output_index"])
            opening = item.get("input" if custom else "arguments") or ""
            return [
                ToolCallDelta(
                    event["output_index"], opening, item["call_id"], item["name"], item.get("namespace"), custom=custom
                )
            ]
        elif kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            return [ToolCallDelta(event["output_index"], event["delta"])]
        elif kind in ("response.completed", "response.incomplete"):
            self.done = True
            usage = event["response"].get("usage") or {}
            finish = "length" if kind == "response.incomplete" else ("tool_calls" if self.calls else "stop")
            return [
                Usage(
                    usage.get("input_tokens", 0),
                    usage.get("output_tokens", 0),
                    (usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
                ),
                Finish(finish),
            ]
        elif kind in ("response.failed", "error"):
            error = event.get("error") or (event.get("response") or {}).get("error") or event
            if kind == "error" and self.response_id is None and error.get("code") == "previous_response_not_found":
                self.done = self.lost_previous = True
                return []
            raise BackendError(f"upstream failed: {error.get('message', event)}", status=event.get("status"))
        return []
