"""Responses tools -> Chat Completions tools: every SDK tool type accepted, calls mapped back."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import TypeAdapter
from support.wire import AGENTS_TOOL, PATCH_TOOL

from server_shim.backends.base import Finish, TextDelta, ToolCallDelta, Usage
from server_shim.errors import APIError
from server_shim.tools import (
    DROPPED_METADATA_KEY,
    HOSTED_TYPES,
    TOOL_TYPES,
    chat_tool_choice,
    chat_tools,
    restore_calls,
    validate_tools,
)

CHAT_TOOL = TypeAdapter(ChatCompletionFunctionToolParam)

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look it up.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
    "strict": True,
}
PATCH = PATCH_TOOL
AGENTS = AGENTS_TOOL
HOSTED = [
    {"type": "web_search"},
    {"type": "tool_search", "execution": "client"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"},
    {"type": "mcp", "server_label": "deepwiki", "server_url": "https://example.com/mcp"},
    {"type": "local_shell"},
    {"type": "shell"},
    {"type": "apply_patch"},
    {"type": "computer_use_preview", "display_width": 1, "display_height": 1, "environment": "linux"},
]


def test_a_function_tool_becomes_a_chat_tool():
    (converted,) = chat_tools([TOOL]).tools or []
    CHAT_TOOL.validate_python(converted)
    assert converted == {
        "type": "function",
        "function": {"name": "lookup", "description": "Look it up.", "parameters": TOOL["parameters"], "strict": True},
    }


def test_a_tool_without_parameters_gets_an_empty_object_schema():
    (converted,) = chat_tools([{"type": "function", "name": "ping"}]).tools or []
    assert converted["function"]["parameters"] == {"type": "object", "properties": {}}


def test_no_tools_is_none():
    assert chat_tools(None).tools is None and chat_tools([]).tools is None


def test_every_tool_type_of_the_sdk_union_is_known_and_the_hosted_ones_are_the_rest():
    assert {"function", "custom", "namespace", "web_search", "tool_search", "mcp", "apply_patch"} <= TOOL_TYPES
    assert {tool["type"] for tool in HOSTED} <= HOSTED_TYPES
    assert not {"function", "custom", "namespace"} & HOSTED_TYPES


def test_namespace_members_are_flattened_and_custom_tools_take_one_string():
    converted = chat_tools([AGENTS, PATCH])
    names = [tool["function"]["name"] for tool in converted.tools or []]
    assert names == ["multi_agent_v1__spawn_agent", "multi_agent_v1__note", "apply_patch"]
    for tool in converted.tools or []:
        CHAT_TOOL.validate_python(tool)
    patch = (converted.tools or [])[2]["function"]
    assert patch["parameters"]["required"] == ["input"]
    assert "Begin Patch" in patch["description"] and "lark" in patch["description"]
    assert converted.origins["multi_agent_v1__note"].custom
    assert converted.origins["multi_agent_v1__spawn_agent"].namespace == "multi_agent_v1"


def test_hosted_tools_are_dropped_by_default_and_listed():
    converted = chat_tools([TOOL, *HOSTED])
    assert [tool["function"]["name"] for tool in converted.tools or []] == ["lookup"]
    assert set(converted.dropped) == {tool["type"] for tool in HOSTED}
    assert DROPPED_METADATA_KEY.startswith("responses_ws.")


def test_hosted_tools_are_refused_under_the_refuse_policy():
    with pytest.raises(APIError) as raised:
        chat_tools([TOOL, {"type": "web_search"}], hosted="refuse")
    assert (raised.value.code, raised.value.param) == ("unsupported_tool", "tools[1].type")


@pytest.mark.parametrize(
    ("tool", "code", "param"),
    [
        ({"type": "teleport"}, "unsupported_tool", "tools[1].type"),
        ({"type": "function"}, "missing_required_parameter", "tools[1].name"),
        ({"type": "function", "name": ""}, "missing_required_parameter", "tools[1].name"),
        ({"type": "custom"}, "missing_required_parameter", "tools[1].name"),
        ({"type": "namespace", "name": "ns", "tools": []}, "invalid_value", "tools[1].tools"),
        (
            {"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]},
            "invalid_value",
            "tools[1].tools[0].type",
        ),
        ({"type": "function", "name": "look up"}, "invalid_value", "tools[1].name"),
        ({"type": "function", "name": "f" * 65}, "invalid_value", "tools[1].name"),
        ({"type": "custom", "name": "lookup"}, "invalid_value", "tools[1].name"),
        ({"type": "function", "name": "lookup"}, "invalid_value", "tools[1].name"),
        (
            {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "a.b"}]},
            "invalid_value",
            "tools[1].tools[0].name",
        ),
    ],
)
def test_unknown_or_incomplete_tools_are_refused(tool, code, param):
    with pytest.raises(APIError) as raised:
        validate_tools([TOOL, tool])
    assert (raised.value.code, raised.value.param) == (code, param)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "name": "lookup"}, {"type": "function", "function": {"name": "lookup"}}),
        ({"type": "custom", "name": "apply_patch"}, {"type": "function", "function": {"name": "apply_patch"}}),
        (
            {"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1"},
            {"type": "function", "function": {"name": "multi_agent_v1__spawn_agent"}},
        ),
        (
            {"type": "function", "name": "multi_agent_v1__spawn_agent"},
            {"type": "function", "function": {"name": "multi_agent_v1__spawn_agent"}},
        ),
        ({"type": "web_search_preview"}, "auto"),
        ({"type": "mcp", "server_label": "deepwiki"}, "auto"),
        ({"type": "apply_patch"}, "auto"),
        ({"type": "shell"}, "auto"),
    ],
)
def test_every_tool_choice_form_maps_to_the_chat_form(choice, expected):
    tools, mapped = chat_tool_choice(choice, chat_tools([TOOL, PATCH, AGENTS]))
    assert mapped == expected
    assert tools == chat_tools([TOOL, PATCH, AGENTS]).tools


def test_allowed_tools_narrows_what_is_sent():
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "custom", "name": "apply_patch"}, {"type": "namespace", "name": "multi_agent_v1"}],
    }
    tools, mapped = chat_tool_choice(choice, chat_tools([TOOL, PATCH, AGENTS]))
    assert mapped == "required"
    assert [t["function"]["name"] for t in tools or []] == [
        "apply_patch",
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__note",
    ]


def test_tool_choice_without_tools_is_dropped():
    assert chat_tool_choice("required", chat_tools(None)) == (None, None)


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "function", "name": "other"},
        {"type": "custom", "name": "lookup"},
        "sometimes",
        {"type": "allowed_tools", "mode": "sometimes", "tools": []},
    ],
)
def test_an_impossible_tool_choice_is_refused(choice):
    with pytest.raises(APIError) as raised:
        chat_tool_choice(choice, chat_tools([TOOL, PATCH]))
    assert raised.value.param == "tool_choice"


async def _deltas(*deltas):
    for delta in deltas:
        yield delta


async def test_calls_map_back_to_namespace_and_custom_tools():
    tools = chat_tools([TOOL, PATCH, AGENTS])
    stream = _deltas(
        TextDelta("working"),
        ToolCallDelta(0, '{"inp', "call_1", "apply_patch"),
        ToolCallDelta(1, "{}", "call_2", "multi_agent_v1__spawn_agent"),
        ToolCallDelta(0, 'ut": "*** Begin Patch\\n"}'),
        ToolCallDelta(2, '{"n": 1}', "call_3", "lookup"),
        Usage(1, 2),
        Finish("tool_calls"),
    )
    out = [delta async for delta in restore_calls(stream, tools)]
    assert out[0] == TextDelta("working")
    assert out[1] == ToolCallDelta(1, "{}", "call_2", "spawn_agent", "multi_agent_v1")
    assert out[2] == ToolCallDelta(2, '{"n": 1}', "call_3", "lookup")
    assert out[3] == Usage(1, 2)
    assert out[4] == ToolCallDelta(0, "*** Begin Patch\n", "call_1", "apply_patch", None, custom=True)
    assert out[5] == Finish("tool_calls")


async def test_a_custom_call_whose_arguments_are_not_the_wrapper_keeps_them_as_its_input():
    stream = _deltas(ToolCallDelta(0, "plain text", "call_1", "apply_patch"))
    (delta,) = [d async for d in restore_calls(stream, chat_tools([PATCH]))]
    assert delta.custom and delta.arguments == "plain text"


async def test_calls_past_max_tool_calls_are_dropped():
    stream = _deltas(
        ToolCallDelta(0, "{}", "call_1", "lookup"),
        ToolCallDelta(1, "{}", "call_2", "lookup"),
        ToolCallDelta(1, "{}"),
        ToolCallDelta(0, ""),
        Finish("tool_calls"),
    )
    out = [d async for d in restore_calls(stream, chat_tools([TOOL]), max_calls=1)]
    assert [d.call_id for d in out if isinstance(d, ToolCallDelta)] == ["call_1", None]


async def test_a_call_the_backend_already_reports_as_custom_or_namespaced_passes_as_it_is():
    upstream = [
        ToolCallDelta(0, '{"input": "raw"}', "call_1", "apply_patch", custom=True),
        ToolCallDelta(1, "{}", "call_2", "spawn_agent", "multi_agent_v1"),
        Finish("tool_calls"),
    ]
    out = [d async for d in restore_calls(_deltas(*upstream), chat_tools([PATCH, AGENTS]))]
    assert out == upstream


def test_a_namespace_member_whose_chat_name_is_taken_is_refused():
    member = {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "x"}]}
    with pytest.raises(APIError) as raised:
        validate_tools([{"type": "function", "name": "ns__x"}, member])
    assert (raised.value.code, raised.value.param) == ("invalid_value", "tools[1].tools[0].name")
    assert "'ns__x'" in raised.value.message


def test_the_same_member_name_in_two_namespaces_is_two_tools():
    validate_tools(
        [
            {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "x"}]},
            {"type": "namespace", "name": "b", "tools": [{"type": "function", "name": "x"}]},
        ]
    )
