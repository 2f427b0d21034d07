"""Responses function tools -> Chat Completions tools, and tool_choice."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import TypeAdapter

from server_shim.errors import APIError
from server_shim.tools import chat_tool_choice, chat_tools

CHAT_TOOL = TypeAdapter(ChatCompletionFunctionToolParam)

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look it up.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
    "strict": True,
}


def test_a_function_tool_becomes_a_chat_tool():
    (converted,) = chat_tools([TOOL])
    CHAT_TOOL.validate_python(converted)
    assert converted == {
        "type": "function",
        "function": {"name": "lookup", "description": "Look it up.", "parameters": TOOL["parameters"], "strict": True},
    }


def test_a_tool_without_parameters_gets_an_empty_object_schema():
    (converted,) = chat_tools([{"type": "function", "name": "ping"}])
    assert converted["function"]["parameters"] == {"type": "object", "properties": {}}


def test_no_tools_is_none():
    assert chat_tools(None) is None and chat_tools([]) is None


@pytest.mark.parametrize(
    ("tool", "code", "param"),
    [
        ({"type": "web_search"}, "unsupported_tool", "tools[1].type"),
        ({"type": "function"}, "missing_required_parameter", "tools[1].name"),
        ({"type": "function", "name": ""}, "missing_required_parameter", "tools[1].name"),
    ],
)
def test_unsupported_or_incomplete_tools_are_refused(tool, code, param):
    with pytest.raises(APIError) as raised:
        chat_tools([TOOL, tool])
    assert (raised.value.code, raised.value.param) == (code, param)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "name": "lookup"}, {"type": "function", "function": {"name": "lookup"}}),
    ],
)
def test_tool_choice_maps_to_the_chat_form(choice, expected):
    assert chat_tool_choice(choice, chat_tools([TOOL])) == expected


def test_tool_choice_without_tools_is_dropped():
    assert chat_tool_choice("required", None) is None


@pytest.mark.parametrize("choice", [{"type": "function", "name": "other"}, "sometimes", {"type": "file_search"}])
def test_an_impossible_tool_choice_is_refused(choice):
    with pytest.raises(APIError) as raised:
        chat_tool_choice(choice, chat_tools([TOOL]))
    assert raised.value.param == "tool_choice"
