"""The shim in front of a real inference server: llama-cpp-python's OpenAI-compatible server.

The server runs on loopback with a tiny random-weight model the suite writes itself
(`benchmarks/tiny_model.py`): its replies are gibberish, the same ~19 tokens for every prompt,
and end with a stop. Everything goes through the official `openai` SDK, over WebSocket
mode and over HTTP. These tests skip only where `llama_cpp` is not installed; `.ci/run`
installs it (the `llama` extra), so in CI they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI
from openai.types.responses import FunctionToolParam

from server_shim import BackgroundServer, Settings, create_app

pytestmark = pytest.mark.timeout(30)

MODEL = "tiny-llama"
WEATHER_TOOL: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
FINAL = ("response.completed", "response.incomplete", "response.failed")

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip(
        "llama-cpp-python is not installed: pip install -e '.[dev,llama]' (it compiles for ~5 minutes)",
        allow_module_level=True,
    )

from benchmarks.llama_server import LlamaServer  # noqa: E402
from benchmarks.tiny_model import write_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One llama.cpp server for the session; tests that kill a server start their own."""
    root = tmp_path_factory.mktemp("llama")
    with LlamaServer(write_tiny_model(root / "tiny.gguf"), root / "server.log") as server:
        yield server


@contextlib.contextmanager
def shim_for(llama: LlamaServer) -> Iterator[BackgroundServer]:
    """The shim with llama.cpp as its backend, on its own free loopback port."""
    settings = Settings(backend=llama.base_url, default_model=MODEL, drain_timeout_s=2.0)
    with BackgroundServer(create_app(settings), settings) as server:
        yield server


@pytest.fixture
def shim(llama: LlamaServer) -> Iterator[BackgroundServer]:
    with shim_for(llama) as server:
        yield server


@pytest.fixture
async def client(shim: BackgroundServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=shim.base_url, api_key="unused", max_retries=0) as client:
        yield client


async def turn(connection: Any, **create: Any) -> list[Any]:
    """Send one `response.create` and collect its events up to the final one (and a trailing error)."""
    await connection.response.create(model=MODEL, **create)
    events: list[Any] = []
    async with asyncio.timeout(20):
        while not events or events[-1].type not in FINAL:
            event = await connection.recv()
            assert event.type != "error" or events, f"refused: {event}"
            events.append(event)
        if events[-1].type == "response.failed":
            events.append(await connection.recv())
    return events


def chat_completion(llama: LlamaServer, **body: Any) -> dict[str, Any]:
    """The same prompt asked of llama.cpp directly, for comparison."""
    response = httpx2.post(f"{llama.base_url}/chat/completions", json={"model": MODEL, **body}, timeout=20)
    assert response.status_code == 200, response.text
    return response.json()


