"""The simulated backend served as an OpenAI-compatible Chat Completions server (loopback only).

The shim has no such server of its own; the peer benchmark needs one so that LiteLLM, the shim
and a direct client all sit in front of the same backend. It streams `chat.completion.chunk`
shapes (`data: {...}` lines, then `data: [DONE]`), answers non-streaming requests with one
`chat.completion`, lists `/v1/models`, and keeps a short log of what each request carried
(`GET /stats`: message count and body bytes), so a benchmark can check that a proxy really
forwarded the whole history.

    python -m benchmarks.chat_server --port 8000 [--tokens-per-s 0] [--ttft-s 0]
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from chat_mapping import messages_to_items
from server_shim.backends import BackendRequest, Finish, SimulatedBackend, TextDelta, ToolCallDelta, Usage
from server_shim.history import History
from ws_transport.chat_completions import translate_call

MODEL = "simulated-1"


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}, status)


def backend_request(body: dict[str, Any]) -> BackendRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty array")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    limits = ("max_tokens", "max_completion_tokens")  # any size here; the Responses minimum does not apply
    call = translate_call({k: v for k, v in body.items() if k not in limits})  # the tools as Responses tools
    return BackendRequest(
        model=str(body.get("model") or MODEL),
        history=History().extend(messages_to_items(messages)),
        tools=call.fields.get("tools"),
        tool_choice=call.fields.get("tool_choice"),
        max_output_tokens=int(max_tokens) if max_tokens else None,
    )


def create_chat_app(backend: Any | None = None, *, log_size: int = 1000) -> Starlette:
    backend = backend or SimulatedBackend()
    log: deque[dict[str, int]] = deque(maxlen=log_size)
    counter = {"requests": 0}

    async def chat_completions(request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
            breq = backend_request(body)
        except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
            return _error(400, f"bad request: {exc}")
        counter["requests"] += 1
        log.append({"n": counter["requests"], "messages": len(body["messages"]), "bytes": len(raw)})
        chunk_id = f"chatcmpl-sim{counter['requests']}"
        created = int(time.time())
        model = breq.model
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                _chunks(backend, breq, chunk_id, created, model, include_usage), media_type="text/event-stream"
            )
        return _json(await _completion(backend, breq, chunk_id, created, model))

    async def models(request: Request) -> Response:
        names = await backend.models()
        return _json(
            {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "sim"} for n in names]}
        )

    async def stats(request: Request) -> Response:
        return _json({"requests": counter["requests"], "log": list(log)})

    async def health(request: Request) -> Response:
        return _json({"status": "ok"})

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)


def _chunk(
    chunk_id: str, created: int, model: str, delta: dict | None, finish: str | None = None, **extra: Any
) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    body = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
    body.update(extra)
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


async def _chunks(
    backend: Any, breq: BackendRequest, chunk_id: str, created: int, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    yield _chunk(chunk_id, created, model, {"role": "assistant", "content": ""})
    usage: Usage | None = None
    finish = "stop"
    async for delta in backend.stream(breq):
        if isinstance(delta, TextDelta):
            yield _chunk(chunk_id, created, model, {"content": delta.text})
        elif isinstance(delta, ToolCallDelta):
            call: dict[str, Any] = {"index": delta.index, "function": {"arguments": delta.arguments}}
            if delta.call_id is not None:
                call["id"] = delta.call_id
                call["type"] = "function"
                call["function"]["name"] = delta.name
            yield _chunk(chunk_id, created, model, {"tool_calls": [call]})
        elif isinstance(delta, Usage):
            usage = delta
        elif isinstance(delta, Finish):
            finish = delta.reason
    yield _chunk(chunk_id, created, model, {}, finish)
    if include_usage and usage is not None:
        yield _chunk(chunk_id, created, model, None, usage=_usage(usage))
    yield b"data: [DONE]\n\n"


async def _completion(backend: Any, breq: BackendRequest, chunk_id: str, created: int, model: str) -> dict[str, Any]:
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage: Usage | None = None
    finish = "stop"
    async for delta in backend.stream(breq):
        if isinstance(delta, TextDelta):
            text.append(delta.text)
        elif isinstance(delta, ToolCallDelta):
            call = calls.setdefault(
                delta.index,
                {"id": delta.call_id, "type": "function", "function": {"name": delta.name, "arguments": ""}},
            )
            call["function"]["arguments"] += delta.arguments
        elif isinstance(delta, Usage):
            usage = delta
        elif isinstance(delta, Finish):
            finish = delta.reason
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    body: dict[str, Any] = {
        "id": chunk_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = _usage(usage)
    return body


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tokens-per-s", type=float, default=0.0)
    parser.add_argument("--ttft-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    app = create_chat_app(SimulatedBackend(ttft_s=args.ttft_s, tokens_per_s=args.tokens_per_s, model=MODEL))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
