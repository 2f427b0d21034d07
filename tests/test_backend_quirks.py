"""How the Chat Completions backend copes with what real servers do differently (no server needed).

The chunk shapes are the ones llama-cpp-python 0.3.36 sends (seen in `test_llama_backend.py`),
and the documented OpenAI ones; one test uses an `httpx2.MockTransport` in place of a server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from server_shim.backends import BackendRequest, Finish, OpenAICompatibleBackend, TextDelta, ToolCallDelta, Usage
from server_shim.backends.openai_compatible import _parse_stream
from server_shim.errors import BackendError
from server_shim.history import History

INPUT_ESTIMATE = 5
"""The input token estimate the backend computed from its rendered prompt, used when a server sends no usage."""


def request() -> BackendRequest:
    return BackendRequest(model="m", history=History().extend([{"type": "message", "content": "hi", "role": "user"}]))


async def lines(*chunks: dict[str, Any] | str) -> AsyncIterator[str]:
    for chunk in chunks:
        yield f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}"
        yield ""


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def finish(reason: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


async def parse(*chunks: dict[str, Any] | str) -> list[Any]:
    return [d async for d in _parse_stream(lines(*chunks), INPUT_ESTIMATE)]


async def test_without_a_usage_chunk_each_token_chunk_counts_as_one_output_token() -> None:
    # llama.cpp: a role-only opening chunk, then one chunk per token; "" is a token that ends mid-character.
    deltas = await parse(
        delta(role="assistant"), delta(content="a"), delta(content=""), delta(content="é"), finish("stop"), "[DONE]"
    )

    usage = next(d for d in deltas if isinstance(d, Usage))
    assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["a", "é"]
    assert usage.output_tokens == 3 and usage.input_tokens == INPUT_ESTIMATE


async def test_an_opening_role_chunk_with_empty_content_is_no_token_but_one_with_content_is() -> None:
    openai_style = await parse(delta(role="assistant", content=""), delta(content="x"), finish("stop"), "[DONE]")
    ollama_style = await parse(delta(role="assistant", content="x"), delta(role="assistant", content="y"), "[DONE]")

    assert [d.output_tokens for d in openai_style if isinstance(d, Usage)] == [1]
    assert [d.output_tokens for d in ollama_style if isinstance(d, Usage)] == [2]


async def test_a_usage_chunk_wins_over_counting() -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}
    deltas = await parse(delta(content="x"), finish("stop"), {"choices": [], "usage": usage}, "[DONE]")

    assert Usage(11, 7, 3) in deltas


async def test_a_forced_call_that_finishes_with_stop_is_reported_as_tool_calls() -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    deltas = await parse(delta(tool_calls=[call]), finish("stop"), "[DONE]")

    assert deltas[0] == ToolCallDelta(0, "{}", "call_1", "f")
    assert deltas[-1] == Finish("tool_calls")


async def test_a_malformed_chunk_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="malformed"):
        await parse(delta(content="x"), "{not json")


async def test_a_stream_that_stops_without_finishing_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="before the response finished"):
        await parse(delta(content="x"))


async def test_a_server_that_refuses_stream_options_is_asked_again_without_it_and_never_again() -> None:
    bodies: list[dict[str, Any]] = []

    def handle(http_request: httpx2.Request) -> httpx2.Response:
        body = json.loads(http_request.content)
        bodies.append(body)
        if "stream_options" in body:
            return httpx2.Response(422, json={"detail": "extra field not permitted: stream_options"})
        sse = f"data: {json.dumps(delta(content='ok'))}\n\ndata: {json.dumps(finish('stop'))}\n\ndata: [DONE]\n\n"
        return httpx2.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})

    backend = OpenAICompatibleBackend("http://backend.invalid/v1")
    backend._client = httpx2.AsyncClient(base_url=backend.base_url, transport=httpx2.MockTransport(handle))
    try:
        first = [d async for d in backend.stream(request())]
        second = [d async for d in backend.stream(request())]
    finally:
        await backend.aclose()

    assert TextDelta("ok") in first and TextDelta("ok") in second
    assert ["stream_options" in body for body in bodies] == [True, False, False]
    assert all(body["stream"] is True for body in bodies)
