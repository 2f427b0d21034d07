"""plugins.langchain.websocket_chat_completions: a stock `ChatOpenAI` on Chat Completions in a real `create_agent` agent."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from support.agent_tasks import TASKS, answered, lookup
from support.wire import API_KEY, MODEL

import ws_transport
from plugins.langchain import websocket_chat_completions
from server_shim import BackgroundServer

pytestmark = pytest.mark.timeout(60)

TOOLS = [tool(lookup)]


def model(server: BackgroundServer) -> ChatOpenAI:
    return websocket_chat_completions(ChatOpenAI(model=MODEL, base_url=server.base_url, api_key=API_KEY))


def test_a_sync_agent_chains_every_turn_after_the_first(
    server: BackgroundServer, recorder: Any, chain_report: Any
) -> None:
    chat = model(server)
    agent = create_agent(chat, TOOLS, system_prompt="Answer briefly.")
    messages: list[Any] = []
    outputs = []
    for task in TASKS:
        messages = agent.invoke({"messages": [*messages, {"role": "user", "content": task}]})["messages"]
        outputs.append(str(messages[-1].content))
    stats = ws_transport.session_of(chat.root_client).stats
    assert not chat.use_responses_api
    assert answered(outputs)
    assert (stats.turns, stats.chat_turns, stats.turns_chained, stats.fallbacks) == (6, 6, 5, 0)
    assert [len(call.items) for call in recorder.calls] == [2, 1, 1, 1, 1, 1]
    chain_report("LangChain ChatOpenAI (chat completions)", "langchain-openai", stats)


async def test_a_streamed_async_agent_chains_too(server: BackgroundServer, chain_report: Any) -> None:
    chat = model(server)
    agent = create_agent(chat, TOOLS, system_prompt="Answer briefly.")
    messages: list[Any] = []
    outputs = []
    for task in TASKS:
        async for state in agent.astream(
            {"messages": [*messages, {"role": "user", "content": task}]}, stream_mode="values"
        ):
            messages = state["messages"]
        outputs.append(str(messages[-1].content))
    stats = ws_transport.session_of(chat.root_async_client).stats
    assert answered(outputs)
    assert (stats.turns, stats.chat_turns, stats.turns_chained) == (6, 6, 5)
    chain_report("LangChain ChatOpenAI (chat completions, astream)", "langchain-openai", stats)


def test_another_model_on_the_same_base_url_stays_on_http(server: BackgroundServer) -> None:
    """langchain-openai shares one cached httpx client between models with the same base URL: wrapping
    it in place switched every such model to WebSocket (a benchmark's HTTP baseline rode the socket)."""
    chat = model(server)
    plain = ChatOpenAI(model=MODEL, base_url=server.base_url, api_key=API_KEY)
    plain.invoke("hello")
    chat.invoke("hello")
    with pytest.raises(ValueError, match="not wrapped"):
        ws_transport.session_of(plain.root_client)
    assert ws_transport.session_of(chat.root_client).stats.turns == 1
    assert server.shim.stats.websocket_connections == 1


def test_something_else_than_a_chat_openai_is_refused() -> None:
    with pytest.raises(TypeError, match="root_client"):
        websocket_chat_completions(object())
