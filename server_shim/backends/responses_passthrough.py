"""Upstreams that speak `/v1/responses` themselves (vLLM, OpenAI, another shim), over HTTP.

The shim keeps the conversation state; the upstream gets the whole conversation each turn as
Responses input items with `store: false`, so nothing depends on the upstream's own response
store (vLLM's is an in-process dict, gone on restart). Its event stream is read back into
the same deltas every backend yields.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx2

from ..errors import BackendError
from ..render import encode
from .base import BackendRequest, Delta, Finish, TextDelta, ToolCallDelta, Usage, loads
from .pooled import PooledHTTPBackend

log = logging.getLogger(__name__)


class ResponsesPassthroughBackend(PooledHTTPBackend):
    """Streams `POST {base_url}/responses` (stateless) through one pooled HTTP client."""

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]:
        try:
            async with self._client.stream("POST", "/responses", content=responses_body(request)) as response:
                self.rate_limit.update(response.headers)
                if response.status_code != 200:
                    raise await self._status_error(response)
                async for delta in _parse_events(response.aiter_lines()):
                    yield delta
        except httpx2.HTTPError as exc:
            raise BackendError(f"upstream {self.base_url} failed: {type(exc).__name__}: {exc}") from exc


def responses_body(request: BackendRequest) -> bytes:
    """A stateless `POST /v1/responses` body for the rendered conversation."""
    body: dict[str, Any] = {
        "model": request.model,
        "input": to_items(request.prompt.messages),
        "stream": True,
        "store": False,
        **request.options,
    }
    if request.instructions:
        body["instructions"] = request.instructions
    if request.tools:
        body["tools"] = [{"type": "function", **tool["function"]} for tool in request.tools]
        if request.tool_choice is not None:
            choice = request.tool_choice
            body["tool_choice"] = (
                choice if isinstance(choice, str) else {"type": "function", "name": choice["function"]["name"]}
            )
    if request.max_output_tokens is not None:
        body["max_output_tokens"] = request.max_output_tokens
    return encode(body)


def to_items(messages: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """Chat messages back to Responses input items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}
            )
            continue
        if message.get("content"):
            items.append({"type": "message", "role": role, "content": message["content"]})
        for call in message.get("tool_calls") or ():
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items


async def _parse_events(lines: AsyncIterator[str]) -> AsyncGenerator[Delta, None]:
    calls: dict[int, str] = {}
    async for line in lines:
        if not line.startswith("data:"):
            continue
        event = loads(line[5:].strip())
        kind = event.get("type")
        if kind == "response.output_text.delta":
            yield TextDelta(event["delta"])
        elif kind == "response.output_item.added" and event["item"].get("type") == "function_call":
            item = event["item"]
            calls[event["output_index"]] = item["call_id"]
            yield ToolCallDelta(event["output_index"], item.get("arguments") or "", item["call_id"], item["name"])
        elif kind == "response.function_call_arguments.delta":
            yield ToolCallDelta(event["output_index"], event["delta"])
        elif kind in ("response.completed", "response.incomplete"):
            response = event["response"]
            usage = response.get("usage") or {}
            yield Usage(
                usage.get("input_tokens", 0),
                usage.get("output_tokens", 0),
                (usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
            )
            yield Finish("length" if kind == "response.incomplete" else ("tool_calls" if calls else "stop"))
            return
        elif kind in ("response.failed", "error"):
            error = event.get("error") or (event.get("response") or {}).get("error") or event
            raise BackendError(f"upstream failed: {error.get('message', event)}")
    raise BackendError("upstream stream ended before the response finished")
