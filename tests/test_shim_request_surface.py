"""The whole Responses request surface through the official SDK: tools, items, echoed fields, structured output."""

from __future__ import annotations

import json

import openai
import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response
from pydantic import BaseModel
from support.wire import (
    AGENTS_TOOL,
    API_KEY,
    MODEL,
    PATCH_TOOL,
    RESPONSE,
    completed_ok,
    recv_event,
    run_turn,
    send_raw,
    user,
)

from server_shim.config import ShimConfig
from server_shim.events import ECHOED_FIELDS
from server_shim.tools import DROPPED_METADATA_KEY

PATCH = PATCH_TOOL
AGENTS = AGENTS_TOOL
CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}},
    AGENTS,
    PATCH,
    {"type": "web_search", "external_web_access": False},
    {"type": "tool_search", "execution": "client", "description": "find tools", "parameters": {"type": "object"}},
]
PATCH_TEXT = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch"


async def test_codex_tools_are_accepted_and_a_custom_call_round_trips_over_websocket(client, server):
    async with client.responses.connect() as conn:
        first = await run_turn(conn, input=f"custom apply_patch {PATCH_TEXT}", tools=CODEX_TOOLS, store=False)
        completed_ok(first)
        (call,) = first.response["output"]
        assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
        assert call["input"] == PATCH_TEXT
        assert "response.custom_tool_call_input.done" in first.types
        assert first.response["metadata"][DROPPED_METADATA_KEY] == "web_search,tool_search"
        assert first.response["tools"] == CODEX_TOOLS

        output = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done!"}
        second = await run_turn(conn, input=[output], tools=CODEX_TOOLS, previous_response_id=first.id, store=False)
        completed_ok(second)
        assert "Done!" in second.text


async def test_a_namespaced_call_carries_the_members_name_and_namespace(client, server):
    async with client.responses.connect() as conn:
        turn = await run_turn(
            conn, input='call multi_agent_v1__spawn_agent {"task": "x"}', tools=CODEX_TOOLS, store=False
        )
    (call,) = turn.response["output"]
    assert (call["type"], call["name"], call["namespace"]) == ("function_call", "spawn_agent", "multi_agent_v1")
    assert json.loads(call["arguments"]) == {"task": "x"}


async def test_forcing_a_custom_or_namespaced_tool_calls_it(client, server):
    forced = await client.responses.create(
        model=MODEL, input="go", tools=CODEX_TOOLS, tool_choice={"type": "custom", "name": "apply_patch"}
    )
    assert forced.output[0].type == "custom_tool_call" and forced.output[0].name == "apply_patch"
    allowed = await client.responses.create(
        model=MODEL,
        input="go",
        tools=CODEX_TOOLS,
        tool_choice={
            "type": "allowed_tools",
            "mode": "required",
            "tools": [{"type": "namespace", "name": "multi_agent_v1"}],
        },
    )
    assert allowed.output[0].type == "function_call" and allowed.output[0].namespace == "multi_agent_v1"
    assert allowed.tool_choice.type == "allowed_tools"


NON_DEFAULTS = {
    "instructions": "Be brief.",
    "max_output_tokens": 5,
    "max_tool_calls": 3,
    "metadata": {"team": "a"},
    "parallel_tool_calls": False,
    "prompt_cache_key": "conv-1",
    "prompt_cache_retention": "24h",
    "reasoning": {"effort": "low", "summary": "auto"},
    "safety_identifier": "user-hash",
    "service_tier": "flex",
    "temperature": 0.5,
    "text": {"format": {"type": "text"}, "verbosity": "low"},
    "tool_choice": "none",
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}, "strict": True}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "truncation": "auto",
    "user": "u-1",
}


async def test_the_response_echoes_every_request_field_the_sdk_response_carries(client, server):
    response = await client.responses.create(model=MODEL, input="hi", **NON_DEFAULTS)
    echoed = response.model_dump(exclude_none=True)
    for name, value in NON_DEFAULTS.items():
        assert name in ECHOED_FIELDS, name
        if name == "tools":
            assert echoed["tools"][0]["name"] == "f" and echoed["tools"][0]["strict"] is True
        else:
            assert echoed[name] == value, name
    unset = set(ECHOED_FIELDS) - set(NON_DEFAULTS) - {"model", "previous_response_id", "background", "store"}
    assert unset <= {"access_programs", "conversation", "image", "moderation", "prompt", "prompt_cache_options"}, unset


async def test_defaults_are_the_apis_defaults_and_parse_strictly(client, server):
    raw = (await client.responses.with_raw_response.create(model=MODEL, input="hi")).http_response.json()
    RESPONSE.validate_python(raw)
    assert Response.model_validate(raw).truncation == "disabled"
    assert raw["reasoning"] == {"effort": None, "summary": None}
    assert raw["service_tier"] == "default" and raw["top_logprobs"] == 0
    assert raw["text"] == {"format": {"type": "text"}, "verbosity": "medium"}


class Weather(BaseModel):
    city: str
    degrees: int
    sunny: bool


