"""plugins.agents_sdk: real OpenAI Agents SDK runs through a wrapped client against the real shim on loopback."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from agents import Agent, OpenAIProvider, RunConfig, Runner, function_tool
from openai import AsyncOpenAI
from support.wire import API_KEY, MODEL

from plugins.agents_sdk import WebSocketModelProvider, websocket_model, websocket_run_config
from server_shim import BackgroundServer

if TYPE_CHECKING:
    from conftest import RecordingValidator

pytestmark = pytest.mark.timeout(60)


@function_tool
def lookup(n: int) -> str:
    """Look up a record by number."""
    return f"record {n}: " + "x" * 200


@function_tool
def double(x: int) -> str:
    """Double a number."""
    return str(2 * x)


AGENT = Agent(name="clerk", instructions="Answer briefly.", tools=[lookup, double], model=MODEL)
STEPS = ['Find record 3.\ncall lookup {"n": 3}', 'Now double 21.\ncall double {"x": 21}']


async def run_task(run_config: RunConfig, *, streamed: bool = False) -> list[Any]:
    """Two runs, the second continuing the first's items; returns both final outputs."""
    history: list[Any] = []
    outputs = []
    for step in STEPS:
        items = [*history, {"role": "user", "content": step}]
        if streamed:
            result: Any = Runner.run_streamed(AGENT, items, run_config=run_config)
            async for _event in result.stream_events():
                pass
        else:
            result = await Runner.run(AGENT, items, run_config=run_config)
        outputs.append(result.final_output)
        history = result.to_input_list()
    return outputs


class ClosingProvider(OpenAIProvider):
    """The SDK's plain HTTP provider, closing its client with `aclose()`."""

    def __init__(self, client: AsyncOpenAI) -> None:
        super().__init__(openai_client=client, use_responses=True)
        self.client = client

    async def aclose(self) -> None:
        await super().aclose()
        await self.client.close()


def http_config(server: BackgroundServer) -> RunConfig:
    client = AsyncOpenAI(base_url=server.base_url, api_key=API_KEY)
    return RunConfig(model_provider=ClosingProvider(client), tracing_disabled=True)


def assert_only_new_items_after_first_turn(calls: list[Any]) -> None:
    assert len(calls) == 4
    assert calls[0].previous_id is None
    assert [[item["type"] for item in call.items] for call in calls[1:]] == [
        ["function_call_output"],
        ["message"],
        ["function_call_output"],
    ]
    assert all(call.previous_id for call in calls[1:])


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_agent_over_websocket_matches_http_sending_only_new_items(
    server: BackgroundServer, recorder: RecordingValidator, streamed: bool
) -> None:
    http = http_config(server)
    expected = await run_task(http, streamed=streamed)
    await http.model_provider.aclose()
    assert len(recorder.calls) == 4 and all(c.previous_id is None for c in recorder.calls)
    recorder.calls.clear()
    provider = WebSocketModelProvider(base_url=server.base_url, api_key=API_KEY)

    outputs = await run_task(websocket_run_config(provider, tracing_disabled=True), streamed=streamed)

    assert outputs == expected
    assert outputs[1].startswith("Tool call_sim_")
    assert server.shim.stats.websocket_connections == 1
    assert_only_new_items_after_first_turn(recorder.calls)
    stats = provider.session.stats
    assert (stats.turns, stats.turns_chained, stats.fallbacks) == (4, 3, 0)
    assert stats.bytes_sent < stats.bytes_http_equivalent
    await provider.aclose()


async def test_one_agent_with_a_websocket_model(server: BackgroundServer, recorder: RecordingValidator) -> None:
    client = AsyncOpenAI(base_url=server.base_url, api_key=API_KEY)
    agent = AGENT.clone(model=websocket_model(MODEL, client))

    result = await Runner.run(agent, STEPS[0], run_config=RunConfig(tracing_disabled=True))

    assert result.final_output.startswith("Tool call_sim_")
    assert server.shim.stats.websocket_connections == 1
    assert [[item["type"] for item in call.items] for call in recorder.calls] == [["message"], ["function_call_output"]]
    await client.close()


async def test_parallel_runs_share_one_socket_and_keep_their_chains(
    server: BackgroundServer, recorder: RecordingValidator
) -> None:
    provider = WebSocketModelProvider(base_url=server.base_url, api_key=API_KEY)
    run_config = websocket_run_config(provider, tracing_disabled=True)

    first, second = await asyncio.gather(
        Runner.run(AGENT, 'Find record 1.\ncall lookup {"n": 1}', run_config=run_config),
        Runner.run(AGENT, 'Double 5.\ncall double {"x": 5}', run_config=run_config),
    )

    assert "record 1:" in first.final_output
    assert "returned: 10" in second.final_output
    assert server.shim.stats.websocket_connections == 1
    chained = [call for call in recorder.calls if call.previous_id]
    assert len(chained) == 2
    outputs = {call.previous_id: call.items[0]["output"] for call in chained}
    for result in (first, second):
        first_response = result.raw_responses[0].response_id
        assert outputs[first_response] in result.final_output
    await provider.aclose()
