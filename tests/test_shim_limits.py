"""Request limits as plain functions: each bound refused with its own code, nothing else touched."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import orjson
import pytest
import websockets
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from support.wire import (
    API_KEY,
    LOOKUP_TOOL,
    MODEL,
    completed_ok,
    recv_event,
    run_turn,
    send_raw,
    strict_ws_event,
    ws_url,
)
from websockets.asyncio.client import connect as ws_connect

from server_shim.errors import APIError
from server_shim.limits import DEFAULT_LIMITS, RequestLimits, check_body, check_reference_bytes, deeper_than
from server_shim.requests import parse_create

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def refused(body: dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> APIError:
    with pytest.raises(APIError) as caught:
        check_body(body, limits)
    return caught.value


def test_depth_counts_arrays_and_objects_and_a_scalar_is_depth_zero():
    assert not deeper_than(1, 0)
    assert not deeper_than([], 1) and deeper_than([], 0)
    assert not deeper_than(nested(10), 10) and deeper_than(nested(11), 10)
    assert deeper_than({"a": 1, "b": [[[1]]]}, 3) and not deeper_than({"a": 1, "b": [[[1]]]}, 4)


def test_a_document_deeper_than_python_recursion_is_measured_without_recursion():
    deep = orjson.loads(b"[" * 1000 + b"]" * 1000)
    assert deeper_than(deep, 999) and not deeper_than(deep, 1000)


def _depth(value: Any) -> int:
    """The reference: the nesting depth by plain recursion (documents here are shallow)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


nested_values = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=3), children, max_size=5),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=nested_values, limit=st.integers(0, 8))
def test_the_level_by_level_walk_measures_depth_as_recursion_does(value, limit):
    assert deeper_than(value, limit) == (_depth(value) > limit)


@pytest.mark.parametrize("field", ["text", "tool_choice", "metadata", "input"])
def test_json_nested_past_the_limit_is_invalid_value_naming_the_field(field):
    error = refused({"model": "m", field: nested(65)})
    assert (error.status, error.code, error.param) == (400, "invalid_value", field)
    check_body({"model": "m", field: nested(63)}, RequestLimits())


def test_json_the_size_orjson_cannot_serialize_is_refused_before_any_other_check():
    body = orjson.loads(
        b'{"model":"m","tools":[{"type":"function","name":"f","parameters":' + b"[" * 300 + b"]" * 300 + b"}]}"
    )
    with pytest.raises(APIError) as caught:
        parse_create(body, websocket=False)
    assert caught.value.code == "invalid_value" and caught.value.param == "tools"


def test_too_many_input_items():
    limits = RequestLimits(max_input_items=3)
    error = refused({"input": [{"type": "message", "role": "user", "content": "x"}] * 4}, limits)
    assert (error.code, error.param) == ("too_many_input_items", "input")
    check_body({"input": [{"type": "message", "role": "user", "content": "x"}] * 3}, limits)


def test_too_many_item_references():
    limits = RequestLimits(max_item_references=2)
    error = refused({"input": [{"type": "item_reference", "id": "a"}] * 3}, limits)
    assert error.code == "too_many_item_references"


def test_too_many_tools_and_too_deep_a_tool_schema():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    assert refused({"tools": [tool] * 3}, RequestLimits(max_tools=2)).code == "too_many_tools"
    deep = {**tool, "parameters": nested(5)}
    error = refused({"tools": [tool, deep]}, RequestLimits(max_tool_schema_depth=4))
    assert (error.code, error.param) == ("tool_schema_too_deep", "tools[1].parameters")


def test_a_namespace_and_its_members_count_as_tools_and_each_member_schema_is_bounded():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    namespace = {"type": "namespace", "name": "ns", "description": "d", "tools": [tool] * 3}
    assert check_body({"tools": [namespace]}, RequestLimits(max_tools=4)) is None
    error = refused({"tools": [namespace, tool]}, RequestLimits(max_tools=4))
    assert (error.code, error.param) == ("too_many_tools", "tools") and error.message.startswith("5 tools given")
    deep = {**namespace, "tools": [tool, {**tool, "parameters": nested(5)}]}
    error = refused({"tools": [tool, deep]}, RequestLimits(max_tool_schema_depth=4))
    assert (error.code, error.param) == ("tool_schema_too_deep", "tools[1].tools[1].parameters")


async def test_namespace_members_are_held_to_the_tool_limits_over_both_transports(make_server):
    server = make_server(max_tools=4, max_tool_schema_depth=4)
    members = [{**LOOKUP_TOOL, "name": f"lookup_{i}"} for i in range(4)]
    wide = {"type": "namespace", "name": "ns", "description": "d", "tools": members}
    deep = {**wide, "tools": [{**LOOKUP_TOOL, "parameters": nested(5)}]}
    fine = {**wide, "tools": members[:3]}
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        async with sdk.responses.connect() as conn:
            first = await run_turn(conn, input="hi", store=False)
            for tools, code, param in [
                ([wide], "too_many_tools", "tools"),
                ([deep], "tool_schema_too_deep", "tools[0].tools[0].parameters"),
            ]:
                turn = await run_turn(conn, input="hi", tools=tools, previous_response_id=first.id, store=False)
                assert turn.error is not None and (turn.error["error"]["code"], turn.error["error"]["param"]) == (
                    code,
                    param,
                )
            completed_ok(await run_turn(conn, input="hi", tools=[fine], previous_response_id=first.id, store=False))
        with pytest.raises(openai.BadRequestError) as refused_http:
            await sdk.responses.create(model=MODEL, input="hi", tools=[deep])
        assert refused_http.value.code == "tool_schema_too_deep"


