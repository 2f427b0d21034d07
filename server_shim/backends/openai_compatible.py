"""Any server that speaks OpenAI Chat Completions with streaming (vLLM, SGLang, Ollama, llama.cpp)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from ..errors import BackendError
from .base import BackendRequest, Delta, Finish, TextDelta, ToolCallDelta, Usage, estimate_tokens, loads

log = logging.getLogger(__name__)


class OpenAICompatibleBackend:
    """Streams `POST {base_url}/chat/completions` through one pooled HTTP client."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        name: str = "openai_compatible",
        max_connections: int = 100,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx2.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx2.Timeout(timeout_s, connect=10.0),
            limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def models(self) -> list[str]:
        try:
            response = await self._client.get("/models")
        except httpx2.HTTPError as exc:
            raise BackendError(f"backend {self.base_url} unreachable: {exc}") from exc
        if response.status_code != 200:
            raise BackendError(
                f"backend {self.base_url} /models answered {response.status_code}",
                status=response.status_code,
            )
        return [entry["id"] for entry in loads(response.content).get("data", [])]

    async def stream(self, request: BackendRequest) -> AsyncIterator[Delta]:
        body = request.body(stream=True)
        try:
            async with self._client.stream("POST", "/chat/completions", content=body) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")[:500]
                    raise BackendError(
                        f"backend answered HTTP {response.status_code}: {detail}",
                        status=response.status_code,
                        retryable=response.status_code >= 500 or response.status_code == 429,
                    )
                async for delta in _parse_stream(response.aiter_lines(), request):
                    yield delta
        except httpx2.HTTPError as exc:
            raise BackendError(f"backend {self.base_url} failed: {type(exc).__name__}: {exc}") from exc


async def _parse_stream(lines: AsyncIterator[str], request: BackendRequest) -> AsyncIterator[Delta]:
    """Turn SSE chunk lines into deltas; count tokens ourselves when the backend sends no usage."""
    finish: str | None = None
    usage: Usage | None = None
    output_chars = 0
    done = False
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        chunk = loads(data)
        if "error" in chunk:
            raise BackendError(f"backend stream error: {chunk['error']}")
        if chunk.get("usage"):
            usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                output_chars += len(content)
                yield TextDelta(content)
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                arguments = function.get("arguments") or ""
                output_chars += len(arguments)
                yield ToolCallDelta(call.get("index", 0), arguments, call.get("id"), function.get("name"))
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if not done and finish is None:
        raise BackendError("backend stream ended before the response finished")
    yield usage or Usage(request.estimate_input_tokens(), estimate_tokens(output_chars))
    yield Finish(finish or "stop")


def _usage(raw: dict[str, Any]) -> Usage:
    details = raw.get("prompt_tokens_details") or {}
    return Usage(
        int(raw.get("prompt_tokens") or 0),
        int(raw.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
    )
