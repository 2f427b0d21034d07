"""The Cerebras backend against recorded-shape cassettes (the API cannot be reached from here).

The cassettes in `cassettes/` follow Cerebras' documented stream, usage, rate-limit header
and error shapes (see each file's header). vcrpy replays them; no request leaves the machine.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.cassettes import replay

from server_shim.backends import BackendRequest, Finish, TextDelta, ToolCallDelta, Usage
from server_shim.backends.cerebras import CerebrasBackend
from server_shim.errors import BackendError
from server_shim.history import History


def request(**fields: Any) -> BackendRequest:
    history = History().extend([{"type": "message", "role": "user", "content": "Say hello"}])
    return BackendRequest(model="llama-3.3-70b", history=history, **fields)


async def collect(backend: CerebrasBackend, req: BackendRequest) -> list[Any]:
    try:
        return [delta async for delta in backend.stream(req)]
    finally:
        await backend.aclose()


async def test_text_stream_with_usage_from_the_final_chunk_and_rate_limit_headers_read():
    backend = CerebrasBackend(api_key="test-key")
    with replay("cerebras_text.yaml"):
        deltas = await collect(backend, request())
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == "Hello from Cerebras"
    assert [d for d in deltas if isinstance(d, Usage)] == [Usage(22, 3, 0)]
    assert deltas[-1] == Finish("stop")
    assert backend.rate_limit.remaining_tokens == 59000
    assert not backend.rate_limit.exhausted()


async def test_refused_parameters_are_dropped_and_tool_choice_limited_to_auto_or_none():
    backend = CerebrasBackend(api_key="test-key")
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
    sent: list[dict[str, Any]] = []
    with replay("cerebras_tool_call.yaml", sent):
        deltas = await collect(
            backend,
            request(
                tools=tools,
                tool_choice="required",
                options={"parallel_tool_calls": False, "temperature": 0.2, "frequency_penalty": 0.5},
            ),
        )
    body = sent[-1]
    assert "parallel_tool_calls" not in body and "frequency_penalty" not in body
    assert body["temperature"] == 0.2
    assert body["tool_choice"] == "auto"
    assert body["stream_options"] == {"include_usage": True}
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert calls[0].call_id == "call_8f2c1d" and calls[0].name == "lookup"
    assert "".join(c.arguments for c in calls) == '{"n": 7}'
    assert [d for d in deltas if isinstance(d, Usage)] == [Usage(80, 9, 64)]
    assert deltas[-1] == Finish("tool_calls")


async def test_answer_near_the_token_limit_marks_the_deployment_exhausted_before_a_429():
    backend = CerebrasBackend(api_key="test-key", rate_limit_reserve_tokens=2048)
    with replay("cerebras_near_limit.yaml"):
        await collect(backend, request())
    assert backend.rate_limit.remaining_tokens == 900
    assert backend.rate_limit.exhausted()


async def test_429_is_a_retryable_error_carrying_its_retry_delay():
    backend = CerebrasBackend(api_key="test-key")
    with replay("cerebras_429.yaml"), pytest.raises(BackendError) as caught:
        await collect(backend, request())
    assert caught.value.status == 429
    assert caught.value.retry_after_s == 2.0
    assert caught.value.retryable
    assert "Tokens per minute limit exceeded" in str(caught.value)
    assert caught.value.api_error().code == "rate_limit_exceeded"


async def test_500_is_a_retryable_backend_error():
    backend = CerebrasBackend(api_key="test-key")
    with replay("cerebras_500.yaml"), pytest.raises(BackendError) as caught:
        await collect(backend, request())
    assert caught.value.status == 500 and caught.value.retryable
    assert caught.value.api_error().status == 502
