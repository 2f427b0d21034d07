"""A small, real OpenAI-compatible Chat Completions server on loopback, for backend tests.

It replays only DOCUMENTED Chat Completions streaming shapes. Sources:
- OpenAI API reference, "Chat Completions > Streaming" and "The chat completion chunk object"
  (https://platform.openai.com/docs/api-reference/chat/streaming), and the guide
  https://developers.openai.com/api/docs/guides/streaming-responses linked from the type below;
- the `openai` package's own generated types in site-packages:
  `openai/types/chat/chat_completion_chunk.py` (`ChatCompletionChunk`, `Choice`, `ChoiceDelta`,
  `ChoiceDeltaToolCall`, `ChoiceDeltaToolCallFunction`), `openai/types/completion_usage.py`
  (`CompletionUsage`, `PromptTokensDetails`) and `openai/types/chat/chat_completion_stream_options_param.py`.

What those documents say, and what this server therefore sends:
- Server-sent events, one `data: <chunk JSON>` per event, the stream ending with `data: [DONE]`.
- Every chunk: `id` (same for all chunks), `object: "chat.completion.chunk"`, `created` (same for
  all), `model`, `choices`; `system_fingerprint` may be present.
- The first delta carries `role: "assistant"`; text arrives as `delta.content` pieces.
- A tool call arrives split: the first delta for a call has `index`, `id`, `type: "function"`,
  `function.name` and `function.arguments: ""`; later deltas carry only `index` and a piece of
  `function.arguments`.
- The last choice chunk has an empty `delta` and `finish_reason` (`stop`, `length`, `tool_calls`).
- With `stream_options: {"include_usage": true}`: "an additional chunk will be streamed before the
  `data: [DONE]` message. The `usage` field on this chunk shows the token usage statistics for the
  entire request, and the `choices` field will always be an empty array. All other chunks will also
  include a `usage` field, but with a null value."

`tests/test_shim_backend_openai_compatible.py` validates every chunk this module builds against
`openai.types.chat.ChatCompletionChunk` and reads a stream with the official client.

Faults, one per queued reply: HTTP 500, HTTP 429 (with an OpenAI-style error body), `cut` (the
HTTP response ends cleanly but the stream stops mid-response: no finish_reason, no `[DONE]`), and
`abort` (the TCP connection is dropped mid-body), and `malformed` (a `data:` line that is not JSON,
the one shape here that is deliberately NOT documented). Every request body is recorded.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "chat-test-model"
CREATED = 1_700_000_000
Fault = Literal["http_500", "http_429", "cut", "abort", "malformed"]


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    usage: bool = True,
    completion_id: str = "chatcmpl-test",
) -> dict[str, Any]:
    """One `chat.completion.chunk` with a single choice."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "system_fingerprint": "fp_test",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}],
    }
    if usage:
        body["usage"] = None
    return body


