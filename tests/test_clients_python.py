"""Python agent frameworks, unmodified, over their own Responses WebSocket support against the shim.

- the OpenAI Agents SDK's own WebSocket model (`responses_websocket_session`), with a function
  tool, the hosted web search tool (dropped by the shim, listed in metadata), a custom tool and
  a handoff;
- pydantic-ai's WebSocket transport (`openai_transport='websocket'`), with its native web search
  tool and structured output (`NativeOutput`, i.e. `text.format` json_schema).
"""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, CustomTool, WebSearchTool, function_tool, responses_websocket_session, set_tracing_disabled
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import NativeOutput
from pydantic_ai import WebSearchTool as PydanticWebSearch
from pydantic_ai.capabilities import NativeTool
from pydantic_ai.models.openai import OpenAIResponsesModel, OpenAIResponsesModelSettings
from pydantic_ai.providers.openai import OpenAIProvider
from support.wire import API_KEY, MODEL

pytestmark = pytest.mark.timeout(60)


@function_tool
def lookup(n: int) -> str:
    """Look up a record by number."""
    return f"record {n}"


@pytest.fixture
def no_agents_tracing():
    """The session's run config is the SDK's own: tracing (to OpenAI, no key here) is turned off globally."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


async def test_agents_sdk_websocket_model_with_function_hosted_custom_tools_and_a_handoff(
    server, recorder, no_agents_tracing
):
    patches: list[str] = []

    async def apply_patch(_context: Any, text: str) -> str:
        patches.append(text)
        return "patch applied"

    patch = CustomTool(name="apply_patch", description="Apply a patch to the workspace.", on_invoke_tool=apply_patch)
    helper = Agent(name="helper", instructions="Help.", tools=[lookup, WebSearchTool(), patch], model=MODEL)
    triage = Agent(name="triage", instructions="Route to the helper.", handoffs=[helper], model=MODEL)

    async with responses_websocket_session(api_key=API_KEY, base_url=server.base_url) as session:
        routed = await session.run(triage, "call transfer_to_helper {}")
        assert routed.last_agent is helper
        looked_up = await session.run(helper, [*routed.to_input_list(), _user('call lookup {"n": 3}')])
        assert "record 3" in looked_up.final_output
        patched = await session.run(helper, [*looked_up.to_input_list(), _user("custom apply_patch *** Begin Patch")])
        assert patches == ["*** Begin Patch"] and "patch applied" in patched.final_output

    assert server.shim.stats.websocket_connections >= 1
    helper_turns = [call for call in recorder.calls if call.request.instructions == "Help."]
    assert helper_turns
    tool_types = {tool["type"] for call in helper_turns for tool in call.request.tools or []}
    assert {"function", "web_search", "custom"} <= tool_types, tool_types


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


class Weather(BaseModel):
    city: str
    degrees: int


async def test_pydantic_ai_websocket_transport_with_web_search_and_structured_output(server, recorder):
    model = OpenAIResponsesModel(MODEL, provider=OpenAIProvider(base_url=server.base_url, api_key=API_KEY))
    settings = OpenAIResponsesModelSettings(openai_transport="websocket")
    agent = PydanticAgent(model, capabilities=[NativeTool(PydanticWebSearch())], model_settings=settings)

    @agent.tool_plain
    def lookup(n: int) -> str:
        """Look up a record by number."""
        return f"record {n}"

    async with agent:
        first = await agent.run('call lookup {"n": 4}')
        assert "record 4" in first.output
        second = await agent.run(
            "and the weather?", message_history=first.all_messages(), output_type=NativeOutput(Weather)
        )
        assert second.output == Weather(city="simulated", degrees=1)

    assert server.shim.stats.websocket_connections >= 1
    structured = recorder.last.request
    assert structured.text and structured.text["format"]["type"] == "json_schema"
    assert any(tool["type"] == "web_search" for tool in structured.tools or [])
    assert any(call.previous_id is not None for call in recorder.calls), "pydantic-ai chains over its socket"
