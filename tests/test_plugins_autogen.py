"""plugins.autogen: a real AutoGen `AssistantAgent` with a tool, its model calls over one WebSocket session."""

from __future__ import annotations

from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient
from support.agent_tasks import TASKS, answered, lookup
from support.wire import API_KEY, MODEL

from plugins.autogen import session_of, websocket_model_client
from server_shim import BackgroundServer

pytestmark = pytest.mark.timeout(60)

INFO = ModelInfo(vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False)


def model_client(server: BackgroundServer) -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(model=MODEL, base_url=server.base_url, api_key=API_KEY, model_info=INFO)


@pytest.mark.parametrize("streaming", [False, True], ids=["create", "create_stream"])
async def test_an_assistant_agent_with_a_tool_chains_every_turn_after_the_first(
    server: BackgroundServer, recorder: Any, chain_report: Any, streaming: bool
) -> None:
    client = websocket_model_client(model_client(server))
    agent = AssistantAgent(
        "clerk",
        model_client=client,
        tools=[lookup],
        reflect_on_tool_use=True,  # a second call, without tools, to answer from the tool result
        system_message="Answer briefly.",
        model_client_stream=streaming,
    )
    outputs = []
    for task in TASKS:
        result = await agent.run(task=task)
        outputs.append(str(result.messages[-1].content))
    stats = session_of(client).stats
    await client.close()

    assert answered(outputs)
    assert (stats.turns, stats.chat_turns, stats.turns_chained, stats.fallbacks) == (6, 6, 5, 0)
    assert stats.chat_fallbacks == {}
    assert [len(call.items) for call in recorder.calls] == [2, 1, 1, 1, 1, 1]  # the server saw only new messages
    chain_report("AutoGen (autogen-ext)", "autogen-ext", stats)


def test_only_an_autogen_openai_client_is_accepted() -> None:
    with pytest.raises(TypeError, match="AutoGen OpenAI chat completion client"):
        websocket_model_client(object())
