"""Input items: normalising, validating only the new items, resolving references."""

from __future__ import annotations

import pytest
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from server_shim.errors import APIError
from server_shim.items import normalize_input, resolve_references, validate_items

INPUT_ITEM = TypeAdapter(ResponseInputItemParam)


def refusal(items, known=frozenset()) -> APIError:
    with pytest.raises(APIError) as raised:
        validate_items(items, known)
    return raised.value


def test_a_plain_string_is_one_user_message():
    assert normalize_input("hi") == [{"type": "message", "role": "user", "content": "hi"}]
    INPUT_ITEM.validate_python(normalize_input("hi")[0])


def test_no_input_is_no_items_and_a_list_passes_through():
    items = [{"type": "message", "role": "user", "content": "x"}]
    assert normalize_input(None) == []
    assert normalize_input(items) is items


def test_input_of_another_type_is_refused_with_its_param():
    with pytest.raises(APIError) as raised:
        normalize_input({"role": "user"})
    assert (raised.value.code, raised.value.param) == ("invalid_type", "input")


def test_the_documented_item_kinds_are_accepted():
    items = [
        {"type": "message", "role": "system", "content": "rules"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "more rules"}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
                {"type": "input_file", "file_id": "file_1"},
            ],
        },
        {
            "id": "msg_0",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "item_reference", "id": "msg_1"},
    ]
    for item in items:
        INPUT_ITEM.validate_python(item)  # the fixtures are real SDK input items
    assert validate_items(items) == {"call_1"}


def test_an_item_with_a_role_and_no_type_is_a_message():
    items = [{"role": "user", "content": "hi"}]
    validate_items(items)
    assert items[0]["type"] == "message"


def test_a_tool_output_may_answer_a_call_from_the_cached_state():
    assert (
        validate_items([{"type": "function_call_output", "call_id": "call_old", "output": "x"}], {"call_old"}) == set()
    )


def test_a_tool_output_without_its_call_is_refused():
    error = refusal([{"type": "function_call_output", "call_id": "call_x", "output": "x"}], {"call_other"})
    assert (error.code, error.param, error.status) == ("tool_output_without_call", "input[0].call_id", 400)


def test_a_tool_output_may_answer_a_call_earlier_in_the_same_batch_but_not_a_later_one():
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c", "output": "x"}
    assert validate_items([call, output]) == {"c"}
    assert refusal([output, call]).code == "tool_output_without_call"


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        ("text", "invalid_type", "input[0]"),
        ({"type": "message", "role": "robot", "content": "x"}, "invalid_value", "input[0].role"),
        ({"type": "message", "role": "user"}, "invalid_type", "input[0].content"),
        ({"type": "message", "role": "user", "content": ["x"]}, "invalid_value", "input[0].content[0].type"),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_text"}]},
            "invalid_type",
            "input[0].content[0].text",
        ),
        (
            {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": 5}]},
            "invalid_type",
            "input[0].content[0].refusal",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": 5}]},
            "invalid_value",
            "input[0].content[0].image_url",
        ),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "missing_required_parameter", "input[0].call_id"),
        ({"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}, "invalid_type", "input[0].call_id"),
        ({"type": "function_call_output", "call_id": "c"}, "invalid_type", "input[0].output"),
        ({"type": "item_reference"}, "missing_required_parameter", "input[0].id"),
        ({"content": "x"}, "missing_required_parameter", "input[0]"),
        ({"type": "teleport"}, "invalid_value", "input[0]"),
    ],
)
def test_each_invalid_item_is_refused_with_a_specific_code_and_param(item, code, param):
    error = refusal([item], {"c"})
    assert (error.code, error.param) == (code, param)
    assert error.message


def test_the_error_names_the_index_of_the_bad_item():
    good = {"type": "message", "role": "user", "content": "fine"}
    error = refusal([good, good, {"type": "message", "role": "user", "content": 3}])
    assert error.param == "input[2].content"


def test_the_error_names_the_index_of_the_bad_part_of_a_later_item():
    """The parameter is written only for the error (`items._param`): item and part indexes, in param and message."""
    good = {"type": "message", "role": "user", "content": "fine"}
    parts = [{"type": "input_text", "text": "a"}, {"type": "input_text"}]
    error = refusal([good, {"type": "message", "role": "user", "content": parts}])
    assert (error.code, error.param) == ("invalid_type", "input[1].content[1].text")
    assert "'input[1].content[1].text'" in error.message
    output = {"type": "function_call_output", "call_id": "nope", "output": "x"}
    assert refusal([good, good, good, output]).param == "input[3].call_id"


def test_references_are_replaced_by_the_items_they_name():
    target = {"id": "msg_1", "type": "message", "role": "assistant", "content": "earlier"}
    items = [{"type": "item_reference", "id": "msg_1"}, {"type": "message", "role": "user", "content": "and?"}]
    assert resolve_references(items, [target]) == [target, items[1]]


def test_a_batch_without_references_is_returned_as_is():
    items = [{"type": "message", "role": "user", "content": "x"}]
    assert resolve_references(items, []) is items


def test_an_unknown_reference_is_item_not_found():
    with pytest.raises(APIError) as raised:
        resolve_references([{"type": "message"}, {"type": "item_reference", "id": "msg_x"}], [])
    assert (raised.value.status, raised.value.code, raised.value.param) == (404, "item_not_found", "input[1].id")


# Items a real client sends besides messages and function calls, each valid for the SDK's input-item type.
OTHER_ITEMS = [
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
    {"type": "compaction", "encrypted_content": "opaque"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
    {"type": "file_search_call", "id": "fs_1", "queries": ["q"], "status": "completed"},
    {"type": "image_generation_call", "id": "ig_1", "result": None, "status": "completed"},
    {
        "type": "local_shell_call",
        "id": "ls_1",
        "call_id": "ls_c",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
    },
    {"type": "local_shell_call_output", "id": "ls_1", "output": "ok"},
    {"type": "mcp_list_tools", "id": "ml_1", "server_label": "s", "tools": []},
    {"type": "custom_tool_call", "call_id": "ct_1", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "done"},
]


def test_every_other_input_item_type_of_the_sdk_is_accepted():
    for item in OTHER_ITEMS:
        INPUT_ITEM.validate_python(item)
    assert validate_items([dict(item) for item in OTHER_ITEMS]) == {"ct_1"}


def test_a_custom_tool_output_without_its_call_is_refused_like_a_function_output():
    error = refusal([{"type": "custom_tool_call_output", "call_id": "ct_9", "output": "x"}], {"ct_1"})
    assert (error.code, error.param) == ("tool_output_without_call", "input[0].call_id")
    assert validate_items([{"type": "custom_tool_call_output", "call_id": "ct_1", "output": "x"}], {"ct_1"}) == set()


def test_a_custom_tool_call_needs_its_input_text():
    error = refusal([{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"}])
    assert (error.code, error.param) == ("missing_required_parameter", "input[0].input")


def test_an_item_with_only_an_id_is_a_reference_as_the_sdk_allows():
    items = [{"id": "msg_1"}]
    validate_items(items)
    assert items[0]["type"] == "item_reference"