def usage_chunk(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, *, completion_id: str = "chatcmpl-test"
) -> dict[str, Any]:
    """The extra last chunk sent with `stream_options.include_usage`: empty `choices`, the usage."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "system_fingerprint": "fp_test",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
    }


@dataclass
class ToolCall:
    name: str
    argument_pieces: list[str]
    call_id: str


@dataclass
class Reply:
    """What the server answers to one request."""

    text: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: tuple[int, int, int] = (11, 7, 3)
    fault: Fault | None = None
    cut_after: int = 2
    """For `cut`, `abort` and `malformed`: how many chunks go out before the stream goes wrong."""
    retry_after: str = "1"
    """For `http_429`: the `retry-after` header (seconds)."""
    linger_s: float = 0.0
    """How long the body stays open after `data: [DONE]` (a server slow to end its chunked body)."""

    def chunks(self, include_usage: bool, top_logprobs: int | None = None) -> list[dict[str, Any]]:
        """`top_logprobs`: the request asked for logprobs (`logprobs: true`) with this many alternatives."""
        out = [chunk({"role": "assistant", "content": ""}, usage=include_usage)]
        for piece in self.text:
            out.append(chunk({"content": piece}, usage=include_usage))
            if top_logprobs is not None:
                out[-1]["choices"][0]["logprobs"] = {"content": [token_logprob(piece, top_logprobs)], "refusal": None}
        for index, call in enumerate(self.tool_calls):
            first = {
                "index": index,
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            out.append(chunk({"tool_calls": [first]}, usage=include_usage))
            out += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, usage=include_usage)
                for piece in call.argument_pieces
            ]
        finish = self.finish_reason or ("tool_calls" if self.tool_calls else "stop")
        out.append(chunk({}, finish_reason=finish, usage=include_usage))
        if include_usage:
            out.append(usage_chunk(*self.usage))
        return out


def token_logprob(token: str, top: int) -> dict[str, Any]:
    """A `ChatCompletionTokenLogprob` for one streamed piece: -0.25 for it, `top` alternatives, the token first."""
    alternatives = [(token, -0.25), ("else", -2.5), ("other", -3.5)]
    return {
        "token": token,
        "logprob": -0.25,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": p, "bytes": list(t.encode())} for t, p in alternatives[:top]],
    }


def text_reply(*pieces: str, finish_reason: str | None = None, usage: tuple[int, int, int] = (11, 7, 3)) -> Reply:
    return Reply(text=list(pieces), finish_reason=finish_reason, usage=usage)


def tool_call_reply(name: str, argument_pieces: Iterable[str], call_id: str = "call_test_1", text: str = "") -> Reply:
    return Reply(text=[text] if text else [], tool_calls=[ToolCall(name, list(argument_pieces), call_id)])


def fault_reply(
    fault: Fault,
    *,
    cut_after: int = 2,
    text: Iterable[str] = ("partial ", "answer ", "never "),
    retry_after: str = "1",
) -> Reply:
    return Reply(text=list(text), fault=fault, cut_after=cut_after, retry_after=retry_after)


DEFAULT_REPLY = text_reply("Hello", " from", " the", " chat", " server.")


class _Abort(Exception):
    """Raised inside a streaming body: uvicorn drops the connection mid-response."""


@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]
    raw: bytes
    peer: tuple[str, int] | None = None
    """The client's address: one per TCP connection, so a test can tell a reused connection from a new one."""


class ChatServer:
    """`POST /v1/chat/completions` and `GET /v1/models` on a free loopback port, in a thread.

    Queue replies with `enqueue`; a request with nothing queued gets `DEFAULT_REPLY`.
    """

    def __init__(self, models: Iterable[str] = (MODEL,)) -> None:
        self.models = list(models)
        self.received: list[Received] = []
        self._replies: list[Reply] = []
        self._lock = threading.Lock()
        self.port = _free_port()
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="chat-test-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.received]

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def start(self) -> ChatServer:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the chat test server died during start-up")
            threading.Event().wait(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_reply(self) -> Reply:
        with self._lock:
            return self._replies.pop(0) if self._replies else DEFAULT_REPLY

    async def _models(self, request: Request) -> Response:
        data = [{"id": name, "object": "model", "created": CREATED, "owned_by": "test"} for name in self.models]
        return JSONResponse({"object": "list", "data": data})

    async def _completions(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        peer = (request.client.host, request.client.port) if request.client else None
        self.received.append(Received(body, dict(request.headers), raw, peer))
        reply = self._next_reply()
        if reply.fault == "http_500":
            return JSONResponse(_error("The server had an error while processing your request.", "server_error"), 500)
        if reply.fault == "http_429":
            return JSONResponse(
                _error("Rate limit reached for requests.", "requests", code="rate_limit_exceeded"),
                429,
                headers={"retry-after": reply.retry_after},
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = reply.chunks(include_usage, (body.get("top_logprobs") or 0) if body.get("logprobs") else None)
        if not body.get("stream"):
            return JSONResponse(_non_streaming(chunks, reply))
        return StreamingResponse(self._sse(chunks, reply), media_type="text/event-stream")

    async def _sse(self, chunks: list[dict[str, Any]], reply: Reply) -> AsyncIterator[bytes]:
        for index, item in enumerate(chunks):
            if reply.fault in ("cut", "abort", "malformed") and index == reply.cut_after:
                if reply.fault == "malformed":
                    yield b"data: {this is not json\n\n"
                    continue
                await asyncio.sleep(0.01)  # let the bytes already written leave first
                if reply.fault == "abort":
                    raise _Abort("dropping the connection mid-response")
                return
            yield b"data: " + json.dumps(item).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
        if reply.linger_s:
            await asyncio.sleep(reply.linger_s)


def _error(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _non_streaming(chunks: list[dict[str, Any]], reply: Reply) -> dict[str, Any]:
    """The chat completion the same chunks add up to: text, tool calls, finish reason, usage."""
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finish = next(c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": "".join(call.argument_pieces)},
            }
            for call in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage_chunk(*reply.usage)["usage"],
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    return _free_port()