async def test_structured_output_parses_into_the_clients_model(client, server):
    parsed = await client.responses.parse(model=MODEL, input="weather?", text_format=Weather)
    assert parsed.output_parsed == Weather(city="simulated", degrees=1, sunny=True)
    assert parsed.text.format.type == "json_schema"


async def test_every_item_type_a_client_replays_is_accepted_and_the_chain_continues(client, server):
    async with client.responses.connect() as conn:
        history = [
            user("hi"),
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "q"},
            },
            {"type": "compaction", "encrypted_content": "opaque"},
            {"type": "custom_tool_call", "call_id": "ct_1", "name": "apply_patch", "input": PATCH_TEXT},
            {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "patched"},
        ]
        first = await run_turn(conn, input=history, tools=[PATCH], store=False)
        completed_ok(first)
        assert "patched" in first.text
        second = await run_turn(conn, input=[user("more")], previous_response_id=first.id, store=False)
        completed_ok(second)


def _config(hosted_tools: str | None) -> ShimConfig:
    deployment = {"name": "sim", "kind": "simulated", "models": {MODEL: MODEL}}
    if hosted_tools is not None:
        deployment["hosted_tools"] = hosted_tools
    return ShimConfig.model_validate({"deployments": [deployment]})


async def test_a_deployment_that_refuses_hosted_tools_answers_unsupported_tool_and_the_chain_continues(make_server):
    server = make_server(config=_config("refuse"))
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model=MODEL, input="hi", tools=CODEX_TOOLS)
        assert (refused.value.code, refused.value.param) == ("unsupported_tool", "tools[3].type")
        async with sdk.responses.connect() as conn:
            first = await run_turn(conn, input="hi", store=False)
            await conn.response.create(model=MODEL, input="x", tools=CODEX_TOOLS, previous_response_id=first.id)
            error = await recv_event(conn)
            assert error["type"] == "error" and error["error"]["code"] == "unsupported_tool"
            second = await run_turn(conn, input="more", previous_response_id=first.id, store=False)
            completed_ok(second)


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([{"type": "function", "name": "look up"}], "tools[0].name"),
        ([{"type": "function", "name": "f" * 65}], "tools[0].name"),
        ([{"type": "function", "name": "f"}, {"type": "custom", "name": "f"}], "tools[1].name"),
    ],
    ids=["space", "65-chars", "duplicate"],
)
async def test_a_tool_name_openai_refuses_is_a_400_naming_it_on_both_transports(make_server, tools, param):
    server = make_server()
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model=MODEL, input="hi", tools=tools)
        assert (refused.value.code, refused.value.param) == ("invalid_value", param)
        async with sdk.responses.connect() as conn:
            first = await run_turn(conn, input="hi", store=False)
            await conn.response.create(model=MODEL, input="x", tools=tools, previous_response_id=first.id)
            error = await recv_event(conn)
            assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", param)
            second = await run_turn(conn, input="more", previous_response_id=first.id, store=False)
            completed_ok(second)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"prompt": "x"}, "prompt"),
        ({"image": 5}, "image"),
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
    ],
    ids=["prompt-string", "image-number", "retention-word"],
)
async def test_an_undeclared_echoed_field_of_the_wrong_type_is_a_400_on_both_transports(make_server, extra, param):
    """Review finding: echoed as sent, such a field made every response event fail the SDK's typed parser
    (`response.prompt.id` an AttributeError for the caller). A valid one is still echoed as sent."""
    server = make_server()
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model=MODEL, input="hi", extra_body=extra)
        assert (refused.value.code, refused.value.param) == ("invalid_value", param)
        async with sdk.responses.connect() as conn:
            first = await run_turn(conn, input="hi", store=False)
            frame = {"type": "response.create", "model": MODEL, "input": "x", "previous_response_id": first.id}
            await send_raw(conn, {**frame, **extra})
            error = await recv_event(conn)
            assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", param)
            prompt = {"id": "pmpt_1", "variables": {"city": "Paris"}}
            second = await run_turn(conn, input="more", previous_response_id=first.id, store=False, prompt=prompt)
            completed_ok(second)
            assert second.response["prompt"] == prompt


@pytest.mark.parametrize(("policy", "listed"), [(None, True), ("drop", True), ("pass", False)])
async def test_the_hosted_tool_policy_decides_what_the_metadata_lists(make_server, policy, listed):
    server = make_server(config=_config(policy))
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        response = await sdk.responses.create(model=MODEL, input="hi", tools=CODEX_TOOLS)
    assert (DROPPED_METADATA_KEY in (response.metadata or {})) is listed


def test_hosted_tools_default_to_pass_for_a_responses_upstream_and_drop_elsewhere():
    upstream = ShimConfig.model_validate(
        {
            "deployments": [
                {"name": "up", "kind": "responses", "base_url": "http://127.0.0.1:1/v1", "models": {"m": "m"}}
            ]
        }
    )
    assert upstream.deployments[0].hosted_policy == "pass"
    assert _config(None).deployments[0].hosted_policy == "drop"
