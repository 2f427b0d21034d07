"""pydantic-ai over `ws_transport.wrap()`: real agents with a tool, on the Responses and the Chat Completions model.

pydantic-ai rebuilds its history on every request (calls without ids, arguments re-serialized,
answers as plain strings); before the fix in `chaining.meaning` a wrapped client chained 0 of 8
turns. Its own `openai_transport="websocket"` setting (OpenAIResponsesModel) is the alternative
against api.openai.com; `wrap()` adds chaining with `store=False`, lanes and any backend.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from support.agent_tasks import TASKS, answered, lookup
from support.wire import API_KEY, MODEL

import ws_transport
from server_shim import BackgroundServer

pytestmark = pytest.mark.timeout(60)


async def run_tasks(model: Any) -> list[str]:
    """The tasks one after another on one conversation, as a chat app runs an agent."""
    agent = Agent(model, instructions="Answer briefly.")
    agent.tool_plain(lookup)
    history = None
    outputs = []
    for task in TASKS:
        result = await agent.run(task, message_history=history)
        history = result.all_messages()
        outputs.append(result.output)
    return outputs


async def test_the_responses_model_gives_the_same_answers_and_chains_every_turn_after_the_first(
    server: BackgroundServer, recorder: Any, chain_report: Any
) -> None:
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as plain:
        over_http = await run_tasks(OpenAIResponsesModel(MODEL, provider=OpenAIProvider(openai_client=plain)))
    recorder.calls.clear()
    async with ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key=API_KEY)) as client:
        over_ws = await run_tasks(OpenAIResponsesModel(MODEL, provider=OpenAIProvider(openai_client=client)))
        stats = ws_transport.session_of(client).stats
    assert answered(over_ws)
    assert over_ws == over_http
    assert (stats.turns, stats.turns_chained, stats.fallbacks) == (6, 5, 0)
    assert [len(call.items) for call in recorder.calls] == [1, 1, 1, 1, 1, 1]
    chain_report("pydantic-ai OpenAIResponsesModel", "pydantic-ai-slim", stats)


async def test_the_chat_model_rides_the_session_with_chat_completions(
    server: BackgroundServer, recorder: Any, chain_report: Any
) -> None:
    client = ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key=API_KEY), chat_completions=True)
    async with client:
        outputs = await run_tasks(OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client)))
        stats = ws_transport.session_of(client).stats
    assert answered(outputs)
    assert (stats.turns, stats.chat_turns, stats.turns_chained, stats.fallbacks) == (6, 6, 5, 0)
    assert stats.chat_fallbacks == {}
    assert [len(call.items) for call in recorder.calls] == [2, 1, 1, 1, 1, 1]  # system + task, then one at a time
    chain_report("pydantic-ai OpenAIChatModel", "pydantic-ai-slim", stats)
