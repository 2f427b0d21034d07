"""Field values the SDK's types do not allow are refused with `invalid_value` (or the API's code) naming the
field, over HTTP and WebSocket, and the connection still completes a chained turn afterwards."""

from __future__ import annotations

from typing import Any, get_args

import httpx2
import pytest
from openai import AsyncOpenAI
from support.wire import API_KEY, LOOKUP_TOOL, MODEL, completed_ok, run_turn

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def function(parameters: Any) -> dict[str, Any]:
    return {"type": "function", "name": "f", "parameters": parameters}


def message(part: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [part]}]


BAD = [
    ({"tools": [function("x")]}, "tools[0].parameters"),
    ({"tools": [function(5)]}, "tools[0].parameters"),
    ({"tools": [function([1])]}, "tools[0].parameters"),
    ({"tools": [{"type": "custom", "name": "c", "format": "text"}]}, "tools[0].format"),
    ({"tools": [{"type": "namespace", "name": "n", "description": "d", "tools": "x"}]}, "tools[0].tools"),
    ({"tools": [LOOKUP_TOOL], "tool_choice": 5}, "tool_choice"),
    ({"tools": [LOOKUP_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [LOOKUP_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": 5}, "tool_choice"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"service_tier": "turbo"}, "service_tier"),
    ({"max_output_tokens": True}, "max_output_tokens"),
    ({"max_output_tokens": "12"}, "max_output_tokens"),
    ({"store": "false"}, "store"),
    ({"generate": "true"}, "generate"),
    ({"parallel_tool_calls": "true"}, "parallel_tool_calls"),
    ({"parallel_tool_calls": 1}, "parallel_tool_calls"),
    ({"temperature": "0.5"}, "temperature"),
    ({"input": message({"type": "input_text", "text": 5})}, "input[0].content[0].text"),
    ({"input": message({"type": "input_image", "detail": "auto", "image_url": 5})}, "input[0].content[0].image_url"),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[param + ":" + repr(f)[:40] for f, param in BAD])
async def test_a_value_the_sdk_types_do_not_allow_is_invalid_value_naming_the_field(server, fields, param):
    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        answer = await http.post("/responses", json={"model": MODEL, "input": "hi", **fields}, headers=AUTH)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] in ("invalid_value", "invalid_type") and error["param"] == param, error


async def test_a_string_stream_flag_over_http_is_refused(server):
    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        answer = await http.post("/responses", json={"model": MODEL, "input": "hi", "stream": "true"}, headers=AUTH)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "stream"


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [function(None)], "tool_choice": {"type": "function", "name": "f"}},
        {"reasoning": {"effort": "minimal"}, "service_tier": "flex", "parallel_tool_calls": False},
        {"tools": [{"type": "custom", "name": "c", "format": {"type": "text"}}], "tool_choice": "required"},
        {"tool_choice": "auto", "store": False, "max_output_tokens": 4, "temperature": 1},
        {"input": message({"type": "input_image", "detail": "auto", "image_url": "data:image/png;base64,AA=="})},
    ],
)
async def test_the_values_the_sdk_types_allow_still_complete(server, fields):
    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        answer = await http.post("/responses", json={"model": MODEL, "input": "hi", **fields}, headers=AUTH)
    assert answer.status_code == 200, answer.text


async def test_bad_field_values_over_websocket_leave_the_connection_chaining(server):
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        first = await run_turn(conn, input="hi")
        completed_ok(first)
        for fields, param in BAD:
            turn = await run_turn(conn, **{"input": "hi", **fields, "previous_response_id": first.id})
            assert turn.error is not None and turn.error["error"]["param"] == param, (fields, turn.error)
        completed_ok(await run_turn(conn, input="again", previous_response_id=first.id))


def test_the_literals_the_server_accepts_are_the_sdks():
    from openai.types.responses.service_tier import ServiceTier as SdkServiceTier
    from openai.types.shared.reasoning_effort import ReasoningEffort

    from server_shim.requests import REASONING_EFFORTS, ServiceTier

    assert set(get_args(ServiceTier)) == set(get_args(get_args(SdkServiceTier)[0]))
    assert set(get_args(get_args(ReasoningEffort)[0])) == REASONING_EFFORTS