def test_references_expanding_past_the_byte_limit_are_refused_and_repeats_count_each_time():
    target = {"type": "message", "role": "assistant", "content": "x" * 1000, "id": "msg_1"}
    items = [{"type": "item_reference", "id": "msg_1"}] * 5
    expanded = 5 * len(orjson.dumps(target))
    check_reference_bytes(items, [target] * 5, RequestLimits(max_reference_bytes=expanded))
    with pytest.raises(APIError) as caught:
        check_reference_bytes(items, [target] * 5, RequestLimits(max_reference_bytes=expanded - 1))
    assert caught.value.code == "item_references_too_large"


def test_limits_come_from_settings():
    from server_shim import Settings

    limits = RequestLimits.from_settings(Settings(max_tools=7, max_json_depth=9))
    assert (limits.max_tools, limits.max_json_depth) == (7, 9)


# --- over a real server: each limit answered with its code, the connection still usable ----------


async def test_deep_json_over_websocket_is_invalid_value_and_the_connection_chains_afterwards(make_server):
    server = make_server()
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        first = await run_turn(conn, input="remember", store=False)
        deep = b"[" * 300 + b"]" * 300
        await send_raw(conn, b'{"type":"response.create","model":"' + MODEL.encode() + b'","text":' + deep + b"}")
        error = await recv_event(conn)
        assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == "text"
        completed_ok(await run_turn(conn, input="and now", previous_response_id=first.id, store=False))


async def test_deep_json_over_http_is_a_400_json_error_not_a_500(make_server):
    server = make_server()
    tool = b'{"type":"function","name":"f","parameters":' + b"[" * 300 + b"]" * 300 + b"}"
    body = b'{"model":"' + MODEL.encode() + b'","input":"hi","tools":[' + tool + b"]}"
    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        answer = await http.post("/responses", content=body, headers=AUTH)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_value"


async def test_an_http_body_over_the_limit_is_413_request_too_large_by_header_and_while_streaming(make_server):
    server = make_server(max_body_bytes=10_000)
    body = orjson.dumps({"model": MODEL, "input": "x" * 20_000})

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        declared = await http.post("/responses", content=body, headers=AUTH)
        streamed = await http.post("/responses", content=chunks(), headers=AUTH)
        ok = await http.post("/responses", json={"model": MODEL, "input": "small", "store": False}, headers=AUTH)
    for answer in (declared, streamed):
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == "request_too_large"
    assert ok.status_code == 200


async def test_a_frame_over_the_protocol_bound_still_gets_message_too_large_before_1009(make_server):
    server = make_server(max_frame_bytes=1024)  # the protocol refuses frames over 16 MiB unread
    async with ws_connect(ws_url(server), max_size=None) as ws:
        sending = asyncio.create_task(ws.send(b"x" * (17 * 1024 * 1024), text=True))
        error = json.loads(await asyncio.wait_for(ws.recv(), 10))
        strict_ws_event(error)
        assert error["error"]["code"] == "message_too_large"
        assert "1024-byte" in error["error"]["message"]
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        await asyncio.gather(sending, return_exceptions=True)  # the server stopped reading mid-frame


async def test_too_many_tools_over_websocket_names_the_limit_and_the_connection_stays_usable(make_server):
    server = make_server(max_tools=2)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        tools = [{**LOOKUP_TOOL, "name": f"lookup_{i}"} for i in range(3)]  # distinct names: duplicates are refused
        turn = await run_turn(conn, input="hi", tools=tools, store=False)
        assert turn.error is not None and turn.error["error"]["code"] == "too_many_tools"
        completed_ok(await run_turn(conn, input="hi", tools=tools[:2], store=False))


async def test_item_references_expanding_past_the_limit_are_refused_and_the_chain_continues(make_server):
    server = make_server(max_reference_bytes=50_000)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        first = await run_turn(conn, input="y" * 1000, store=False, max_output_tokens=2000)
        item_id = first.response["output"][0]["id"]
        refs = [{"type": "item_reference", "id": item_id}] * 200
        turn = await run_turn(conn, input=refs, previous_response_id=first.id, store=False)
        assert turn.error is not None and turn.error["error"]["code"] == "item_references_too_large"
        completed_ok(await run_turn(conn, input=refs[:1], previous_response_id=first.id, store=False))


async def test_a_conversation_past_its_byte_limit_is_refused_and_a_new_one_starts_fine(make_server):
    server = make_server(max_conversation_bytes=60_000)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        previous = earlier = None
        completed = 0
        while (
            turn := await run_turn(conn, input="p" * 6_000, previous_response_id=previous, store=False)
        ).error is None:
            completed += 1
            earlier, previous = previous, turn.id
        assert 2 <= completed < 10
        assert turn.error["error"]["code"] == "conversation_too_large"
        # the refusal changed nothing: the chain continues where it fits (the last accepted turn may sit
        # within a few hundred bytes of the limit, so continue from the one before it)
        completed_ok(await run_turn(conn, input="short", previous_response_id=earlier, store=False))
        completed_ok(await run_turn(conn, input="a fresh start", store=False))


async def test_a_tool_schema_asking_for_a_huge_argument_ends_incomplete_and_the_connection_chains_on(make_server):
    server = make_server()
    tool = {"type": "function", "name": "big", "parameters": {"type": "string", "minLength": 100_000_000}}
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        turn = await run_turn(conn, input="hi", tools=[tool], tool_choice="required", max_output_tokens=64)
        assert turn.response["status"] == "incomplete"
        assert turn.response["incomplete_details"] == {"reason": "max_output_tokens"}
        assert len(turn.response["output"][0]["arguments"]) == 64 * 8
        completed_ok(await run_turn(conn, input="again", previous_response_id=turn.id))