async def test_text_streams_through_the_shim_over_websocket(client: AsyncOpenAI) -> None:
    async with client.responses.connect() as connection:
        events = await turn(connection, input="Say something.", temperature=0)

    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert len(deltas) > 5
    assert final.output_text == "".join(deltas) != ""
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_usage_is_counted_by_the_shim_because_llama_cpp_streams_none(
    client: AsyncOpenAI, llama: LlamaServer
) -> None:
    direct = chat_completion(llama, messages=[{"role": "user", "content": "Count me."}], temperature=0)

    async with client.responses.connect() as connection:
        events = await turn(connection, input="Count me.", temperature=0)

    usage = events[-1].response.usage
    assert usage.output_tokens == direct["usage"]["completion_tokens"] > 0
    assert usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_llama_cpp_sends_no_usage_chunk_even_when_asked(llama: LlamaServer) -> None:
    """The fact the shim's own counting exists for: if a new version sends usage, the shim will use it."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx2.stream("POST", f"{llama.base_url}/chat/completions", json=body, timeout=20) as response:
        data = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]

    assert response.status_code == 200
    assert data[-1] == "[DONE]"
    assert not any(json.loads(chunk).get("usage") for chunk in data[:-1])


async def test_second_turn_chains_with_previous_response_id(client: AsyncOpenAI, shim: BackgroundServer) -> None:
    async with client.responses.connect() as connection:
        first = (await turn(connection, input="First question.", temperature=0, store=False))[-1].response
        second = (
            await turn(connection, input="Second question.", previous_response_id=first.id, temperature=0, store=False)
        )[-1].response

    assert second.status == "completed" and second.output_text
    assert second.previous_response_id == first.id
    assert shim.shim.stats.input_items_received == 2  # one new item per turn went over the socket
    # llama.cpp saw the whole history the second time: question, reply, question.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


async def test_named_tool_choice_returns_a_function_call_and_the_tool_output_continues(client: AsyncOpenAI) -> None:
    tool_choice = {"type": "function", "name": "get_weather"}
    async with client.responses.connect() as connection:
        events = await turn(connection, input="Weather?", tools=[WEATHER_TOOL], tool_choice=tool_choice)
        call = events[-1].response.output[0]
        follow_up = await turn(
            connection,
            previous_response_id=events[-1].response.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}],
            tools=[WEATHER_TOOL],
        )

    assert events[-1].type == "response.completed"
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    assert [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert events[-1].response.usage.output_tokens > 0
    # The history now holds an assistant message with tool_calls: llama.cpp takes it with content "".
    assert follow_up[-1].type == "response.completed"
    assert follow_up[-1].response.output_text


async def test_two_lanes_on_one_connection_both_finish(client: AsyncOpenAI, llama: LlamaServer) -> None:
    """`--interrupt_requests False`: a second request queues behind the first instead of cutting it off."""
    expected = chat_completion(llama, messages=[{"role": "user", "content": "lane"}], temperature=0)
    expected_text = expected["choices"][0]["message"]["content"]

    async with client.responses.connect() as connection:
        for lane in ("a", "b"):
            await connection.response.create(model=MODEL, input="lane", temperature=0, stream_id=lane)
        finished: dict[str, Any] = {}
        async with asyncio.timeout(20):
            while len(finished) < 2:
                event = await connection.recv()
                if event.type in FINAL:
                    finished[str(event.stream_id)] = event

    assert {lane: e.type for lane, e in finished.items()} == {"a": "response.completed", "b": "response.completed"}
    assert {e.response.output_text for e in finished.values()} == {expected_text}


async def test_http_create_streaming_and_not(client: AsyncOpenAI) -> None:
    response = await client.responses.create(model=MODEL, input="Over HTTP.", temperature=0)
    stream = await client.responses.create(model=MODEL, input="Over HTTP.", temperature=0, stream=True)
    events = [event async for event in stream]

    assert response.status == "completed" and response.output_text
    assert response.usage is not None and response.usage.output_tokens > 0
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text


async def test_http_named_tool_choice(client: AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=MODEL,
        input="Weather?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
    )

    (call,) = response.output
    assert call.type == "function_call" and json.loads(call.arguments)["city"] in ("Paris", "Rome")


async def test_shim_lists_the_llama_model(client: AsyncOpenAI) -> None:
    assert [model.id async for model in client.models.list()] == [MODEL]


async def test_killing_llama_mid_stream_fails_the_response_and_the_connection_stays_usable(
    tmp_path: Path,
) -> None:
    model = write_tiny_model(tmp_path / "endless.gguf", endless=True)  # replies run to the token limit
    dying = LlamaServer(model, tmp_path / "dying.log").start()
    try:
        with shim_for(dying) as shim:
            async with (
                AsyncOpenAI(base_url=shim.base_url, api_key="unused", max_retries=0) as client,
                client.responses.connect() as connection,
            ):
                await connection.response.create(model=MODEL, input="Go on.", max_output_tokens=1500)
                events: list[Any] = [await connection.recv()]
                async with asyncio.timeout(20):
                    while events[-1].type != "response.output_text.delta":
                        events.append(await connection.recv())
                    assert dying.process is not None
                    dying.process.send_signal(signal.SIGSTOP)  # freeze it mid-stream, then crash it
                    dying.kill()
                    while events[-1].type not in FINAL:
                        events.append(await connection.recv())
                    error = await connection.recv()

                # The same connection, a new server on the same port: the next turn completes.
                revived = LlamaServer(
                    write_tiny_model(tmp_path / "tiny.gguf"), tmp_path / "revived.log", port=dying.port
                )
                with revived:
                    after = await turn(connection, input="Again.", temperature=0)
    finally:
        dying.stop()

    failed = events[-1].response
    assert events[-1].type == "response.failed"
    assert failed.status == "failed" and failed.error is not None
    assert failed.output[0].status == "incomplete" and failed.output_text  # the part that arrived is kept
    assert error.type == "error" and error.error.code == "backend_error"
    assert after[-1].type == "response.completed" and after[-1].response.output_text


async def test_logprobs_from_llama_cpp_reach_the_deltas_and_the_output_text(client: AsyncOpenAI) -> None:
    """llama.cpp streams `logprobs.content` with `bytes: null`: the client gets the SDK's shape, bytes filled in."""
    async with client.responses.connect() as connection:
        events = await turn(connection, input="hi", include=["message.output_text.logprobs"], top_logprobs=2)
    assert events[-1].type == "response.completed"
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and all(len(d.logprobs) >= 1 for d in deltas)
    assert all(2 >= len(p.top_logprobs or []) >= 1 for d in deltas for p in d.logprobs)
    text = events[-1].response.output[0].content[0]
    assert "".join(p.token for p in text.logprobs) == text.text
    assert all(bytes(p.bytes) == p.token.encode() and p.logprob <= 0 for p in text.logprobs)
