"""Any server that speaks OpenAI Chat Completions with streaming (vLLM, SGLang, Ollama, llama.cpp).

What differs between those servers, and how this module copes (measured against
llama-cpp-python 0.3.36; the others from their documentation):
- Conversion: the turn's Responses items become chat messages in `chat_convert`, continuing
  the rendering cached for the previous turn, so only the new items are rendered and encoded.
- Usage: some servers send a usage chunk when asked (`stream_options.include_usage`),
  llama.cpp never does. Without one, output tokens are counted as the chunks that carried
  content or a tool-call piece (these servers stream one token per chunk; llama.cpp sends
  an empty-content chunk for a token whose bytes end mid-character), or a bytes/4 estimate
  when that is larger; input tokens are estimated from the prompt's size.
- `stream_options`: llama.cpp ignores it; a server that refuses it with 400/422 is asked
  again without it, and never asked with it again.
- Tool calls: llama.cpp repeats the call's id and name on every chunk (the assembler keeps
  the first); some servers finish a forced call with `stop`, reported here as `tool_calls`.
- Failures: a refused connection, an error status (llama.cpp answers a request it cannot
  validate with 500), an in-band error chunk, a malformed chunk, or a stream that ends
  without a finish reason all raise `BackendError`.
- Per-deployment quirks (`Quirks`): request fields a server refuses are dropped, and
  `tool_choice` modes it lacks map to `auto`, each with a DEBUG log.
- Rate limits: `x-ratelimit-*` headers are read on every answer (`RateLimitState`), so the
  router can route elsewhere before a 429; a 429 carries its retry delay.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any

import httpx2
import orjson

from ..config import Quirks
from ..errors import BackendError
from .base import (
    BackendRequest,
    Delta,
    Finish,
    TextDelta,
    ToolCallDelta,
    Usage,
    as_logprobs,
    estimate_tokens,
    loads,
)
from .chat_convert import ChatPrompt, chat_body, chat_prompt, chat_tools_and_choice
from .pooled import PooledHTTPBackend, drain, unreached
from .sse import bounded_lines

log = logging.getLogger(__name__)


class OpenAICompatibleBackend(PooledHTTPBackend):
    """Streams `POST {base_url}/chat/completions` through one pooled HTTP client."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        name: str = "openai_compatible",
        max_connections: int = 100,
        quirks: Quirks | None = None,
        rate_limit_reserve_tokens: int = 2048,
    ) -> None:
        super().__init__(
            base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            name=name,
            max_connections=max_connections,
            rate_limit_reserve_tokens=rate_limit_reserve_tokens,
        )
        self.quirks = quirks or Quirks()
        self.sends_stream_options = self.quirks.stream_usage
        """Cleared, for good, the first time the server refuses `stream_options`."""
        self._completions = self.endpoint("/chat/completions")

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]:
        prompt = chat_prompt(request.history)
        input_estimate = estimate_tokens(prompt.nbytes + len(request.instructions or ""))
        try:
            while True:
                with_options = self.sends_stream_options
                body = self._body(request, prompt, with_options)
                async with self._client.stream("POST", self._completions, content=body) as response:
                    self.rate_limit.update(response.headers)
                    if response.status_code == 200:
                        async for delta in _parse_stream(bounded_lines(response.aiter_bytes()), input_estimate):
                            if isinstance(delta, Usage):  # the stream's end: after it come only its last bytes
                                await drain(response)
                            yield delta
                        return
                    error = await self._status_error(response)
                    if with_options and error.status in (400, 422) and "stream_options" in str(error):
                        log.warning("backend %s refuses stream_options; no longer sending it", self.where)
                        self.sends_stream_options = False
                        continue
                    raise error
        except httpx2.HTTPError as exc:
            raise BackendError(
                f"backend {self.where} failed: {type(exc).__name__}: {exc}", unreached=unreached(exc)
            ) from exc

    def _body(self, request: BackendRequest, prompt: ChatPrompt, with_stream_options: bool) -> bytes:
        """The request body with this deployment's quirks applied."""
        quirks = self.quirks
        extra: dict[str, Any] = {} if with_stream_options else {"stream": True}
        if quirks.drop_params:
            dropped = [key for key in quirks.drop_params if key in request.options]
            if dropped:
                log.debug("%s: dropping %s, which this backend refuses", self.name, dropped)
                request = replace(request, options={k: v for k, v in request.options.items() if k not in dropped})
        tools, choice = chat_tools_and_choice(request)
        if quirks.tool_choice is not None and choice is not None:
            mode = choice if isinstance(choice, str) else "named"
            if mode not in quirks.tool_choice:
                log.debug("%s: tool_choice %r unsupported here, sending 'auto'", self.name, mode)
                choice = "auto"
        return chat_body(request, prompt, tools, choice, stream=with_stream_options, extra=extra)


async def _parse_stream(lines: AsyncIterator[str], input_estimate: int) -> AsyncGenerator[Delta, None]:
    """Turn SSE chunk lines into deltas; count tokens ourselves when the backend sends no usage.

    `Usage` comes once, after the stream's end (`[DONE]` or the last line), then `Finish`.
    """
    finish: str | None = None
    usage: Usage | None = None
    pieces = output_chars = 0
    saw_calls = done = False
    async for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, `event:` lines and `: ping` comments
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = loads(data)
        except orjson.JSONDecodeError as exc:
            raise BackendError(f"backend sent a malformed stream chunk: {data[:200]!r}") from exc
        if "error" in chunk:
            raise BackendError(f"backend stream error: {chunk['error']}")
        if chunk.get("usage"):
            usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content or (content == "" and "role" not in delta):  # an opening role chunk is no token
                pieces += 1
                output_chars += len(content)
                if content:
                    yield TextDelta(content, as_logprobs((choice.get("logprobs") or {}).get("content")))
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                arguments = function.get("arguments") or ""
                pieces += 1
                output_chars += len(arguments)
                saw_calls = True
                yield ToolCallDelta(call.get("index", 0), arguments, call.get("id"), function.get("name"))
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if not done and finish is None:
        raise BackendError("backend stream ended before the response finished")
    yield usage or Usage(input_estimate, max(pieces, estimate_tokens(output_chars)), estimated=True)
    yield Finish("tool_calls" if saw_calls and finish in (None, "stop") else finish or "stop")


def _usage(raw: dict[str, Any]) -> Usage:
    details = raw.get("prompt_tokens_details") or {}
    return Usage(
        int(raw.get("prompt_tokens") or 0),
        int(raw.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
    )
