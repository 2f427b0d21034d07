"""What a Chat Completions backend gets for the whole Responses request surface, and what comes back.

Driven by the official SDK against the shim in front of the test chat server
(`tests/support/chat_server.py`), which records every request body it receives.
"""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import BaseModel, TypeAdapter
from support.chat_server import text_reply, tool_call_reply
from support.wire import AGENTS_TOOL, API_KEY, PATCH_TOOL

from server_shim.config import DeploymentConfig, ShimConfig
from server_shim.tools import DROPPED_METADATA_KEY

MODEL = "chat-model"
CHAT_TOOL = TypeAdapter(ChatCompletionFunctionToolParam)


@pytest.fixture
async def sdk(make_server, chat_server):
    config = ShimConfig(
        deployments=[
            DeploymentConfig(name="chat", kind="openai_compatible", base_url=chat_server.base_url, models={"*": "*"})
        ]
    )
    server = make_server(config=config)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as client:
        yield client


class Answer(BaseModel):
    value: int


async def test_request_fields_reach_the_chat_backend_in_its_own_form(sdk, chat_server):
    chat_server.enqueue(text_reply('{"value": 3}'))
    parsed = await sdk.responses.parse(
        model=MODEL,
        input="what is it?",
        text_format=Answer,
        reasoning={"effort": "low", "summary": "auto"},
        top_logprobs=3,
        prompt_cache_key="conv-7",
        safety_identifier="user-hash",
        user="u-1",
        temperature=0.2,
    )
    assert parsed.output_parsed == Answer(value=3)
    (body,) = chat_server.bodies
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["name"] == "Answer"
    assert body["response_format"]["json_schema"]["schema"]["properties"] == {
        "value": {"title": "Value", "type": "integer"}
    }
    assert body["reasoning_effort"] == "low"
    assert body["logprobs"] is True and body["top_logprobs"] == 3
    assert (body["prompt_cache_key"], body["safety_identifier"], body["user"]) == ("conv-7", "user-hash", "u-1")
    assert body["temperature"] == 0.2
    assert "reasoning" not in body and "text" not in body and "include" not in body


async def test_namespace_custom_and_hosted_tools_are_converted_and_calls_mapped_back(sdk, chat_server):
    chat_server.enqueue(
        tool_call_reply("apply_patch", [json.dumps({"input": "*** Begin Patch"})], call_id="call_p"),
    )
    tools = [AGENTS_TOOL, PATCH_TOOL, {"type": "web_search"}]
    response = await sdk.responses.create(model=MODEL, input="patch it", tools=tools, max_tool_calls=5)
    body = chat_server.bodies[-1]
    for tool in body["tools"]:
        CHAT_TOOL.validate_python(tool)
    assert [t["function"]["name"] for t in body["tools"]] == [
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__note",
        "apply_patch",
    ]
    (call,) = response.output
    assert (call.type, call.name, call.input, call.call_id) == (
        "custom_tool_call",
        "apply_patch",
        "*** Begin Patch",
        "call_p",
    )
    assert response.metadata[DROPPED_METADATA_KEY] == "web_search"

    chat_server.enqueue(tool_call_reply("multi_agent_v1__spawn_agent", ['{"task": "x"}'], call_id="call_s"))
    output = {"type": "custom_tool_call_output", "call_id": "call_p", "output": "patched"}
    second = await sdk.responses.create(model=MODEL, input=[output], tools=tools, previous_response_id=response.id)
    messages = chat_server.bodies[-1]["messages"]
    assert messages[-2]["tool_calls"][0]["function"] == {
        "name": "apply_patch",
        "arguments": '{"input":"*** Begin Patch"}',
    }
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_p", "content": "patched"}
    (spawn,) = second.output
    assert (spawn.type, spawn.name, spawn.namespace) == ("function_call", "spawn_agent", "multi_agent_v1")


def two_calls():
    reply = tool_call_reply("lookup", ["{}"], call_id="call_1")
    reply.tool_calls.append(type(reply.tool_calls[0])("lookup", ["{}"], "call_2"))
    return reply


async def test_max_tool_calls_is_enforced_whatever_the_backend_returns(sdk, chat_server):
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    chat_server.enqueue(two_calls(), two_calls())
    unlimited = await sdk.responses.create(model=MODEL, input="two", tools=[lookup])
    assert [item.call_id for item in unlimited.output] == ["call_1", "call_2"]
    limited = await sdk.responses.create(model=MODEL, input="two", tools=[lookup], max_tool_calls=1)
    assert [item.call_id for item in limited.output] == ["call_1"]
